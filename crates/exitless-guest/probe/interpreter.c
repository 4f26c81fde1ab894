/* The op interpreter: one op run and timed. Builds on every concern above it in probe.c. */

/* Set when QEMU booted the probe (multiboot): no VMM test port, no built-in responder, no
 * virtio-mmio devices; its virtio-net-pci functions are driven (OP_VIRTIO_INIT, OP_ICMP_ECHO
 * with a tap behind them, the VT-d streams behind its intel-iommu). */
static int under_qemu;

/* Ops that need what only exitless's machine has: refused under QEMU, not left to time out. */
static int needs_exitless(const struct op *op)
{
    switch (op->kind) {
    case OP_MSIX_CHECK:
        return op->count != 0; /* asks for each vector through PORT_MSIX_SEND */
    case OP_MSIX_LATENCY:
    case OP_VIRTIO_RR:
    case OP_VIRTIO_RESET:
    case OP_VIRTIO_MASK_PENDING:
    case OP_HOSTILE:
    case OP_IOMMU_REPORT: /* the report lands where only exitless reads it */
        return 1;
    default:
        return 0;
    }
}

static void run_op(const struct op *op, struct op_result *res)
{
    u64 method = resolve_method(op->method);
    u64 sink = 0;
    res->method_used = method;
    res->status = STATUS_OK;
    res->value = res->irqs = res->stray_irqs = res->bytes = res->resets = res->cycles = 0;
    if (under_qemu && needs_exitless(op)) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    op_start = rdtsc();
    switch (op->kind) {
    case OP_CFG_READ:
        if (!method_can_reach(method, op->address, op->size)) {
            res->status = STATUS_UNSUPPORTED;
            break;
        }
        res->value = cfg_read(method, op->address, op->size);
        break;
    case OP_CFG_WRITE:
        if (!method_can_reach(method, op->address, op->size)) {
            res->status = STATUS_UNSUPPORTED;
            break;
        }
        cfg_write(method, op->address, op->size, (u32)op->value);
        break;
    case OP_CFG_READ_LOOP:
        if (!method_can_reach(method, op->address, 4)) {
            res->status = STATUS_UNSUPPORTED;
            break;
        }
        sink = cfg_read(method, op->address, 4); /* warm-up: first touch of a page faults */
        op_start = rdtsc();
        for (u64 i = 0; i < op->count; i++)
            sink += cfg_read(method, op->address, 4);
        res->value = sink;
        break;
    case OP_RAM_READ_LOOP:
        sink = mem_read(RAM_SCRATCH_ADDR, 4); /* warm-up, as above */
        op_start = rdtsc();
        for (u64 i = 0; i < op->count; i++)
            sink += mem_read(RAM_SCRATCH_ADDR, 4);
        res->value = sink;
        break;
    case OP_ENUMERATE:
        if (method == METHOD_ECAM && !ecam_described()) {
            res->status = STATUS_UNSUPPORTED;
            break;
        }
        res->value = enumerate(method);
        break;
    case OP_MMIO_READ:
    case OP_MMIO_WRITE:
        if (op->size != 1 && op->size != 2 && op->size != 4 && op->size != 8) {
            res->status = STATUS_UNSUPPORTED;
            break;
        }
        if (op->kind == OP_MMIO_READ)
            res->value = mem_read(op->address, op->size);
        else
            mem_write(op->address, op->size, op->value);
        break;
    case OP_VIRTIO_INIT:
        res->status = virtio_init(op->method, op->address, op->value, op->size);
        break;
    case OP_VIRTIO_RR:
        virtio_rr(op, res);
        break;
    case OP_ICMP_ECHO:
        icmp_echo(op, res);
        break;
    case OP_VIRTIO_RESET:
        if (!dev.ready) {
            res->status = STATUS_UNSUPPORTED;
            break;
        }
        send_request(32, 0); /* in flight when the reset comes */
        res->status = virtio_init(dev.transport, dev.address, dev.flags, dev.stream_payload);
        break;
    case OP_VIRTIO_MASK_PENDING:
        virtio_mask_pending(op, res);
        break;
    case OP_MSIX_PROGRAM:
    case OP_MSIX_CONTROL:
    case OP_MSIX_MASK_EACH:
    case OP_MSIX_RETARGET:
    case OP_MSIX_CHECK:
    case OP_MSIX_LATENCY:
        msix_op(op, res);
        break;
    case OP_HOSTILE:
        hostile_burst(op, res);
        break;
    case OP_IOMMU_MODE:
        vtd_set_mode(op, res);
        break;
    case OP_NET_STREAM:
        net_stream(op, res);
        break;
    case OP_IOMMU_REPORT:
        vtd_report(op, res);
        break;
    case OP_IOMMU_INTREMAP:
        vtd_intremap(op, res);
        break;
    default:
        res->status = STATUS_BAD_OP;
        break;
    }
    res->cycles = rdtsc() - op_start;
}
