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
 * again and go on until a request after a reset is answered.
 *
 * net=mq: a card with two queue pairs or more (VIRTIO_NET_F_MQ and the control queue,
 * §5.1.6.5): both pairs and the control queue set up, an ARP request answered on pair 1; one
 * on pair 2 not taken while only pair 1 is active (§5.1.6.5.5), VQ_PAIRS_SET past
 * max_virtqueue_pairs answered VIRTIO_NET_ERR, VQ_PAIRS_SET 2 VIRTIO_NET_OK, and then that
 * request taken and answered on receiveq2. */
#include <stdint.h>

#include "testkernel.h"

#define NET_HDR 12
#define NET_FRAME 1514
#define VIRTIO_NET_F_MAC 5
#define VIRTIO_NET_F_CTRL_VQ 17
#define VIRTIO_NET_F_MQ 22
#define NET_CTRL_MQ 4
#define NET_CTRL_MQ_VQ_PAIRS_SET 0
#define NET_OK 0
#define NET_ERR 1
#define ETH_ARP 0x0806

/* A receive/transmit queue pair (§5.1.2: receiveqN is queue 2(N-1), transmitqN the next) and
 * its buffers. */
struct net_pair {
    struct vq rx, tx;
    uint8_t rx_buf[VQ_SIZE][NET_HDR + NET_FRAME];
    uint8_t tx_buf[NET_HDR + 60];
};

static struct vdev net_dev;
static struct net_pair net_pairs[2];
/* net=mq: the control queue, a command and its ack byte. */
static struct vq net_ctrl;
static uint8_t net_command[4], net_ack;
/* Once a request was answered (net=reconnect, net_rounds=N): the card's MAC and address, and
 * the peer it asks for. */
static uint8_t net_mac[6], net_ip[4], net_peer[4];
static int net_answered;

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

/* Make the ARP request for `peer` from `mac` at `ip` available on `p`'s transmit queue. */
static void arp_send(struct net_pair *p, const uint8_t mac[6], const uint8_t ip[4],
                     const uint8_t peer[4])
{
    uint8_t *f = p->tx_buf + NET_HDR, *arp = f + 14;
    memset(p->tx_buf, 0, sizeof p->tx_buf);
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
    p->tx.desc[0] = (struct vq_desc){ (uint32_t)p->tx_buf, sizeof p->tx_buf, 0, 0 };
    vq_submit(&p->tx, 0);
}

/* Send the ARP request on pair 1, and wait for it to be taken. */
static int arp_request(const uint8_t mac[6], const uint8_t ip[4], const uint8_t peer[4])
{
    arp_send(&net_pairs[0], mac, ip, peer);
    return vq_wait(&net_pairs[0].tx, PM_TIMER_HZ);
}

/* Wait up to `ticks` of the PM timer for the ARP reply on `p`; buffers of other frames go
 * back. */
static int await_reply_on(struct net_pair *p, uint32_t ticks, const uint8_t mac[6],
                          const uint8_t ip[4], const uint8_t peer[4], uint8_t peer_mac[6])
{
    struct vq *rx = &p->rx;
    uint32_t waited = 0, last = pm_timer();
    while (waited < ticks) {
        while (rx->used_seen != vq_used_idx(rx)) {
            uint32_t slot = 1 + 2 * (rx->used_seen++ % VQ_SIZE);
            uint32_t id = rx->used[slot], len = rx->used[slot + 1];
            if (id >= VQ_SIZE)
                return 0;
            int found = len > NET_HDR && len <= NET_HDR + NET_FRAME &&
                        arp_reply(p->rx_buf[id] + NET_HDR, len - NET_HDR, mac, ip, peer, peer_mac);
            vq_submit(rx, (uint16_t)id);
            if (found)
                return 1;
        }
        uint32_t now = pm_timer();
        waited += (now - last) & pm_timer_mask;
        last = now;
    }
    return 0;
}

/* The same on pair 1. */
static int await_arp_reply(uint32_t ticks, const uint8_t mac[6], const uint8_t ip[4],
                           const uint8_t peer[4], uint8_t peer_mac[6])
{
    return await_reply_on(&net_pairs[0], ticks, mac, ip, peer, peer_mac);
}

/* Give the card pair `k`'s receive queue (filled with buffers) and transmit queue; whether
 * it took them. */
static int net_pair_queues(uint16_t k)
{
    struct net_pair *p = &net_pairs[k];
    if (!vdev_queue(&net_dev, 2 * k, &p->rx) || !vdev_queue(&net_dev, 2 * k + 1, &p->tx))
        return 0;
    for (uint16_t i = 0; i < VQ_SIZE; i++) {
        p->rx.desc[i] = (struct vq_desc){ (uint32_t)p->rx_buf[i], NET_HDR + NET_FRAME, 2, 0 };
        vq_submit(&p->rx, i);
    }
    return 1;
}

/* Give the card receiveq1 and transmitq1, DRIVER_OK; whether it took them. */
static int net_queues(void)
{
    if (!net_pair_queues(0))
        return 0;
    vdev_driver_ok(&net_dev);
    return !(vdev_status(&net_dev) & STATUS_NEEDS_RESET);
}

/* net=reconnect's set-up after a reset. */
static int net_setup(void)
{
    return vdev_negotiate(&net_dev, 1u << VIRTIO_NET_F_MAC) && net_queues();
}

/* net=reconnect's round: one request, answered. */
/* One request, its answer awaited `ticks` of the PM timer. */
static int net_round_within(uint32_t ticks)
{
    uint8_t peer_mac[6];
    return arp_request(net_mac, net_ip, net_peer) &&
           await_arp_reply(ticks, net_mac, net_ip, net_peer, peer_mac);
}

static int net_round(uint32_t resets)
{
    (void)resets;
    return net_round_within(RECONNECT_PAUSE);
}

/* net=reconnect's first reset: the disk beside the card still answers. */
static void net_disk_beside(void)
{
    check(disk_round(3), "disk: a round while the card's backend is away");
}

/* The addresses from the command line, the first virtio-net card, and its MAC; whether all
 * were there. */
static int net_find(uint8_t ip[4], uint8_t peer[4], uint8_t mac[6])
{
    if (!check(parse_ip(arg("ip"), ip) && parse_ip(arg("peer"), peer),
               "net: ip=A.B.C.D and peer=A.B.C.D given"))
        return 0;
    if (!vdev_find(&net_dev, 1, "net", "virtio-net"))
        return 0;
    for (uint32_t i = 0; i < 6; i++)
        mac[i] = mmio8(net_dev.device + i);
    return 1;
}

void check_net(int reconnect)
{
    uint8_t ip[4], peer[4], mac[6], peer_mac[6] = { 0 };
    if (!net_find(ip, peer, mac))
        return;
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
        /* A second: a loaded host (testpmd busy-polls a core the other tests share) once held
         * an answer past the 200 ms a reconnect's round waits; a frame lost still fails. */
        int ok = net_round_within(PM_TIMER_HZ);
        print("net round %06u of %06u: %s\n", i, rounds, ok ? "answered" : "FAILED");
        good += (uint32_t)ok;
    }
    check(good == rounds, "net: %u of %u requests answered", good, rounds);
}

/* VQ_PAIRS_SET `pairs` on the control queue (§5.1.6.5.5): the device's ack, or 0xff if it did
 * not use the command in a second. */
static uint8_t pairs_set(uint16_t pairs)
{
    net_command[0] = NET_CTRL_MQ;
    net_command[1] = NET_CTRL_MQ_VQ_PAIRS_SET;
    net_command[2] = (uint8_t)pairs;
    net_command[3] = (uint8_t)(pairs >> 8);
    net_ack = 0xff;
    net_ctrl.desc[0] = (struct vq_desc){ (uint32_t)net_command, sizeof net_command, 1, 1 };
    net_ctrl.desc[1] = (struct vq_desc){ (uint32_t)&net_ack, 1, 2, 0 };
    vq_submit(&net_ctrl, 0);
    if (!vq_wait(&net_ctrl, PM_TIMER_HZ))
        return 0xff;
    return *(volatile uint8_t *)&net_ack;
}

void check_net_mq(void)
{
    uint8_t ip[4], peer[4], mac[6], peer_mac[6] = { 0 };
    if (!net_find(ip, peer, mac))
        return;
    uint16_t max = mmio16(net_dev.device + 8); /* max_virtqueue_pairs (§5.1.4) */
    uint32_t want = 1u << VIRTIO_NET_F_MAC | 1u << VIRTIO_NET_F_MQ | 1u << VIRTIO_NET_F_CTRL_VQ;
    if (!check(max >= 2 && max < 0x8000 && vdev_negotiate(&net_dev, want),
               "net: FEATURES_OK with MQ, %u queue pairs", max))
        return;
    if (!check(net_pair_queues(0) && net_pair_queues(1) && vdev_queue(&net_dev, 2 * max, &net_ctrl),
               "net: pairs 1 and 2 and the control queue set up"))
        return;
    vdev_driver_ok(&net_dev);
    int answered = 0;
    for (int try = 0; try < 3 && !answered; try++)
        answered = arp_request(mac, ip, peer) &&
                   await_arp_reply(PM_TIMER_HZ, mac, ip, peer, peer_mac);
    check(answered, "net: ARP reply on pair 1: %u.%u.%u.%u is at %02x:%02x:%02x:%02x:%02x:%02x",
          peer[0], peer[1], peer[2], peer[3], peer_mac[0], peer_mac[1], peer_mac[2], peer_mac[3],
          peer_mac[4], peer_mac[5]);
    struct net_pair *two = &net_pairs[1];
    arp_send(two, mac, ip, peer);
    check(!vq_wait(&two->tx, PM_TIMER_HZ / 2), "net: transmitq2 not taken before VQ_PAIRS_SET");
    uint8_t ack = pairs_set((uint16_t)(max + 1));
    check(ack == NET_ERR, "net: VQ_PAIRS_SET %u answered VIRTIO_NET_ERR (%u)", max + 1, ack);
    ack = pairs_set(2);
    check(ack == NET_OK, "net: VQ_PAIRS_SET 2 answered VIRTIO_NET_OK (%u)", ack);
    memset(peer_mac, 0, 6);
    answered = vq_wait(&two->tx, PM_TIMER_HZ) &&
               await_reply_on(two, 2 * PM_TIMER_HZ, mac, ip, peer, peer_mac);
    check(answered, "net: ARP reply on pair 2: %u.%u.%u.%u is at %02x:%02x:%02x:%02x:%02x:%02x",
          peer[0], peer[1], peer[2], peer[3], peer_mac[0], peer_mac[1], peer_mac[2], peer_mac[3],
          peer_mac[4], peer_mac[5]);
}
