/* virtio-net (virtio 1.2 §5.1), driven through virtio.c on either transport, on a network
 * where someone answers an ARP request (RFC 826): the host's kernel on a tap, for its own
 * address, or DPDK testpmd's icmpecho on vhost-user, for any. Receive buffers go on receiveq1
 * (queue 0), the request on transmitq1 (queue 1), each frame behind the 12-byte
 * virtio_net_hdr (§5.1.6), all zero: no offloads were negotiated. Frames other than the
 * answer (the host's IPv6 neighbour discovery, say) are skipped; every buffer is given back.
 *
 * net=reconnect: after the first answer, ask again in rounds while the test kills the backend
 * and starts it again; when the card shows DEVICE_NEEDS_RESET (§2.1.2) print a marker line, do
 * a round on the disk beside it (a second device is unaffected), reset the card, set it up
 * again and go on until a request after a reset is answered. */
#include <stdint.h>

#include "testkernel.h"

#define NET_HDR 12
#define NET_FRAME 1514
#define VIRTIO_NET_F_MAC 5
#define ETH_ARP 0x0806

static struct vdev net_dev;
static struct vq net_rx, net_tx;
/* Once a request was answered (net=reconnect, net_rounds=N): the card's MAC and address, and
 * the peer it asks for. */
static uint8_t net_mac[6], net_ip[4], net_peer[4];
static int net_answered;
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
    return vq_wait(&net_tx, PM_TIMER_HZ);
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
            int found = len > NET_HDR && len <= NET_HDR + NET_FRAME &&
                        arp_reply(net_rx_buf[id] + NET_HDR, len - NET_HDR, mac, ip, peer, peer_mac);
            vq_submit(&net_rx, (uint16_t)id);
            if (found)
                return 1;
        }
        uint32_t now = pm_timer();
        waited += (now - last) & pm_timer_mask;
        last = now;
    }
    return 0;
}

/* Give the card receiveq1 (filled with buffers) and transmitq1, DRIVER_OK; whether it took
 * them. */
static int net_queues(void)
{
    if (!vdev_queue(&net_dev, 0, &net_rx) || !vdev_queue(&net_dev, 1, &net_tx))
        return 0;
    for (uint16_t i = 0; i < VQ_SIZE; i++) {
        net_rx.desc[i] = (struct vq_desc){ (uint32_t)net_rx_buf[i], NET_HDR + NET_FRAME, 2, 0 };
        vq_submit(&net_rx, i);
    }
    vdev_driver_ok(&net_dev);
    return !(vdev_status(&net_dev) & STATUS_NEEDS_RESET);
}

/* net=reconnect's set-up after a reset. */
static int net_setup(void)
{
    return vdev_negotiate(&net_dev, 1u << VIRTIO_NET_F_MAC) && net_queues();
}

/* net=reconnect's round: one request, answered. */
static int net_round(uint32_t resets)
{
    (void)resets;
    uint8_t peer_mac[6];
    return arp_request(net_mac, net_ip, net_peer) &&
           await_arp_reply(RECONNECT_PAUSE, net_mac, net_ip, net_peer, peer_mac);
}

/* net=reconnect's first reset: the disk beside the card still answers. */
static void net_disk_beside(void)
{
    check(disk_round(3), "disk: a round while the card's backend is away");
}

void check_net(int reconnect)
{
    uint8_t ip[4], peer[4], mac[6], peer_mac[6] = { 0 };
    if (!check(parse_ip(arg("ip"), ip) && parse_ip(arg("peer"), peer),
               "net: ip=A.B.C.D and peer=A.B.C.D given"))
        return;
    if (!vdev_find(&net_dev, 1, "net", "virtio-net"))
        return;
    for (uint32_t i = 0; i < 6; i++)
        mac[i] = mmio8(net_dev.device + i);
    if (!check(vdev_negotiate(&net_dev, 1u << VIRTIO_NET_F_MAC),
               "net: FEATURES_OK, MAC %02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2],
               mac[3], mac[4], mac[5]))
        return;
    if (!check(net_queues(), "net: queues set up"))
        return;
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
    if (answered) {
        memcpy(net_mac, mac, 6);
        memcpy(net_ip, ip, 4);
        memcpy(net_peer, peer, 4);
        net_answered = 1;
    }
    if (reconnect && answered) {
        struct reconnect r = { .dev = &net_dev, .what = "net", .setup = net_setup,
                               .round = net_round, .first_reset = net_disk_beside };
        int back = vdev_reconnect(&r); /* before check's arguments read r */
        check(back, "net: ARP reply after %u resets (%u answered)", r.resets, r.good);
    }
}

/* net_rounds=N (with net=1): once the first request was answered, N more, each awaited and
 * printed: a guest receiving frames for a while, for a snapshot to catch mid-work. */
void net_rounds(uint32_t rounds)
{
    uint32_t good = 0;
    if (!rounds || !net_answered)
        return;
    for (uint32_t i = 1; i <= rounds; i++) {
        int ok = net_round(0);
        print("net round %06u of %06u: %s\n", i, rounds, ok ? "answered" : "FAILED");
        good += (uint32_t)ok;
    }
    check(good == rounds, "net: %u of %u requests answered", good, rounds);
}
