/* virtio-mmio (virtio 1.2 §4.2.2) on its interrupt line, routed through the IOAPIC; exitless's
 * per-queue doorbells when RR_FLAG_DOORBELLS asks for them. The MSI extension builds on this
 * (virtio_mmio_msi.c). Builds on virtio.c and irq.c. */

static u64 mmio_locate(u64 index)
{
    if (index >= boot->virtio_mmio_count)
        return STATUS_UNSUPPORTED;
    dev.mmio = boot->virtio_mmio_base[index];
    dev.gsi = boot->virtio_mmio_gsi[index];
    dev.devcfg = dev.mmio + VIRTIO_MMIO_CONFIG;
    if (mem_read(dev.mmio + VIRTIO_MMIO_MAGIC_VALUE, 4) != VIRTIO_MMIO_MAGIC ||
        mem_read(dev.mmio + VIRTIO_MMIO_VERSION, 4) != 2 ||
        mem_read(dev.mmio + VIRTIO_MMIO_DEVICE_ID, 4) != VIRTIO_ID_NET)
        return STATUS_DEVICE_ERROR;
    return STATUS_OK;
}

static void mmio_set_status(u32 s) { mem_write(dev.mmio + VIRTIO_MMIO_STATUS, 4, s); }
static u32 mmio_get_status(void) { return (u32)mem_read(dev.mmio + VIRTIO_MMIO_STATUS, 4); }

static u32 mmio_device_features(u32 sel)
{
    mem_write(dev.mmio + VIRTIO_MMIO_DEVICE_FEATURES_SEL, 4, sel);
    return (u32)mem_read(dev.mmio + VIRTIO_MMIO_DEVICE_FEATURES, 4);
}

static void mmio_driver_features(u32 sel, u32 w)
{
    mem_write(dev.mmio + VIRTIO_MMIO_DRIVER_FEATURES_SEL, 4, sel);
    mem_write(dev.mmio + VIRTIO_MMIO_DRIVER_FEATURES, 4, w);
}

static u64 mmio_legacy_features(void)
{
    return (dev.flags & RR_FLAG_DOORBELLS) ? 1ull << VIRTIO_F_MMIO_NOTIFY : 0;
}


/* The line: its handler (entry.S) reads InterruptStatus and writes InterruptACK. */
static void mmio_legacy_interrupts(void)
{
    legacy_mmio_base = dev.mmio;
    ioapic_set(dev.gsi, vtd_ir_rte((u32)IRQ_VECTOR_LEGACY));
    dev.rx_vector = (u32)IRQ_VECTOR_LEGACY;
}
static u16 mmio_queue_select(u16 index)
{
    mem_write(dev.mmio + VIRTIO_MMIO_QUEUE_SEL, 4, index);
    return (u16)mem_read(dev.mmio + VIRTIO_MMIO_QUEUE_NUM_MAX, 4);
}

static int mmio_legacy_queue_enable(struct vq *q, const u64 addr[3])
{
    u64 b = dev.mmio;
    mem_write(b + VIRTIO_MMIO_QUEUE_NUM, 4, q->size);
    for (int i = 0; i < 3; i++) {
        mem_write(b + VIRTIO_MMIO_QUEUE_DESC_LOW + 0x10 * (u64)i, 4, (u32)addr[i]);
        mem_write(b + VIRTIO_MMIO_QUEUE_DESC_HIGH + 0x10 * (u64)i, 4, (u32)(addr[i] >> 32));
    }
    q->notify = (dev.flags & RR_FLAG_DOORBELLS)
                    ? b + mem_read(b + VIRTIO_MMIO_QUEUE_NOTIFY_OFF, 4)
                    : b + VIRTIO_MMIO_QUEUE_NOTIFY;
    mem_write(b + VIRTIO_MMIO_QUEUE_READY, 4, 1);
    return mem_read(b + VIRTIO_MMIO_QUEUE_READY, 4) == 1;
}


static void mmio_notify(const struct vq *q) { mem_write(q->notify, 4, q->index); }

static const struct transport_ops mmio_legacy_ops = {
    .locate = mmio_locate,
    .set_status = mmio_set_status,
    .get_status = mmio_get_status,
    .device_features = mmio_device_features,
    .driver_features = mmio_driver_features,
    .features = mmio_legacy_features,
    .setup_interrupts = mmio_legacy_interrupts,
    .queue_select = mmio_queue_select,
    .queue_enable = mmio_legacy_queue_enable,
    .notify = mmio_notify,
    .msi_mask = 0,
    .msi_pending = 0,
};
