/* virtio-blk (virtio 1.2 §5.2), driven through virtio.c on either transport.
 *
 * disk=1: write sector 1, flush, read it back, ask for the ID, and read past the end, which
 * must answer IOERR. disk=reconnect: write and read back sector 1 in rounds while the test
 * kills the backend and starts it again; when the device shows DEVICE_NEEDS_RESET (§2.1.2)
 * print a marker line, reset it, set it up again and go on until a round after a reset reads
 * back what it wrote. */
#include <stdint.h>

#include "testkernel.h"

#define BLK_T_IN 0
#define BLK_T_OUT 1
#define BLK_T_FLUSH 4
#define BLK_T_GET_ID 8
#define BLK_S_OK 0
#define BLK_S_IOERR 1
#define NO_ANSWER 0xff
/* How long a request may take: a backend on a busy host is slow, a dead one never answers. */
#define REQUEST_TICKS (PM_TIMER_HZ * 5)

static struct vdev blk_dev;
static struct vq blk_q;
static uint8_t blk_header[16] __attribute__((aligned(16)));
static uint8_t blk_data[1024], blk_check[1024];
static volatile uint8_t blk_status;

/* One request: a header of type and sector, data of len bytes (device-writable if in), the
 * status byte. Returns the status, or NO_ANSWER if the device never answered. */
static uint8_t blk_request(uint32_t type, uint32_t sector, void *data, uint32_t len, int in)
{
    memset(blk_header, 0, sizeof blk_header);
    memcpy(blk_header, &type, 4);
    memcpy(blk_header + 8, &sector, 4);
    blk_status = NO_ANSWER;
    uint32_t n = 0;
    blk_q.desc[n] = (struct vq_desc){ (uint32_t)blk_header, 16, 1, n + 1 };
    n++;
    if (len) {
        blk_q.desc[n] = (struct vq_desc){ (uint32_t)data, len, (uint16_t)(1 | (in ? 2 : 0)), n + 1 };
        n++;
    }
    blk_q.desc[n] = (struct vq_desc){ (uint32_t)&blk_status, 1, 2, 0 };
    vq_submit(&blk_q, 0);
    return vq_wait(&blk_q, REQUEST_TICKS) ? blk_status : NO_ANSWER;
}

/* Negotiate (no feature asked), give the device its queue, DRIVER_OK; whether it took them. */
static int blk_setup(void)
{
    if (!vdev_negotiate(&blk_dev, 0) || !vdev_queue(&blk_dev, 0, &blk_q))
        return 0;
    vdev_driver_ok(&blk_dev);
    return !(vdev_status(&blk_dev) & STATUS_NEEDS_RESET);
}

/* Write `sector` with a pattern that `seed` varies, flush, read it back: whether all three
 * answered OK and the bytes match. */
static int blk_round_at(uint32_t sector, uint32_t seed)
{
    for (uint32_t i = 0; i < 512; i++)
        blk_data[i] = (uint8_t)(i * 7 + seed);
    memset(blk_check, 0, 512);
    return blk_request(BLK_T_OUT, sector, blk_data, 512, 0) == BLK_S_OK &&
           blk_request(BLK_T_FLUSH, 0, 0, 0, 0) == BLK_S_OK &&
           blk_request(BLK_T_IN, sector, blk_check, 512, 1) == BLK_S_OK &&
           fw_equal(blk_check, blk_data, 512);
}

/* A round on sector 1. */
static int blk_round(uint32_t seed)
{
    return blk_round_at(1, seed);
}

/* disk_rounds=N (with disk=1): N rounds after the disk check, round i writing sector i with
 * seed i, flushing and reading it back, each printed: a guest busy on its disk for a while,
 * for a snapshot to catch mid-work (crates/exitless-cli/tests/cli/snapshot.rs then reads every sector of the file). */
void disk_rounds(uint32_t rounds)
{
    uint32_t good = 0;
    if (!rounds || !blk_q.dev)
        return;
    for (uint32_t i = 1; i <= rounds; i++) {
        int ok = blk_round_at(i, i);
        print("disk round %06u of %06u: %s\n", i, rounds, ok ? "ok" : "FAILED");
        good += (uint32_t)ok;
    }
    check(good == rounds, "disk: %u of %u rounds read back", good, rounds);
}

/* Where disk_resets moves a virtio-pci disk's BAR 0: 256 MiB and 128 MiB above where exitless
 * placed it, within the PCI memory window 0xC0000000-0xDFFFFFFF and clear of the other
 * functions' BARs. Once moved, it never goes home: a snapshot always finds it away. */
#define BAR_FAR 0x10000000
#define BAR_NEAR 0x08000000

/* disk_resets=N (with disk=1): N rounds, round i resetting the disk, moving its BAR 0 (on
 * virtio-pci: to BAR_FAR in odd rounds, BAR_NEAR in even ones), setting it up again, then
 * writing sector i with seed i, flushing and reading it back, each printed: a driver that
 * resets and moves the device again and again, for a snapshot to catch in the middle
 * (crates/exitless-cli/tests/cli/snapshot.rs). */
void disk_resets(uint32_t rounds)
{
    uint32_t good = 0;
    if (!rounds || !blk_q.dev)
        return;
    for (uint32_t i = 1; i <= rounds; i++) {
        int32_t delta = i == 1 ? BAR_FAR : i & 1 ? BAR_FAR - BAR_NEAR : BAR_NEAR - BAR_FAR;
        int ok = vdev_reset(&blk_dev);
        if (!blk_dev.mmio)
            ok = ok && vdev_move_bar(&blk_dev, delta);
        ok = ok && blk_setup() && blk_round_at(i, i);
        print("disk reset round %06u of %06u: %s\n", i, rounds, ok ? "ok" : "FAILED");
        good += (uint32_t)ok;
    }
    check(good == rounds, "disk: %u of %u rounds after a reset read back", good, rounds);
}

/* A round with `seed` on the disk check_disk set up (none: 0), for another device's check to
 * show that the disk works on beside it. */
int disk_round(uint32_t seed)
{
    return blk_q.dev && blk_round(seed);
}

/* disk=reconnect's round: a round before the first reset writes seed 1, after it seed 2 (its
 * bytes stay on the disk). */
static int blk_reconnect_round(uint32_t resets)
{
    return blk_round(resets ? 2 : 1);
}

static void blk_reconnect(void)
{
    struct reconnect r = {
        .dev = &blk_dev, .what = "disk", .setup = blk_setup, .round = blk_reconnect_round
    };
    int back = vdev_reconnect(&r); /* before check's arguments read r */
    check(back, "disk: read back after %u resets (%u good rounds)", r.resets, r.good);
}

void check_disk(int reconnect)
{
    if (!vdev_find(&blk_dev, 2, "disk", "virtio-blk"))
        return;
    uint32_t sectors = mmio32(blk_dev.device);
    if (!check(blk_setup(), "disk: FEATURES_OK, %u sectors", sectors))
        return;
    for (uint32_t i = 0; i < 512; i++)
        blk_data[i] = (uint8_t)(i * 7 + 1);
    uint8_t st = blk_request(BLK_T_OUT, 1, blk_data, 512, 0);
    check(st == BLK_S_OK, "disk: sector 1 written, status %u", st);
    st = blk_request(BLK_T_FLUSH, 0, 0, 0, 0);
    check(st == BLK_S_OK, "disk: flushed, status %u", st);
    memset(blk_check, 0, sizeof blk_check);
    st = blk_request(BLK_T_IN, 1, blk_check, 512, 1);
    check(st == BLK_S_OK && fw_equal(blk_check, blk_data, 512),
          "disk: sector 1 read back, status %u", st);
    if (reconnect) {
        blk_reconnect();
        return;
    }
    memset(blk_check, 0, 21);
    st = blk_request(BLK_T_GET_ID, 0, blk_check, 20, 1);
    check(st == BLK_S_OK && blk_check[0] != 0, "disk: ID '%s', status %u",
          (const char *)blk_check, st);
    st = blk_request(BLK_T_IN, sectors, blk_check, 512, 1);
    check(st == BLK_S_IOERR, "disk: a read past the end answered IOERR (status %u)", st);
}
