/* virtio-pci (virtio 1.2 §4.1), as a minimal polling driver drives it, and the two devices it
 * checks: a virtio-blk disk and a virtio-net card.
 *
 * Find the function on bus 0 by port I/O, take BAR 0 where the platform placed it, walk the
 * vendor capabilities for the common, notify and device configuration, negotiate VERSION_1 and
 * what the device driver asks, set up its queues and poll their used rings (no interrupts).
 * Addresses are guest-physical (paging is off). */
#include <stdint.h>

#include "testkernel.h"

#define VIRTIO_VENDOR 0x1af4
#define VQ_SIZE 8

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

static void mmio_write16(uint32_t a, uint16_t v) { *(volatile uint16_t *)a = v; }
static void mmio_write8(uint32_t a, uint8_t v) { *(volatile uint8_t *)a = v; }
static uint8_t mmio8(uint32_t a) { return *(volatile uint8_t *)a; }

/* A split virtqueue (§2.7) of VQ_SIZE entries, its index and where its doorbell is. */
struct vq_desc { uint64_t addr; uint32_t len; uint16_t flags, next; };
struct vq {
    struct vq_desc desc[VQ_SIZE];
    volatile uint16_t avail[2 + VQ_SIZE + 1];
    volatile uint32_t used[1 + 2 * VQ_SIZE + 1];
    uint32_t notify;
    uint16_t index, next_avail, used_seen;
} __attribute__((aligned(16)));

/* A virtio-pci function's configuration structures (§4.1.4). */
struct vpci { uint32_t dev, common, notify, device, multiplier; };

/* Find the first function of virtio device ID `id` (§4.1.2.1: 0x1040 + ID) on bus 0, enable
 * its memory space and bus mastering, and find its structures; checks named `what`. */
static int vpci_find(struct vpci *v, uint32_t id, const char *what, const char *name)
{
    *v = (struct vpci){ 0 };
    for (uint32_t d = 3; d < 32 && !v->dev; d++)
        if (pci_read32(d, 0) == ((0x1040 + id) << 16 | VIRTIO_VENDOR))
            v->dev = d;
    if (!check(v->dev != 0, "%s: a %s function on bus 0 (00:%02x.0)", what, name, v->dev))
        return 0;
    /* BAR 0 as the platform placed it (a 64-bit memory BAR below 4 GiB). */
    uint32_t bar = pci_read32(v->dev, 0x10) & ~0xfu;
    if (!check(bar != 0 && pci_read32(v->dev, 0x14) == 0, "%s: BAR 0 at %x", what, bar))
        return 0;
    pci_write32(v->dev, 0x04, 0x6); /* memory space, bus master */
    for (uint32_t cap = pci_read32(v->dev, 0x34) & 0xff; cap;
         cap = pci_read32(v->dev, cap) >> 8 & 0xff) {
        uint32_t head = pci_read32(v->dev, cap);
        if ((head & 0xff) != 0x09)
            continue;
        uint32_t type = head >> 24, at = bar + pci_read32(v->dev, cap + 8);
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

/* Reset, ACKNOWLEDGE and DRIVER, accept VIRTIO_F_VERSION_1 and `features` (bits 0-31), set
 * FEATURES_OK (§3.1.1); whether the device kept it. */
static int vpci_negotiate(const struct vpci *v, uint32_t features)
{
    mmio_write8(v->common + 0x14, 0);
    mmio_write8(v->common + 0x14, 1);
    mmio_write8(v->common + 0x14, 3);
    mmio_write32(v->common + 0x08, 1);
    mmio_write32(v->common + 0x0c, 1); /* VIRTIO_F_VERSION_1 */
    mmio_write32(v->common + 0x08, 0);
    mmio_write32(v->common + 0x0c, features);
    mmio_write8(v->common + 0x14, 0xb);
    return mmio8(v->common + 0x14) == 0xb;
}

/* Give the device queue `index` on `q`, and enable it. */
static void vpci_queue(const struct vpci *v, uint16_t index, struct vq *q)
{
    q->index = index;
    mmio_write16(v->common + 0x16, index);
    mmio_write16(v->common + 0x18, VQ_SIZE);
    mmio_write32(v->common + 0x20, (uint32_t)q->desc);
    mmio_write32(v->common + 0x24, 0);
    mmio_write32(v->common + 0x28, (uint32_t)q->avail);
    mmio_write32(v->common + 0x2c, 0);
    mmio_write32(v->common + 0x30, (uint32_t)q->used);
    mmio_write32(v->common + 0x34, 0);
    q->notify = v->notify + (*(volatile uint16_t *)(v->common + 0x1e)) * v->multiplier;
    mmio_write16(v->common + 0x1c, 1);
}

static void vpci_driver_ok(const struct vpci *v) { mmio_write8(v->common + 0x14, 0xf); }

/* Make the chain at descriptor `head` available (§2.7.13) and ring the queue's doorbell with
 * its index (§4.1.5.2). */
static void vq_submit(struct vq *q, uint16_t head)
{
    q->avail[2 + q->next_avail % VQ_SIZE] = head;
    __asm__ volatile("" ::: "memory");
    q->avail[1] = ++q->next_avail;
    __asm__ volatile("" ::: "memory");
    mmio_write16(q->notify, q->index);
}

/* The used ring's index: its second 16-bit field (§2.7.8). What the device wrote before it is
 * read after it. */
static uint16_t vq_used_idx(const struct vq *q)
{
    uint16_t idx = (uint16_t)(q->used[0] >> 16);
    __asm__ volatile("" ::: "memory");
    return idx;
}

/* virtio-blk (virtio 1.2 §5.2): write sector 1, flush, read it back, ask for the ID, and read
 * past the end, which must answer IOERR. */
static struct vq blk_q;
static uint8_t blk_header[16] __attribute__((aligned(16)));
static uint8_t blk_data[1024], blk_check[1024];
static volatile uint8_t blk_status;

/* One request: a header of type and sector, data of len bytes (device-writable if in), the
 * status byte. Returns the status, or 0xff if the device never answered. */
static uint8_t blk_request(uint32_t type, uint32_t sector, void *data, uint32_t len, int in)
{
    memset(blk_header, 0, sizeof blk_header);
    memcpy(blk_header, &type, 4);
    memcpy(blk_header + 8, &sector, 4);
    blk_status = 0xff;
    uint32_t n = 0;
    blk_q.desc[n] = (struct vq_desc){ (uint32_t)blk_header, 16, 1, n + 1 };
    n++;
    if (len) {
        blk_q.desc[n] = (struct vq_desc){ (uint32_t)data, len, (uint16_t)(1 | (in ? 2 : 0)), n + 1 };
        n++;
    }
    blk_q.desc[n] = (struct vq_desc){ (uint32_t)&blk_status, 1, 2, 0 };
    vq_submit(&blk_q, 0);
    for (uint32_t spin = 0; spin < 2000000; spin++)
        if (vq_used_idx(&blk_q) == blk_q.next_avail)
            return blk_status;
    return 0xff;
}

void check_disk(void)
{
    struct vpci v;
    if (!vpci_find(&v, 2, "disk", "virtio-blk"))
        return;
    uint32_t sectors = mmio32(v.device);
    if (!check(vpci_negotiate(&v, 0), "disk: FEATURES_OK, %u sectors", sectors))
        return;
    vpci_queue(&v, 0, &blk_q);
    vpci_driver_ok(&v);
    for (uint32_t i = 0; i < 512; i++)
        blk_data[i] = (uint8_t)(i * 7 + 1);
    uint8_t st = blk_request(1, 1, blk_data, 512, 0);
    check(st == 0, "disk: sector 1 written, status %u", st);
    st = blk_request(4, 0, 0, 0, 0);
    check(st == 0, "disk: flushed, status %u", st);
    memset(blk_check, 0, sizeof blk_check);
    st = blk_request(0, 1, blk_check, 512, 1);
    check(st == 0 && fw_equal(blk_check, blk_data, 512), "disk: sector 1 read back, status %u", st);
    memset(blk_check, 0, 21);
    st = blk_request(8, 0, blk_check, 20, 1);
    check(st == 0 && blk_check[0] != 0, "disk: ID '%s', status %u", (const char *)blk_check, st);
    st = blk_request(0, sectors, blk_check, 512, 1);
    check(st == 1, "disk: a read past the end answered IOERR (status %u)", st);
}

/* virtio-net (virtio 1.2 §5.1) on a network the host's kernel is on (a tap): the kernel
 * answers an ARP request (RFC 826) for its own address. Receive buffers go on receiveq1
 * (queue 0), the request on transmitq1 (queue 1), each frame behind the 12-byte
 * virtio_net_hdr (§5.1.6), all zero: no offloads were negotiated. Frames other than the
 * answer (the host's IPv6 neighbour discovery, say) are skipped and their buffers given
 * back. */
#define NET_HDR 12
#define NET_FRAME 1514
#define VIRTIO_NET_F_MAC 5
#define ETH_ARP 0x0806

static struct vq net_rx, net_tx;
static uint8_t net_rx_buf[VQ_SIZE][NET_HDR + NET_FRAME];
static uint8_t net_tx_buf[NET_HDR + 60];

/* A dotted quad into `ip`; whether `s` held one. */
static int parse_ip(const char *s, uint8_t ip[4])
{
    for (int i = 0; i < 4; i++) {
        uint32_t n = 0, digits = 0;
        while (s && *s >= '0' && *s <= '9' && digits < 4) {
            n = n * 10 + (uint32_t)(*s++ - '0');
            digits++;
        }
        if (!digits || n > 255 || (i < 3 && *s++ != '.'))
            return 0;
        ip[i] = (uint8_t)n;
    }
    return 1;
}

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }

/* Whether `f` (len bytes) is the ARP reply from `peer` to `ip` at `mac`; its sender's MAC
 * into `peer_mac`. */
static int arp_reply(const uint8_t *f, uint32_t len, const uint8_t mac[6], const uint8_t ip[4],
                     const uint8_t peer[4], uint8_t peer_mac[6])
{
    const uint8_t *arp = f + 14;
    if (len < 42 || get16(f + 12) != ETH_ARP || get16(arp + 6) != 2 || !fw_equal(f, mac, 6) ||
        !fw_equal(arp + 14, peer, 4) || !fw_equal(arp + 18, mac, 6) || !fw_equal(arp + 24, ip, 4))
        return 0;
    memcpy(peer_mac, arp + 8, 6);
    return 1;
}

/* Send the ARP request for `peer` from `mac` at `ip`, and wait for it to be taken. */
static int arp_request(const uint8_t mac[6], const uint8_t ip[4], const uint8_t peer[4])
{
    uint8_t *f = net_tx_buf + NET_HDR, *arp = f + 14;
    memset(net_tx_buf, 0, sizeof net_tx_buf);
    memset(f, 0xff, 6); /* broadcast */
    memcpy(f + 6, mac, 6);
    put16(f + 12, ETH_ARP);
    put16(arp, 1);         /* Ethernet */
    put16(arp + 2, 0x0800); /* IPv4 */
    arp[4] = 6;
    arp[5] = 4;
    put16(arp + 6, 1);     /* request */
    memcpy(arp + 8, mac, 6);
    memcpy(arp + 14, ip, 4);
    memcpy(arp + 24, peer, 4);
    net_tx.desc[0] = (struct vq_desc){ (uint32_t)net_tx_buf, sizeof net_tx_buf, 0, 0 };
    vq_submit(&net_tx, 0);
    for (uint32_t spin = 0; spin < 2000000; spin++)
        if (vq_used_idx(&net_tx) == net_tx.next_avail)
            return 1;
    return 0;
}

/* Wait up to `ticks` of the PM timer for the ARP reply; buffers of other frames go back. */
static int await_arp_reply(uint32_t ticks, const uint8_t mac[6], const uint8_t ip[4],
                           const uint8_t peer[4], uint8_t peer_mac[6])
{
    uint32_t waited = 0, last = pm_timer();
    while (waited < ticks) {
        while (net_rx.used_seen != vq_used_idx(&net_rx)) {
            uint32_t slot = 1 + 2 * (net_rx.used_seen++ % VQ_SIZE);
            uint32_t id = net_rx.used[slot], len = net_rx.used[slot + 1];
            if (id >= VQ_SIZE)
                return 0;
            if (len > NET_HDR &&
                arp_reply(net_rx_buf[id] + NET_HDR, len - NET_HDR, mac, ip, peer, peer_mac))
                return 1;
            vq_submit(&net_rx, (uint16_t)id);
        }
        uint32_t now = pm_timer();
        waited += (now - last) & pm_timer_mask;
        last = now;
    }
    return 0;
}

void check_net(void)
{
    uint8_t ip[4], peer[4], mac[6], peer_mac[6] = { 0 };
    if (!check(parse_ip(arg("ip"), ip) && parse_ip(arg("peer"), peer),
               "net: ip=A.B.C.D and peer=A.B.C.D given"))
        return;
    struct vpci v;
    if (!vpci_find(&v, 1, "net", "virtio-net"))
        return;
    for (uint32_t i = 0; i < 6; i++)
        mac[i] = mmio8(v.device + i);
    if (!check(vpci_negotiate(&v, 1u << VIRTIO_NET_F_MAC),
               "net: FEATURES_OK, MAC %02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2],
               mac[3], mac[4], mac[5]))
        return;
    vpci_queue(&v, 0, &net_rx);
    vpci_queue(&v, 1, &net_tx);
    for (uint16_t i = 0; i < VQ_SIZE; i++) {
        net_rx.desc[i] = (struct vq_desc){ (uint32_t)net_rx_buf[i], NET_HDR + NET_FRAME, 2, 0 };
        vq_submit(&net_rx, i);
    }
    vpci_driver_ok(&v);
    /* Three tries a second apart: a host that was still bringing its side up may miss one. */
    int sent = 0, answered = 0;
    for (int try = 0; try < 3 && !answered; try++) {
        sent |= arp_request(mac, ip, peer);
        answered = await_arp_reply(PM_TIMER_HZ, mac, ip, peer, peer_mac);
    }
    check(sent, "net: ARP request for %u.%u.%u.%u sent from %u.%u.%u.%u", peer[0], peer[1],
          peer[2], peer[3], ip[0], ip[1], ip[2], ip[3]);
    check(answered, "net: ARP reply: %u.%u.%u.%u is at %02x:%02x:%02x:%02x:%02x:%02x", peer[0],
          peer[1], peer[2], peer[3], peer_mac[0], peer_mac[1], peer_mac[2], peer_mac[3],
          peer_mac[4], peer_mac[5]);
}
