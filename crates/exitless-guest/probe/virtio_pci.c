/* virtio-pci (virtio 1.2 §4.1) with MSI-X: the virtio structures found through the vendor
 * capabilities, in whichever BARs they name; a vector per queue. Builds on pci.c and
 * virtio.c. */

/* A virtio network card: modern (virtio 1.2 §4.1.2.1) or transitional (§4.1.2.3, QEMU's). */
static int pci_is_virtio_net(u64 m, u64 fn)
{
    if (cfg_read(m, fn + PCI_VENDOR_ID, 2) != VIRTIO_PCI_VENDOR_ID)
        return 0;
    u32 device = cfg_read(m, fn + PCI_DEVICE_ID, 2);
    return device == VIRTIO_PCI_DEVICE_ID_BASE + VIRTIO_ID_NET ||
           (device == VIRTIO_PCI_TRANSITIONAL_NET_ID &&
            cfg_read(m, fn + PCI_SUBSYSTEM_ID, 2) == VIRTIO_ID_NET);
}

/* Find the virtio structures and MSI-X table of the function at `fn` (virtio 1.2 §4.1.4),
 * each in the BAR its capability names: exitless puts all in BAR 0, QEMU its MSI-X table in
 * BAR 1 and the virtio structures in BAR 4 (BAR 0 is its legacy I/O). */
static u64 pci_locate(u64 fn)
{
    u64 m = resolve_method(METHOD_AUTO);
    if (!pci_is_virtio_net(m, fn))
        return STATUS_DEVICE_ERROR;
    pci_enable_master(fn);
    dev.common = dev.msix_table = dev.notify_base = dev.devcfg = 0;
    u32 ptr = cfg_read(m, fn + PCI_CAPABILITY_LIST, 1) & 0xfc;
    for (int n = 0; ptr >= 0x40 && n < 48; n++) {
        u64 cap = fn + ptr;
        u32 id = cfg_read(m, cap, 1);
        /* Each structure names its BAR, 0 to 5, others reserved (virtio 1.2 §4.1.4):
         * exitless's are all in BAR 0, QEMU's in BAR 4. */
        u32 bar = cfg_read(m, cap + VIRTIO_PCI_CAP_BAR, 1);
        if (id == PCI_CAP_ID_VNDR && bar <= 5) {
            u64 at = pci_bar(fn, bar) + cfg_read(m, cap + VIRTIO_PCI_CAP_OFFSET, 4);
            switch (cfg_read(m, cap + VIRTIO_PCI_CAP_CFG_TYPE, 1)) {
            case VIRTIO_PCI_CAP_COMMON_CFG: dev.common = at; break;
            case VIRTIO_PCI_CAP_ISR_CFG: dev.isr = at; break;
            case VIRTIO_PCI_CAP_DEVICE_CFG: dev.devcfg = at; break;
            case VIRTIO_PCI_CAP_NOTIFY_CFG:
                dev.notify_base = at;
                dev.notify_mult = cfg_read(m, cap + VIRTIO_PCI_NOTIFY_CAP_MULT, 4);
                break;
            }
        } else if (id == PCI_CAP_ID_MSIX) {
            u32 table = cfg_read(m, cap + PCI_MSIX_TABLE, 4), pba = cfg_read(m, cap + PCI_MSIX_PBA, 4);
            if ((table & PCI_MSIX_BIR_MASK) > 5 || (pba & PCI_MSIX_BIR_MASK) > 5)
                break; /* a reserved BIR (PCI 3.0 §6.8.2.4): no usable table */
            dev.msix_table = pci_bar(fn, table & PCI_MSIX_BIR_MASK) + (table & ~PCI_MSIX_BIR_MASK);
            dev.msix_pba = pci_bar(fn, pba & PCI_MSIX_BIR_MASK) + (pba & ~PCI_MSIX_BIR_MASK);
            u32 control = cfg_read(m, cap + PCI_MSIX_FLAGS, 2);
            cfg_write(m, cap + PCI_MSIX_FLAGS, 2, control | PCI_MSIX_FLAGS_ENABLE);
        }
        ptr = cfg_read(m, cap + 1, 1) & 0xfc;
    }
    return dev.common && dev.msix_table && dev.notify_base ? STATUS_OK : STATUS_DEVICE_ERROR;
}

static void pci_set_status(u32 s) { mem_write(dev.common + VIRTIO_PCI_COMMON_STATUS, 1, s); }
static u32 pci_get_status(void) { return (u32)mem_read(dev.common + VIRTIO_PCI_COMMON_STATUS, 1); }

static u32 pci_device_features(u32 sel)
{
    mem_write(dev.common + VIRTIO_PCI_COMMON_DFSELECT, 4, sel);
    return (u32)mem_read(dev.common + VIRTIO_PCI_COMMON_DF, 4);
}

static void pci_driver_features(u32 sel, u32 w)
{
    mem_write(dev.common + VIRTIO_PCI_COMMON_GFSELECT, 4, sel);
    mem_write(dev.common + VIRTIO_PCI_COMMON_GF, 4, w);
}

static u64 pci_features(void) { return 0; }

static void pci_msix_program(u32 k, u32 vector)
{
    u64 e = dev.msix_table + (u64)k * PCI_MSIX_ENTRY_SIZE;
    u32 lo, data;
    vtd_ir_message(vector, &lo, &data);
    mem_write(e + PCI_MSIX_ENTRY_LOWER_ADDR, 4, lo);
    mem_write(e + PCI_MSIX_ENTRY_UPPER_ADDR, 4, 0);
    mem_write(e + PCI_MSIX_ENTRY_DATA, 4, data);
    mem_write(e + PCI_MSIX_ENTRY_VECTOR_CTRL, 4, 0);
}

static void pci_interrupts(void)
{
    program_vectors(pci_msix_program);
    mem_write(dev.common + VIRTIO_PCI_COMMON_MSIX, 2, 2);
}

static u16 pci_queue_select(u16 index)
{
    mem_write(dev.common + VIRTIO_PCI_COMMON_Q_SELECT, 2, index);
    return (u16)mem_read(dev.common + VIRTIO_PCI_COMMON_Q_SIZE, 2);
}

static int pci_queue_enable(struct vq *q, const u64 addr[3])
{
    u64 c = dev.common;
    mem_write(c + VIRTIO_PCI_COMMON_Q_SIZE, 2, q->size);
    for (int i = 0; i < 3; i++) {
        mem_write(c + VIRTIO_PCI_COMMON_Q_DESCLO + 8 * (u64)i, 4, (u32)addr[i]);
        mem_write(c + VIRTIO_PCI_COMMON_Q_DESCHI + 8 * (u64)i, 4, (u32)(addr[i] >> 32));
    }
    mem_write(c + VIRTIO_PCI_COMMON_Q_MSIX, 2, q->index);
    if (mem_read(c + VIRTIO_PCI_COMMON_Q_MSIX, 2) != q->index)
        return 0;
    q->notify = dev.notify_base + mem_read(c + VIRTIO_PCI_COMMON_Q_NOFF, 2) * dev.notify_mult;
    mem_write(c + VIRTIO_PCI_COMMON_Q_ENABLE, 2, 1);
    return mem_read(c + VIRTIO_PCI_COMMON_Q_ENABLE, 2) == 1;
}

static void pci_notify(const struct vq *q) { mem_write(q->notify, 2, q->index); }

static void pci_msix_mask(u32 k, int masked)
{
    mem_write(dev.msix_table + (u64)k * PCI_MSIX_ENTRY_SIZE + PCI_MSIX_ENTRY_VECTOR_CTRL, 4,
              masked ? PCI_MSIX_ENTRY_CTRL_MASKBIT : 0);
}

static int pci_msix_pending(u32 k)
{
    return (mem_read(dev.msix_pba + 4 * (k / 32), 4) >> (k % 32)) & 1;
}

static const struct transport_ops pci_msix_ops = {
    .locate = pci_locate,
    .set_status = pci_set_status,
    .get_status = pci_get_status,
    .device_features = pci_device_features,
    .driver_features = pci_driver_features,
    .features = pci_features,
    .setup_interrupts = pci_interrupts,
    .queue_select = pci_queue_select,
    .queue_enable = pci_queue_enable,
    .notify = pci_notify,
    .msi_mask = pci_msix_mask,
    .msi_pending = pci_msix_pending,
};

