/* ICMP echo with the host's kernel: RFC 792 in RFC 791 IPv4 in Ethernet II, through the
 * virtio-net driver. Builds on virtio_net.c. */

#define ETH_HLEN 14
#define ETH_P_IPV4 0x0800
#define IPV4_HLEN 20 /* no options */
#define IPPROTO_ICMP 1
#define ICMP_HLEN 8
#define ICMP_ECHO_REPLY 0
#define ICMP_ECHO_REQUEST 8
#define ICMP_ECHO_ID 0x7865 /* RFC 792 leaves the identifier to the sender */

static u16 be16(const u8 *p) { return (u16)(p[0] << 8 | p[1]); }
static void put_be16(u8 *p, u64 v) { p[0] = (u8)(v >> 8); p[1] = (u8)v; }
static void put_be32(u8 *p, u64 v) { put_be16(p, v >> 16); put_be16(p + 2, v); }

static int bytes_equal(const u8 *a, const u8 *b, u64 n)
{
    for (u64 i = 0; i < n; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

/* Fold a sum of 16-bit words into the Internet checksum: the ones' complement of their ones'
 * complement sum (RFC 1071). */
static u16 csum_fold(u64 sum)
{
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return (u16)~sum;
}

static u16 inet_checksum(const u8 *p, u64 n)
{
    u64 sum = 0;
    for (u64 i = 0; i + 1 < n; i += 2)
        sum += be16(p + i);
    if (n & 1)
        sum += (u64)p[n - 1] << 8;
    return csum_fold(sum);
}

static u8 *tx_icmp(void) { return dev.tx_buf + VIRTIO_NET_HDR_SIZE + ETH_HLEN + IPV4_HLEN; }

/* Build the echo request once, before the timed loop: to the host's MAC (`value`), from the
 * guest's address to the host's (`address`), `size` bytes of data. The frame's length. */
static u64 icmp_build(const struct op *op, u64 size)
{
    u8 *f = dev.tx_buf + VIRTIO_NET_HDR_SIZE, *ip = f + ETH_HLEN, *icmp = tx_icmp();
    for (u64 i = 0; i < 6; i++) {
        f[i] = (u8)(op->value >> (40 - 8 * i));
        f[6 + i] = dev.mac[i];
    }
    put_be16(f + 12, ETH_P_IPV4);
    /* RFC 791 §3.1: version 4, five header words, routine service, an identification of 0 in
     * a datagram that Don't Fragment keeps whole (RFC 6864 §4.1), TTL 64. */
    ip[0] = 0x45;
    ip[1] = 0;
    put_be16(ip + 2, IPV4_HLEN + ICMP_HLEN + size);
    put_be16(ip + 4, 0);
    put_be16(ip + 6, 0x4000);
    ip[8] = 64;
    ip[9] = IPPROTO_ICMP;
    put_be16(ip + 10, 0);
    put_be32(ip + 12, op->address >> 32);
    put_be32(ip + 16, op->address);
    put_be16(ip + 10, inet_checksum(ip, IPV4_HLEN));
    icmp[0] = ICMP_ECHO_REQUEST;
    icmp[1] = 0;
    put_be16(icmp + 2, 0);
    put_be16(icmp + 4, ICMP_ECHO_ID);
    put_be16(icmp + 6, 0);
    for (u64 i = 0; i < size; i++)
        icmp[ICMP_HLEN + i] = (u8)(i * 7 + 1);
    put_be16(icmp + 2, inet_checksum(icmp, ICMP_HLEN + size));
    return ETH_HLEN + IPV4_HLEN + ICMP_HLEN + size;
}

/* Number the request `seq`, updating its checksum for that word alone (RFC 1624 eqn. 3:
 * HC' = ~(~HC + ~m + m')) instead of summing the data again. */
static void icmp_set_seq(u16 seq)
{
    u8 *icmp = tx_icmp();
    u64 sum = (u16)~be16(icmp + 2) + (u16)~be16(icmp + 6) + (u64)seq;
    put_be16(icmp + 6, seq);
    put_be16(icmp + 2, csum_fold(sum));
}

enum echo { ECHO_OTHER, ECHO_REPLY, ECHO_WRONG };

/* What the received frame of `len` bytes is to the request in flight with `size` bytes of
 * data: not an echo reply from the host to the guest with the probe's identifier (another
 * protocol, address or message: dropped), the request's reply, or a wrong one (RFC 792: the
 * reply carries the request's sequence number and data, code 0). The host is untrusted:
 * nothing is read past the lengths the frame and its IPv4 header give. */
static enum echo icmp_reply(u64 len, u64 size)
{
    const u8 *f = dev.rx_buf + VIRTIO_NET_HDR_SIZE, *ip = f + ETH_HLEN;
    const u8 *req = dev.tx_buf + VIRTIO_NET_HDR_SIZE, *req_ip = req + ETH_HLEN, *req_icmp = tx_icmp();
    if (len < ETH_HLEN + IPV4_HLEN || be16(f + 12) != ETH_P_IPV4 || ip[0] >> 4 != 4 ||
        ip[9] != IPPROTO_ICMP)
        return ECHO_OTHER;
    u64 ihl = (ip[0] & 0xfu) * 4, total = be16(ip + 2);
    if (ihl < IPV4_HLEN || total < ihl + ICMP_HLEN || ETH_HLEN + total > len)
        return ECHO_OTHER;
    const u8 *icmp = ip + ihl;
    if (!bytes_equal(ip + 12, req_ip + 16, 4) || !bytes_equal(ip + 16, req_ip + 12, 4) ||
        icmp[0] != ICMP_ECHO_REPLY || be16(icmp + 4) != ICMP_ECHO_ID)
        return ECHO_OTHER;
    if (total != ihl + ICMP_HLEN + size || !bytes_equal(f, dev.mac, 6) || icmp[1] != 0 ||
        be16(icmp + 6) != be16(req_icmp + 6) ||
        !bytes_equal(icmp + ICMP_HLEN, req_icmp + ICMP_HLEN, size))
        return ECHO_WRONG;
    return ECHO_REPLY;
}

/* OP_ICMP_ECHO: `count` echo requests to the host's kernel, each reply awaited on the receive
 * interrupt; the frame is built before the timed part, each request renumbered in it. */
static void icmp_echo(const struct op *op, struct op_result *res)
{
    u64 size = op->size;
    if (!dev.ready || bytes_equal(dev.mac, (const u8 *)"\0\0\0\0\0\0", 6) || size > ICMP_MAX_PAYLOAD) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    u64 len = icmp_build(op, size);
    u64 rx_before = irq_counts[dev.rx_vector], all_before = device_irqs();
    op_start = rdtsc();
    for (u64 i = 0; i < op->count; i++) {
        icmp_set_seq((u16)i);
        u64 deadline = tsc_timeout();
        send_frame(len);
        enum echo got = ECHO_OTHER;
        /* The posted buffer's interrupt, whatever came before: frames other than the reply
         * (the host's IPv6 chatter on a new link) are dropped until the time is up. */
        while (got == ECHO_OTHER && wait_rx(dev.rx_irqs)) {
            got = icmp_reply(take_frame(), size);
            post_rx();
            if (rdtsc() > deadline)
                break;
        }
        if (got != ECHO_REPLY) {
            res->status = got == ECHO_WRONG ? STATUS_BAD_DATA : STATUS_TIMEOUT;
            break;
        }
        res->bytes += size;
        res->value++;
    }
    res->irqs = irq_counts[dev.rx_vector] - rx_before;
    res->stray_irqs = device_irqs() - all_before - res->irqs;
}
