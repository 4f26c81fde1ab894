/* The virtio-net driver (virtio 1.2 §5.1), the same for every transport: the device brought up
 * (§3.1.1), request frames answered by the VMM's responder, MSI masking, a transmit stream.
 * Builds on virtio.c and the transports. */

/* The table for a `TRANSPORT_*` and `RR_FLAG_*` pair, or 0. */
static const struct transport_ops *transport_ops(u64 transport, u64 flags)
{
    if (transport == TRANSPORT_PCI)
        return &pci_msix_ops;
    if (transport == TRANSPORT_MMIO)
        return (flags & RR_FLAG_MSI) ? &mmio_msi_ops : &mmio_legacy_ops;
    return 0;
}

/* ---- The driver, the same for every transport ---- */

static u64 get_features(void)
{
    return dev.ops->device_features(0) | (u64)dev.ops->device_features(1) << 32;
}

static void set_features(u64 f)
{
    dev.ops->driver_features(0, (u32)f);
    dev.ops->driver_features(1, (u32)(f >> 32));
}

static int setup_queue(struct vq *q, u16 index)
{
    q->index = index;
    if (dev.ops->queue_select(index) < QSIZE)
        return 0;
    q->size = QSIZE;
    q->avail_idx = q->last_used = 0;
    q->desc = dma_alloc(16 * QSIZE);
    q->avail = dma_alloc(6 + 2 * QSIZE);
    q->used = dma_alloc(6 + 8 * QSIZE);
    if (!q->desc || !q->avail || !q->used)
        return 0;
    u64 addr[3] = {(u64)q->desc, (u64)q->avail, (u64)q->used};
    const u64 len[3] = {16 * QSIZE, 6 + 2 * QSIZE, 6 + 8 * QSIZE};
    /* Behind the IOMMU the rings too are IOVAs: slot 0, one page per ring, for good. */
    for (u64 i = 0; dev.iommu && i < 3; i++)
        if (!(addr[i] = vtd_map_at(dev.iommu, 0, 3 * (u64)index + i, (void *)addr[i], len[i], 1)))
            return 0;
    return dev.ops->queue_enable(q, addr);
}


static void post_rx(void)
{
    *used_event(&dev.rx) = dev.rx.last_used; /* interrupt on the next receive */
    dev.rx_irqs = irq_counts[dev.rx_vector];
    vq_post(&dev.rx, dev.rx_buf, RR_RX_BUFFER_SIZE, VIRTQ_DESC_F_WRITE);
}


/* Take back the transmit buffers the device returned; how many. */
static u64 reap_tx(void)
{
    u64 n = 0;
    for (u16 end = used_idx(&dev.tx); dev.tx.last_used != end; dev.tx.last_used++, n++)
        vq_unmap(&dev.tx, used_id(&dev.tx, dev.tx.last_used));
    return n;
}

static u64 device_irqs(void)
{
    u64 n = irq_counts[IRQ_VECTOR_LEGACY];
    for (u64 v = IRQ_VECTOR_BASE; v <= IRQ_VECTOR_BASE + IRQ_VECTOR_CONFIG; v++)
        n += irq_counts[v];
    return n;
}

/* Reset the device brought up before if it is another one: the next one's rings and buffers
 * reuse its DMA area (dma_next starts again), and a device that polls its rings, such as a
 * vhost-user backend's, would go on taking (and answering) what the next one posts there.
 * After the reset it uses no ring (virtio 1.2 §2.4). A device that never reads 0 is left. */
static void virtio_release(u64 transport, u64 address)
{
    if (!dev.live || (dev.transport == transport && dev.address == address))
        return;
    dev.live = 0;
    dev.ops->set_status(0);
    u64 deadline = tsc_timeout();
    while (dev.ops->get_status() != 0 && rdtsc() <= deadline)
        ;
}

/* Bring the device up as virtio 1.2 §3.1.1 orders it, its stream buffers laid out for frames
 * of up to `stream_payload` bytes (OP_VIRTIO_INIT's `size`): NET_STREAM_ALIGN apart for the
 * seed's 32 bytes or less, as they always were, one VT-d slot each at most. */
static u64 virtio_init(u64 transport, u64 address, u64 flags, u64 stream_payload)
{
    const struct transport_ops *ops = transport_ops(transport, flags);
    u64 stream_frame = VIRTIO_NET_HDR_SIZE + stream_payload;
    if (!ops || stream_payload > NET_STREAM_FRAME_SIZE - VIRTIO_NET_HDR_SIZE)
        return STATUS_UNSUPPORTED;
    virtio_release(transport, address);
    dev.ops = ops;
    dev.transport = transport;
    dev.address = address;
    dev.flags = flags;
    dev.stream_payload = stream_payload;
    dev.stream_stride = (stream_frame + NET_STREAM_ALIGN - 1) & ~(NET_STREAM_ALIGN - 1);
    dev.ready = 0;
    dev.iommu = 0;
    dma_next = DMA_ADDR;
    if ((flags & RR_FLAG_IOMMU) && transport != TRANSPORT_PCI)
        return STATUS_UNSUPPORTED; /* only PCI functions have a source-id */
    u64 located = ops->locate(address);
    if (located != STATUS_OK)
        return located;
    ops->set_status(0);
    u64 deadline = tsc_timeout();
    while (ops->get_status() != 0) /* virtio-pci: reset completes when status reads 0 */
        if (rdtsc() > deadline)
            return STATUS_TIMEOUT;
    if (flags & RR_FLAG_IOMMU) {
        u64 up = vtd_init();
        if (up != STATUS_OK)
            return up;
        if (!(dev.iommu = vtd_domain(address)))
            return STATUS_DEVICE_ERROR;
        vtd_domain_reset(dev.iommu);
    }
    ops->set_status(VIRTIO_STATUS_ACKNOWLEDGE);
    ops->set_status(VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER);
    u64 want = (1ull << VIRTIO_F_VERSION_1) | (1ull << VIRTIO_F_EVENT_IDX) | ops->features();
    if (dev.iommu)
        want |= 1ull << VIRTIO_F_ACCESS_PLATFORM;
    u64 offered = get_features();
    if ((offered & want) != want)
        return STATUS_DEVICE_ERROR;
    want |= offered & (1ull << VIRTIO_NET_F_MAC); /* its address, if it has one */
    set_features(want);
    u32 s = VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK;
    ops->set_status(s);
    if (!(ops->get_status() & VIRTIO_STATUS_FEATURES_OK))
        return STATUS_DEVICE_ERROR;
    for (u64 i = 0; i < 6; i++) /* virtio_net_config.mac (virtio 1.2 §5.1.4) */
        dev.mac[i] = (want >> VIRTIO_NET_F_MAC & 1) ? (u8)mem_read(dev.devcfg + i, 1) : 0;
    ops->setup_interrupts();
    if (!setup_queue(&dev.rx, VIRTIO_NET_RX_QUEUE) || !setup_queue(&dev.tx, VIRTIO_NET_TX_QUEUE))
        return STATUS_DEVICE_ERROR;
    dev.rx_buf = dma_alloc(RR_RX_BUFFER_SIZE);
    dev.tx_buf = dma_alloc(VIRTIO_NET_HDR_SIZE + RR_MAX_REQUEST);
    /* Zeroed here, so that no stream touches a page for the first time. */
    dev.stream_buf = dma_alloc(QSIZE * dev.stream_stride);
    if (!dev.stream_buf)
        return STATUS_DEVICE_ERROR;
    for (u64 i = 0; i < QSIZE; i++)
        dev.rx.iova_slot[i] = dev.tx.iova_slot[i] = 0;
    ops->set_status(s | VIRTIO_STATUS_DRIVER_OK);
    dev.live = 1;
    if (ops->get_status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET)
        return STATUS_DEVICE_ERROR;
    post_rx();
    dev.ready = 1;
    return STATUS_OK;
}

/* Send the frame of `len` bytes at `dev.tx_buf` + the header, behind a header asking for
 * nothing (no checksum or segmentation offload, virtio 1.2 §5.1.6.2). */
static void send_frame(u64 len)
{
    for (u64 i = 0; i < VIRTIO_NET_HDR_SIZE; i++)
        dev.tx_buf[i] = 0;
    /* No interrupt for transmit completions: used_event far ahead of anything in flight. */
    *used_event(&dev.tx) = (u16)(dev.tx.avail_idx + 0x4000);
    vq_post(&dev.tx, dev.tx_buf, (u32)(VIRTIO_NET_HDR_SIZE + len), 0);
}

/* Send a request frame of `size` bytes derived from `seq`. */
static void send_request(u64 size, u64 seq)
{
    for (u64 i = 0; i < size; i++)
        dev.tx_buf[VIRTIO_NET_HDR_SIZE + i] = (u8)(seq * 7 + i);
    send_frame(size);
}

/* Take the used receive buffer: the length of the frame in it, 0 if the device wrote no more
 * than the header or more than the buffer holds (the length is the device's word). Read it,
 * then give the buffer back with post_rx(). */
static u64 take_frame(void)
{
    u32 len = used_len(&dev.rx, dev.rx.last_used);
    vq_unmap(&dev.rx, used_id(&dev.rx, dev.rx.last_used));
    dev.rx.last_used++;
    reap_tx();
    return len > VIRTIO_NET_HDR_SIZE && len <= RR_RX_BUFFER_SIZE ? len - VIRTIO_NET_HDR_SIZE : 0;
}

/* Take the response to the request of `size` bytes; check it; give the buffer back. */
static u64 take_response(u64 size, struct op_result *res)
{
    u64 len = take_frame();
    const u8 *req = dev.tx_buf + VIRTIO_NET_HDR_SIZE;
    const u8 *resp = dev.rx_buf + VIRTIO_NET_HDR_SIZE;
    u64 status = len ? STATUS_OK : STATUS_BAD_DATA;
    for (u64 i = 0; i < len; i++) {
        u8 want = (u8)(req[i % size] ^ 0xffu);
        if (resp[i] != want) {
            status = STATUS_BAD_DATA;
            break;
        }
    }
    res->bytes += len;
    post_rx();
    return status;
}

/* Wait until the receive queue has a used buffer and, if `irqs_before` is not ~0, until the
 * receive vector fired. */
static int wait_rx(u64 irqs_before)
{
    struct deadline deadline = deadline_in_a_second(); /* a snapshot may stop the VM here */
    while (used_idx(&dev.rx) == dev.rx.last_used ||
           (irqs_before != ~0ull && irq_counts[dev.rx_vector] == irqs_before)) {
        vtd_tick();
        if (deadline_passed(&deadline))
            return 0;
    }
    return 1;
}

static void virtio_rr(const struct op *op, struct op_result *res)
{
    if (!dev.ready || op->size == 0 || op->size > RR_MAX_REQUEST) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    u64 rx_before = irq_counts[dev.rx_vector], all_before = device_irqs();
    for (u64 i = 0; i < op->count; i++) {
        u64 irqs = irq_counts[dev.rx_vector];
        send_request(op->size, i);
        if (!wait_rx(irqs)) {
            res->status = STATUS_TIMEOUT;
            break;
        }
        res->status = take_response(op->size, res);
        if (res->status != STATUS_OK)
            break;
        res->value++;
    }
    res->irqs = irq_counts[dev.rx_vector] - rx_before;
    res->stray_irqs = device_irqs() - all_before - res->irqs;
}


/* Masking (PCI 3.0 §6.8.2.9 and docs/virtio-mmio-msi.md): a message due while the vector is
 * masked sets its pending bit and is sent at unmask. */
static void virtio_mask_pending(const struct op *op, struct op_result *res)
{
    if (!dev.ready || !is_msi()) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    u64 size = op->size ? op->size : 32;
    u64 irqs = irq_counts[dev.rx_vector];
    dev.ops->msi_mask(VIRTIO_NET_RX_QUEUE, 1);
    send_request(size, 1);
    res->status = STATUS_MASK_BROKEN;
    if (!wait_rx(~0ull))
        return;
    u64 deadline = tsc_timeout();
    while (!dev.ops->msi_pending(VIRTIO_NET_RX_QUEUE))
        if (rdtsc() > deadline)
            return;
    if (irq_counts[dev.rx_vector] != irqs)
        return;
    dev.ops->msi_mask(VIRTIO_NET_RX_QUEUE, 0);
    deadline = tsc_timeout();
    while (irq_counts[dev.rx_vector] == irqs)
        if (rdtsc() > deadline)
            return;
    if (dev.ops->msi_pending(VIRTIO_NET_RX_QUEUE))
        return;
    res->irqs = irq_counts[dev.rx_vector] - irqs;
    res->status = take_response(size, res);
    res->value = res->status == STATUS_OK;
}

/* A stream of frames into the transmit queue, `value` in flight (UDP_STREAM-like, the IOMMU
 * streams' workload): each payload written as a sender produces its data, each buffer mapped
 * when posted, unmapped when returned. The buffers are those virtio_init laid out: a frame
 * larger than they hold is refused. */
static void net_stream(const struct op *op, struct op_result *res)
{
    u64 frame = VIRTIO_NET_HDR_SIZE + op->size, limit = op->value ? op->value : QSIZE;
    if (!dev.ready || op->size == 0 || frame > dev.stream_stride || limit > QSIZE) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    *used_event(&dev.tx) = (u16)(dev.tx.avail_idx + 0x4000); /* no transmit interrupts */
    reap_tx();
    u64 posted = 0, in_flight = (u16)(dev.tx.avail_idx - dev.tx.last_used);
    u64 deadline = tsc_timeout();
    while (res->value < op->count) {
        if (posted < op->count && in_flight < limit) {
            u8 *buf = dev.stream_buf + (dev.tx.avail_idx % QSIZE) * dev.stream_stride;
            for (u64 i = 0; i < VIRTIO_NET_HDR_SIZE; i++)
                buf[i] = 0;
            for (u64 i = 0; i < op->size; i++)
                buf[VIRTIO_NET_HDR_SIZE + i] = (u8)(posted + i);
            vq_post(&dev.tx, buf, (u32)frame, 0);
            posted++;
            in_flight++;
            continue;
        }
        u64 n = reap_tx();
        res->value += n;
        in_flight -= n;
        if (n) {
            deadline = tsc_timeout();
        } else {
            vtd_tick();
            if (rdtsc() > deadline) {
                res->status = STATUS_TIMEOUT;
                return;
            }
        }
    }
}
