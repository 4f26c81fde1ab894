/* virtio transports (virtio 1.2 §4.1 virtio-pci, §4.2 virtio-mmio version 2) as a minimal
 * polling driver drives them, and split virtqueues (§2.7) on either: what virtio_blk.c and
 * virtio_net.c drive their devices through.
 *
 * A device is looked for first in the virtio-mmio windows the command line names
 * (`virtio_mmio=0xADDR[,0xADDR...]`, as Linux takes `virtio_mmio.device=`: there is no firmware
 * table for them), then on PCI bus 0, where the function's configuration structures sit in the
 * BARs their capabilities name. Negotiation accepts VIRTIO_F_VERSION_1 and what the device
 * driver asks of what the device offers; queues are polled through their used rings (no
 * interrupts). Addresses are guest-physical (paging is off). */
#include <stdint.h>

#include "testkernel.h"

#define VIRTIO_VENDOR 0x1af4
#define MMIO_MAGIC 0x74726976 /* "virt" */
#define MMIO_VERSION 2

/* virtio-mmio registers (§4.2.2). */
#define MMIO_DEVICE_ID 0x008
#define MMIO_DEVICE_FEATURES 0x010
#define MMIO_DEVICE_FEATURES_SEL 0x014
#define MMIO_DRIVER_FEATURES 0x020
#define MMIO_DRIVER_FEATURES_SEL 0x024
#define MMIO_QUEUE_SEL 0x030
#define MMIO_QUEUE_NUM_MAX 0x034
#define MMIO_QUEUE_NUM 0x038
#define MMIO_QUEUE_READY 0x044
#define MMIO_QUEUE_NOTIFY 0x050
#define MMIO_STATUS 0x070
#define MMIO_QUEUE_DESC 0x080
#define MMIO_QUEUE_DRIVER 0x090
#define MMIO_QUEUE_DEVICE 0x0a0
#define MMIO_CONFIG 0x100

/* virtio-pci common configuration (§4.1.4.3). */
#define PCI_FEATURE_SEL 0x00
#define PCI_FEATURES 0x04
#define PCI_DRIVER_FEATURE_SEL 0x08
#define PCI_DRIVER_FEATURES 0x0c
#define PCI_STATUS 0x14
#define PCI_QUEUE_SEL 0x16
#define PCI_QUEUE_SIZE 0x18
#define PCI_QUEUE_ENABLE 0x1c
#define PCI_QUEUE_NOTIFY_OFF 0x1e
#define PCI_QUEUE_DESC 0x20
#define PCI_QUEUE_DRIVER 0x28
#define PCI_QUEUE_DEVICE 0x30

static uint32_t pci_read32(uint32_t dev, uint32_t reg)
{
    outl(PCI_CONFIG_ADDRESS, 0x80000000u | dev << 11 | (reg & 0xfc));
    return inl(PCI_CONFIG_DATA);
}

static void pci_write32(uint32_t dev, uint32_t reg, uint32_t v)
{
    outl(PCI_CONFIG_ADDRESS, 0x80000000u | dev << 11 | (reg & 0xfc));
    outl(PCI_CONFIG_DATA, v);
}

/* The `n`th address of the comma-separated list `virtio_mmio=`, or 0. */
static uint32_t mmio_window(uint32_t n)
{
    const char *p = arg("virtio_mmio");
    for (; p && n; p++) {
        if (*p == ',')
            n--;
        else if (*p == ' ' || !*p)
            return 0;
    }
    if (!p || p[0] != '0' || p[1] != 'x')
        return 0;
    uint32_t a = 0;
    for (p += 2;; p++) {
        uint32_t d = *p >= '0' && *p <= '9' ? (uint32_t)(*p - '0')
                     : *p >= 'a' && *p <= 'f' ? (uint32_t)(*p - 'a' + 10)
                                               : 16;
        if (d == 16)
            return a;
        a = a << 4 | d;
    }
}

/* The first listed virtio-mmio window holding device `id` (§4.2.2: magic, version 2). */
static int vmmio_find(struct vdev *v, uint32_t id)
{
    for (uint32_t n = 0; n < 8; n++) {
        uint32_t base = mmio_window(n);
        if (!base)
            return 0;
        if (mmio32(base) == MMIO_MAGIC && mmio32(base + 4) == MMIO_VERSION &&
            mmio32(base + MMIO_DEVICE_ID) == id) {
            *v = (struct vdev){ .mmio = 1, .common = base, .device = base + MMIO_CONFIG };
            return 1;
        }
    }
    return 0;
}

/* The address BAR `bar` of function `dev` decodes (a 64-bit BAR must sit below 4 GiB). */
static uint32_t pci_bar(uint32_t dev, uint32_t bar)
{
    uint32_t low = pci_read32(dev, 0x10 + 4 * bar);
    if ((low & 0x6) == 0x4 && pci_read32(dev, 0x14 + 4 * bar) != 0)
        return 0;
    return low & ~0xfu;
}

/* The function of virtio device `id` (§4.1.2.1: 0x1040 + ID) on bus 0, its memory space and
 * bus mastering on, and its structures found through its vendor capabilities (§4.1.4). */
static int vpci_find(struct vdev *v, uint32_t id, const char *what, const char *name)
{
    *v = (struct vdev){ 0 };
    for (uint32_t d = 3; d < 32 && !v->dev; d++)
        if (pci_read32(d, 0) == ((0x1040 + id) << 16 | VIRTIO_VENDOR))
            v->dev = d;
    if (!check(v->dev != 0, "%s: a %s function on bus 0 (00:%02x.0)", what, name, v->dev))
        return 0;
    pci_write32(v->dev, 0x04, 0x6); /* memory space, bus master */
    for (uint32_t cap = pci_read32(v->dev, 0x34) & 0xff; cap;
         cap = pci_read32(v->dev, cap) >> 8 & 0xff) {
        uint32_t head = pci_read32(v->dev, cap);
        uint32_t bar = pci_read32(v->dev, cap + 4) & 0xff;
        if ((head & 0xff) != 0x09 || bar > 5 || !pci_bar(v->dev, bar))
            continue;
        uint32_t type = head >> 24, at = pci_bar(v->dev, bar) + pci_read32(v->dev, cap + 8);
        if (type == 1)
            v->common = at;
        else if (type == 2) {
            v->notify = at;
            v->multiplier = pci_read32(v->dev, cap + 16);
        } else if (type == 4)
            v->device = at;
    }
    return check(v->common && v->notify && v->device, "%s: common %x, notify %x, device %x", what,
                 v->common, v->notify, v->device);
}

int vdev_find(struct vdev *v, uint32_t id, const char *what, const char *name)
{
    if (vmmio_find(v, id))
        return check(1, "%s: a %s device at virtio-mmio %x", what, name, v->common);
    return vpci_find(v, id, what, name);
}

/* Move BAR 0 of a virtio-pci function (where exitless puts every virtio structure) by `delta`
 * bytes, memory decoding off while its address changes (PCI 3.0 §6.2.5.1), and the structures'
 * addresses with it. Whether the BAR decodes at its new address; 0 on virtio-mmio. */
int vdev_move_bar(struct vdev *v, int32_t delta)
{
    uint32_t low = v->mmio ? 0 : pci_read32(v->dev, 0x10);
    uint32_t base = low & ~0xfu;
    if (v->mmio || !base)
        return 0;
    pci_write32(v->dev, 0x04, 0x4);
    pci_write32(v->dev, 0x10, (base + (uint32_t)delta) | (low & 0xf));
    pci_write32(v->dev, 0x04, 0x6);
    v->common += (uint32_t)delta;
    v->notify += (uint32_t)delta;
    v->device += (uint32_t)delta;
    return pci_bar(v->dev, 0) == base + (uint32_t)delta;
}

uint8_t vdev_status(const struct vdev *v)
{
    return v->mmio ? (uint8_t)mmio32(v->common + MMIO_STATUS) : mmio8(v->common + PCI_STATUS);
}

/* How long a reset may take: a vhost-user device's completes once its backend has stopped its
 * rings (GET_VRING_BASE), which on a busy host can outlast any fixed number of status reads. */
#define RESET_TICKS (PM_TIMER_HZ * 5)

/* Add the PM timer's ticks since *last to *waited: whether `ticks` have passed now. */
static int timed_out(uint32_t *waited, uint32_t *last, uint32_t ticks)
{
    uint32_t now = pm_timer();
    *waited += (now - *last) & pm_timer_mask;
    *last = now;
    return *waited >= ticks;
}

static void vdev_set_status(const struct vdev *v, uint8_t status)
{
    if (v->mmio)
        mmio_write32(v->common + MMIO_STATUS, status);
    else
        mmio_write8(v->common + PCI_STATUS, status);
}

/* Write 0 to the status and wait until it reads 0 (§4.1.4.3.2, §4.2.2.2): the device has
 * stopped its queues. */
int vdev_reset(const struct vdev *v)
{
    vdev_set_status(v, 0);
    uint32_t waited = 0, last = pm_timer();
    while (vdev_status(v) != 0)
        if (timed_out(&waited, &last, RESET_TICKS))
            return 0;
    return 1;
}

/* Half `sel` (0: bits 0-31) of the features the device offers. */
static uint32_t features(const struct vdev *v, uint32_t sel)
{
    if (v->mmio) {
        mmio_write32(v->common + MMIO_DEVICE_FEATURES_SEL, sel);
        return mmio32(v->common + MMIO_DEVICE_FEATURES);
    }
    mmio_write32(v->common + PCI_FEATURE_SEL, sel);
    return mmio32(v->common + PCI_FEATURES);
}

/* Accept `bits` in half `sel` of the driver's features. */
static void accept(const struct vdev *v, uint32_t sel, uint32_t bits)
{
    if (v->mmio) {
        mmio_write32(v->common + MMIO_DRIVER_FEATURES_SEL, sel);
        mmio_write32(v->common + MMIO_DRIVER_FEATURES, bits);
    } else {
        mmio_write32(v->common + PCI_DRIVER_FEATURE_SEL, sel);
        mmio_write32(v->common + PCI_DRIVER_FEATURES, bits);
    }
}

/* Reset, ACKNOWLEDGE and DRIVER, accept VIRTIO_F_VERSION_1 and those of `wanted` (bits 0-31)
 * the device offers, set FEATURES_OK (§3.1.1); whether the device kept it. */
int vdev_negotiate(const struct vdev *v, uint32_t wanted)
{
    if (!vdev_reset(v))
        return 0;
    vdev_set_status(v, 1);
    vdev_set_status(v, 3);
    accept(v, 1, 1); /* VIRTIO_F_VERSION_1 */
    accept(v, 0, wanted & features(v, 0));
    vdev_set_status(v, 0xb);
    return vdev_status(v) == 0xb;
}

/* Write a 64-bit queue address as two 32-bit halves. */
static void write64(uint32_t at, uint32_t value)
{
    mmio_write32(at, value);
    mmio_write32(at + 4, 0);
}

/* Give the device queue `index` on `q` (empty rings), and enable it; whether it could. */
int vdev_queue(const struct vdev *v, uint16_t index, struct vq *q)
{
    memset(q, 0, sizeof *q);
    q->index = index;
    q->dev = v;
    if (v->mmio) {
        mmio_write32(v->common + MMIO_QUEUE_SEL, index);
        if (mmio32(v->common + MMIO_QUEUE_NUM_MAX) < VQ_SIZE)
            return 0;
        mmio_write32(v->common + MMIO_QUEUE_NUM, VQ_SIZE);
        write64(v->common + MMIO_QUEUE_DESC, (uint32_t)q->desc);
        write64(v->common + MMIO_QUEUE_DRIVER, (uint32_t)q->avail);
        write64(v->common + MMIO_QUEUE_DEVICE, (uint32_t)q->used);
        q->notify = v->common + MMIO_QUEUE_NOTIFY;
        mmio_write32(v->common + MMIO_QUEUE_READY, 1);
        return 1;
    }
    mmio_write16(v->common + PCI_QUEUE_SEL, index);
    mmio_write16(v->common + PCI_QUEUE_SIZE, VQ_SIZE);
    write64(v->common + PCI_QUEUE_DESC, (uint32_t)q->desc);
    write64(v->common + PCI_QUEUE_DRIVER, (uint32_t)q->avail);
    write64(v->common + PCI_QUEUE_DEVICE, (uint32_t)q->used);
    q->notify = v->notify + mmio16(v->common + PCI_QUEUE_NOTIFY_OFF) * v->multiplier;
    mmio_write16(v->common + PCI_QUEUE_ENABLE, 1);
    return 1;
}

void vdev_driver_ok(const struct vdev *v) { vdev_set_status(v, 0xf); }

/* Make the chain at descriptor `head` available (§2.7.13) and ring the queue's doorbell with
 * its index (§4.1.5.2; §4.2.2 QueueNotify, a 32-bit register). */
void vq_submit(struct vq *q, uint16_t head)
{
    q->avail[2 + q->next_avail % VQ_SIZE] = head;
    __asm__ volatile("" ::: "memory");
    q->avail[1] = ++q->next_avail;
    __asm__ volatile("" ::: "memory");
    if (q->dev->mmio)
        mmio_write32(q->notify, q->index);
    else
        mmio_write16(q->notify, q->index);
}

/* The used ring's index: its second 16-bit field (§2.7.8). What the device wrote before it is
 * read after it. */
uint16_t vq_used_idx(const struct vq *q)
{
    uint16_t idx = (uint16_t)(q->used[0] >> 16);
    __asm__ volatile("" ::: "memory");
    return idx;
}

/* Wait until the device used every chain made available: 1, or 0 after about `ticks` of the
 * PM timer or once the device shows DEVICE_NEEDS_RESET (§2.1.2: it will not answer). */
int vq_wait(const struct vq *q, uint32_t ticks)
{
    uint32_t waited = 0, last = pm_timer();
    while (vq_used_idx(q) != q->next_avail)
        if ((vdev_status(q->dev) & STATUS_NEEDS_RESET) || timed_out(&waited, &last, ticks))
            return 0;
    return 1;
}

/* How long vdev_reconnect goes on. */
#define RECONNECT_TICKS (PM_TIMER_HZ * 120)

/* Rounds until one after a reset is answered, for at most RECONNECT_TICKS: when the device
 * shows DEVICE_NEEDS_RESET (§2.1.2) print a marker line, reset it and set it up again (each
 * set-up starts with a reset, §3.1.1: the VMM's cue to reach its backend again). Whether a
 * round after a reset was answered in time. */
int vdev_reconnect(struct reconnect *r)
{
    uint32_t ready = 1, waited = 0, last = pm_timer();
    r->resets = r->good = 0;
    while (waited < RECONNECT_TICKS) {
        if (vdev_status(r->dev) & STATUS_NEEDS_RESET) {
            print("testkernel: %s: DEVICE_NEEDS_RESET, resetting (%u)\n", r->what, ++r->resets);
            if (r->resets == 1 && r->first_reset)
                r->first_reset();
            ready = 0;
        }
        if (!ready)
            ready = r->setup();
        if (ready && r->round(r->resets)) {
            r->good++;
            if (r->resets)
                return 1;
        } else
            delay(RECONNECT_PAUSE);
        uint32_t now = pm_timer();
        waited += (now - last) & pm_timer_mask;
        last = now;
    }
    return 0;
}
