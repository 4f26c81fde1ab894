/* virtio-mmio with exitless's MSI extension (docs/virtio-mmio-msi.md): a vector per queue and
 * one for configuration changes, programmed through the MSI registers, the line masked. What
 * is not about interrupts is the legacy transport's. Builds on virtio_mmio.c. */

static u64 mmio_msi_features(void) { return mmio_legacy_features() | 1ull << VIRTIO_F_MMIO_MSI; }

static void mmio_msi_program(u32 k, u32 vector)
{
    u64 b = dev.mmio;
    u32 lo, data;
    vtd_ir_message(vector, &lo, &data);
    mem_write(b + VIRTIO_MMIO_MSI_SEL, 4, k);
    mem_write(b + VIRTIO_MMIO_MSI_ADDRESS_LOW, 4, lo);
    mem_write(b + VIRTIO_MMIO_MSI_ADDRESS_HIGH, 4, 0);
    mem_write(b + VIRTIO_MMIO_MSI_DATA, 4, data);
    mem_write(b + VIRTIO_MMIO_MSI_COMMAND, 4, VIRTIO_MMIO_MSI_CMD_UPDATE);
    mem_write(b + VIRTIO_MMIO_MSI_COMMAND, 4, VIRTIO_MMIO_MSI_CMD_UNMASK);
}

static void mmio_msi_interrupts(void)
{
    program_vectors(mmio_msi_program);
    mem_write(dev.mmio + VIRTIO_MMIO_CONFIG_MSI_VEC, 4, 2);
    mem_write(dev.mmio + VIRTIO_MMIO_MSI_CONTROL, 4, VIRTIO_MMIO_MSI_CTRL_ENABLE);
    ioapic_set(dev.gsi, 0); /* the line stays quiet */
}

/* As on the line, with the queue's MSI vector (its index) associated first. */
static int mmio_msi_queue_enable(struct vq *q, const u64 addr[3])
{
    mem_write(dev.mmio + VIRTIO_MMIO_QUEUE_MSI_VEC, 4, q->index);
    if (mem_read(dev.mmio + VIRTIO_MMIO_QUEUE_MSI_VEC, 4) != q->index)
        return 0;
    return mmio_legacy_queue_enable(q, addr);
}

static void mmio_msi_mask(u32 k, int masked)
{
    mem_write(dev.mmio + VIRTIO_MMIO_MSI_SEL, 4, k);
    mem_write(dev.mmio + VIRTIO_MMIO_MSI_COMMAND, 4,
              masked ? VIRTIO_MMIO_MSI_CMD_MASK : VIRTIO_MMIO_MSI_CMD_UNMASK);
}

static int mmio_msi_pending(u32 k)
{
    mem_write(dev.mmio + VIRTIO_MMIO_MSI_SEL, 4, k);
    return (mem_read(dev.mmio + VIRTIO_MMIO_MSI_STATE, 4) & VIRTIO_MMIO_MSI_STATE_PENDING) != 0;
}

static const struct transport_ops mmio_msi_ops = {
    .locate = mmio_locate,
    .set_status = mmio_set_status,
    .get_status = mmio_get_status,
    .device_features = mmio_device_features,
    .driver_features = mmio_driver_features,
    .features = mmio_msi_features,
    .setup_interrupts = mmio_msi_interrupts,
    .queue_select = mmio_queue_select,
    .queue_enable = mmio_msi_queue_enable,
    .notify = mmio_notify,
    .msi_mask = mmio_msi_mask,
    .msi_pending = mmio_msi_pending,
};
