/* The hostile burst (OP_HOSTILE): what an untrusted guest may do to every device.
 *
 * Random accesses of every width at any offset and value, from a seed, into every device
 * window, config space by both mechanisms, BAR moves, decode and bus-master toggles, resets
 * with requests in flight, random descriptor chains and random MSI messages. The probe must
 * survive its own attack to report on it, so two kinds of value are tamed, and only where a
 * device would act on them: registers that hold a DMA address (ring addresses, descriptor
 * buffers) point into HOSTILE_DMA_ADDR's area, straddle the end of RAM or lie outside RAM,
 * never at the probe's code, stacks or tables; MSI data never names an exception vector or a
 * delivery mode that takes the vCPU away (SMI, NMI, INIT). Every other value is raw.
 *
 * Builds on pci.c and virtio_net.c (the driven device). */

static u64 rng_state;

static u64 rnd(void) /* xorshift64* */
{
    u64 x = rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545f4914f6cdd1dull;
}

static u64 below(u64 n) { return rnd() % n; }

/* MSI data the probe survives: vector 0x20 or above (0..31 are exceptions, which end the
 * run), and not SMI (2), NMI (4) or INIT (5); the reserved modes and ExtINT stay, for the
 * VMM to drop. */
static u32 msi_safe(u32 d)
{
    u32 mode = (d >> MSI_DATA_DELIVERY_MODE_SHIFT) & 7;
    if (mode == MSI_DELIVERY_SMI)
        d ^= 1u << MSI_DATA_DELIVERY_MODE_SHIFT;    /* → reserved 3 */
    else if (mode == MSI_DELIVERY_NMI || mode == MSI_DELIVERY_INIT)
        d ^= 2u << MSI_DATA_DELIVERY_MODE_SHIFT;    /* → reserved 6, ExtINT 7 */
    if ((d & 0xff) < 0x20)
        d |= 0x20;
    return d;
}

/* A DMA address no device can hurt the probe with; also safe as MSI data. */
static u32 dma_address(void)
{
    u64 a;
    switch (below(4)) {
    case 0:
        a = HOSTILE_DMA_ADDR + HOSTILE_DMA_SIZE - below(0x100); /* straddles the end of RAM */
        break;
    case 1:
        a = HOSTILE_OUTSIDE_RAM + below(0x100000000ull - HOSTILE_OUTSIDE_RAM);
        break;
    default:
        a = HOSTILE_DMA_ADDR + below(HOSTILE_DMA_SIZE);
        break;
    }
    return msi_safe((u32)a);
}

enum { TAME_NONE, TAME_DMA, TAME_MSI };

static int overlaps(u64 off, u64 size, u64 reg) { return off < reg + 4 && reg < off + size; }

#define HOSTILE_MAX_PCI 8

/* A virtio-pci function as firmware left it: restored after every burst. */
struct hostile_fn {
    u64 fn;                      /* ECAM-style address */
    u32 bars[6], command, msix_control;
    u64 bar0;
    u64 common, msix_table;      /* offsets in BAR 0 */
    u64 msix_entries, pci_cfg;   /* pci_cfg: the capability's config offset */
};

static struct hostile_fn hostile_fns[HOSTILE_MAX_PCI];
static u64 hostile_fn_count;
static int hostile_found;

/* The register a write of `size` bytes at `off` of a virtio-mmio window would change that
 * must be tamed, if any. */
static int mmio_tamed(u64 off, u64 size, u64 *reg)
{
    static const u32 dma[] = {VIRTIO_MMIO_QUEUE_DESC_LOW, VIRTIO_MMIO_QUEUE_AVAIL_LOW,
                              VIRTIO_MMIO_QUEUE_USED_LOW};
    for (int i = 0; i < 3; i++)
        if (overlaps(off, size, dma[i]))
            return *reg = dma[i], TAME_DMA;
    if (overlaps(off, size, VIRTIO_MMIO_MSI_DATA))
        return *reg = VIRTIO_MMIO_MSI_DATA, TAME_MSI;
    return TAME_NONE;
}

/* The same for BAR 0 of a virtio-pci function: ring addresses and MSI-X message data. */
static int pci_tamed(const struct hostile_fn *f, u64 off, u64 size, u64 *reg)
{
    static const u32 dma[] = {VIRTIO_PCI_COMMON_Q_DESCLO, VIRTIO_PCI_COMMON_Q_AVAILLO,
                              VIRTIO_PCI_COMMON_Q_USEDLO};
    for (int i = 0; i < 3; i++)
        if (overlaps(off, size, f->common + dma[i]))
            return *reg = f->common + dma[i], TAME_DMA;
    u64 end = f->msix_table + f->msix_entries * PCI_MSIX_ENTRY_SIZE;
    for (u64 e = f->msix_table; e < end; e += PCI_MSIX_ENTRY_SIZE)
        if (overlaps(off, size, e + PCI_MSIX_ENTRY_DATA))
            return *reg = e + PCI_MSIX_ENTRY_DATA, TAME_MSI;
    return TAME_NONE;
}

static u64 random_value(u64 size)
{
    u64 v = rnd();
    switch (below(4)) { /* small values and all-ones reach more register semantics */
    case 0: v &= 0xff; break;
    case 1: v = ~0ull; break;
    default: break;
    }
    return size == 8 ? v : v & ((1ull << (8 * size)) - 1);
}

static u64 random_width(void) { return 1ull << below(4); }

/* One write into a device window, tamed where `tame` says. */
static void window_write(u64 base, u64 off, u64 size, int tame, u64 reg)
{
    if (tame == TAME_NONE)
        mem_write(base + off, size, random_value(size));
    else
        mem_write(base + reg, 4, tame == TAME_DMA ? dma_address() : msi_safe((u32)rnd()));
}

/* Find the virtio-pci functions on bus 0 and remember what firmware assigned them. */
static void hostile_find(void)
{
    u64 m = resolve_method(METHOD_AUTO);
    hostile_found = 1;
    for (u64 d = 0; d < 32 && hostile_fn_count < HOSTILE_MAX_PCI; d++) {
        u64 fn = d << ECAM_DEVICE_SHIFT;
        if (cfg_read(m, fn + PCI_VENDOR_ID, 2) != VIRTIO_PCI_VENDOR_ID)
            continue;
        struct hostile_fn *f = &hostile_fns[hostile_fn_count++];
        f->fn = fn;
        for (u32 i = 0; i < 6; i++)
            f->bars[i] = cfg_read(m, fn + PCI_BAR0 + 4 * i, 4);
        f->command = cfg_read(m, fn + PCI_COMMAND, 2) | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
        f->bar0 = pci_bar(fn, 0);
        u32 ptr = cfg_read(m, fn + PCI_CAPABILITY_LIST, 1) & 0xfc;
        for (int n = 0; ptr >= 0x40 && n < 48; n++) {
            u64 cap = fn + ptr;
            u32 id = cfg_read(m, cap, 1);
            if (id == PCI_CAP_ID_VNDR) {
                u32 type = cfg_read(m, cap + VIRTIO_PCI_CAP_CFG_TYPE, 1);
                if (type == VIRTIO_PCI_CAP_COMMON_CFG)
                    f->common = cfg_read(m, cap + VIRTIO_PCI_CAP_OFFSET, 4);
                else if (type == VIRTIO_PCI_CAP_PCI_CFG)
                    f->pci_cfg = ptr;
            } else if (id == PCI_CAP_ID_MSIX) {
                f->msix_table = cfg_read(m, cap + PCI_MSIX_TABLE, 4) & ~PCI_MSIX_BIR_MASK;
                f->msix_control = ptr + PCI_MSIX_FLAGS;
                f->msix_entries = (cfg_read(m, cap + PCI_MSIX_FLAGS, 2) & PCI_MSIX_FLAGS_QSIZE) + 1;
            }
            ptr = cfg_read(m, cap + 1, 1) & 0xfc;
        }
    }
}

/* Put every virtio-pci function back as firmware left it, as a driver's probe expects:
 * BARs, decode and bus mastering, MSI-X enabled with the function unmasked. */
static void hostile_restore(void)
{
    u64 m = resolve_method(METHOD_AUTO);
    for (u64 k = 0; k < hostile_fn_count; k++) {
        const struct hostile_fn *f = &hostile_fns[k];
        for (u32 i = 0; i < 6; i++)
            cfg_write(m, f->fn + PCI_BAR0 + 4 * i, 4, f->bars[i]);
        cfg_write(m, f->fn + PCI_COMMAND, 2, f->command);
        cfg_write(m, f->fn + f->msix_control, 2, PCI_MSIX_FLAGS_ENABLE);
    }
}

/* A random write or read of any width at any offset of a random device window. */
static void hostile_window(void)
{
    u64 n = boot->virtio_mmio_count + hostile_fn_count;
    if (n == 0)
        return;
    u64 pick = below(n), size = random_width(), reg = 0;
    int write = below(2);
    if (pick < boot->virtio_mmio_count) {
        u64 base = boot->virtio_mmio_base[pick], off = below(VIRTIO_MMIO_WINDOW_SIZE);
        if (write)
            window_write(base, off, size, mmio_tamed(off, size, &reg), reg);
        else
            mem_read(base + off, size);
        return;
    }
    const struct hostile_fn *f = &hostile_fns[pick - boot->virtio_mmio_count];
    u64 off = below(VIRTIO_PCI_BAR_SIZE);
    if (write)
        window_write(f->bar0, off, size, pci_tamed(f, off, size, &reg), reg);
    else
        mem_read(f->bar0 + off, size);
}

/* A random config access by either mechanism to a virtio function, the host bridge or a
 * function that is not there. Writes into a pci_cfg capability go through hostile_pci_cfg,
 * which tames what the window reaches. */
static void hostile_config(void)
{
    u64 fn;
    switch (below(4)) {
    case 0: fn = 0; break; /* the host bridge */
    case 1: fn = below(256) << ECAM_FUNCTION_SHIFT; break;
    default: fn = hostile_fn_count ? hostile_fns[below(hostile_fn_count)].fn : 0; break;
    }
    u64 size = 1ull << below(3), write = below(2);
    if (ecam_described() && below(2)) {
        u64 off = below(PCI_CFG_SPACE_EXP_SIZE); /* any alignment: accesses may straddle */
        for (u64 k = 0; k < hostile_fn_count; k++) {
            const struct hostile_fn *f = &hostile_fns[k];
            if (write && f->fn == fn && f->pci_cfg && off < f->pci_cfg + 20 && f->pci_cfg < off + size)
                write = 0;
        }
        u64 at = ecam_address(fn) + off;
        if (write)
            mem_write(at, size, random_value(size));
        else
            mem_read(at, size);
        return;
    }
    /* Mechanism #1 with a raw CONFIG_ADDRESS: enable bit, reserved bits, any register. */
    u32 address = (u32)rnd();
    u64 reg = address & 0xfc;
    for (u64 k = 0; k < hostile_fn_count; k++) {
        const struct hostile_fn *f = &hostile_fns[k];
        if (((address >> 8) & 0xffff) == (f->fn >> ECAM_FUNCTION_SHIFT) && f->pci_cfg &&
            reg + 4 > f->pci_cfg && reg < f->pci_cfg + 20)
            write = 0;
    }
    outl(PCI_CONFIG_ADDRESS_PORT, address);
    u16 port = (u16)(PCI_CONFIG_DATA_PORT + below(4));
    u32 v = (u32)rnd();
    switch (size | write << 4) {
    case 1: inb(port); break;
    case 2: inw(port); break;
    case 4: inl(port); break;
    case 0x11: outb(port, (u8)v); break;
    case 0x12: outw(port, (u16)v); break;
    default: outl(port, v); break;
    }
}

/* The pci_cfg window (virtio 1.2 §4.1.4.9): point it anywhere in BAR 0, then read or write
 * through it, tamed as a direct write would be. */
static void hostile_pci_cfg(const struct hostile_fn *f)
{
    u64 m = resolve_method(METHOD_AUTO), reg = 0;
    u64 size = 1ull << below(3), off = below(VIRTIO_PCI_BAR_SIZE);
    int tame = pci_tamed(f, off, size, &reg);
    if (tame != TAME_NONE)
        off = reg, size = 4;
    u64 cap = f->fn + f->pci_cfg;
    cfg_write(m, cap + VIRTIO_PCI_CAP_BAR, 1, below(8) ? 0 : (u32)below(256));
    cfg_write(m, cap + VIRTIO_PCI_CAP_OFFSET, 4, (u32)off);
    cfg_write(m, cap + VIRTIO_PCI_CAP_LENGTH, 4, below(8) ? (u32)size : (u32)rnd());
    u32 v = tame == TAME_DMA ? dma_address() : tame == TAME_MSI ? msi_safe((u32)rnd()) : (u32)rnd();
    if (below(2))
        cfg_write(m, cap + VIRTIO_PCI_CAP_PCI_CFG_DATA, 4, v);
    else
        cfg_read(m, cap + VIRTIO_PCI_CAP_PCI_CFG_DATA, 4);
}

/* Move BAR 0 of a function over another's, over RAM, over the ECAM window, over a
 * virtio-mmio window, or anywhere; or toggle its decode and bus mastering. */
static void hostile_bar(const struct hostile_fn *f)
{
    u64 m = resolve_method(METHOD_AUTO);
    if (below(2)) {
        cfg_write(m, f->fn + PCI_COMMAND, 2, (u32)rnd());
        return;
    }
    u64 to;
    switch (below(5)) {
    case 0: to = hostile_fns[below(hostile_fn_count)].bar0; break;
    case 1: to = below(HOSTILE_DMA_ADDR + HOSTILE_DMA_SIZE); break;
    case 2: to = boot->ecam_base; break;
    case 3: to = boot->virtio_mmio_count ? boot->virtio_mmio_base[0] : 0; break;
    default: to = rnd(); break;
    }
    cfg_write(m, f->fn + PCI_BAR0, 4, (u32)to);
    if ((f->bars[0] & 6) == 4)
        cfg_write(m, f->fn + PCI_BAR0 + 4, 4, (u32)(to >> 32));
}

/* The driven device (the last OP_VIRTIO_INIT): random chains on its rings, a reset or a bus
 * master change with a request in flight, or a doorbell with any value. */
static void hostile_device(struct op_result *res)
{
    if (!dev.ready)
        return;
    switch (below(4)) {
    case 0: {
        struct vq *q = below(2) ? &dev.rx : &dev.tx;
        for (u64 i = below(q->size) + 1; i; i--) {
            u16 slot = (u16)below(q->size);
            q->desc[slot].addr = below(8) ? dma_address() : rnd();
            q->desc[slot].len = (u32)(below(2) ? below(0x2000) : rnd());
            q->desc[slot].flags = (u16)rnd();
            q->desc[slot].next = (u16)(below(4) ? below(q->size) : rnd());
            q->avail[2 + below(q->size)] = (u16)(below(4) ? slot : rnd());
        }
        q->avail[1] = (u16)(q->avail[1] + below(2 * q->size));
        mfence();
        dev.ops->notify(q);
        break;
    }
    case 1:
        send_request(32, rnd());
        dev.ops->set_status(0);
        res->resets++;
        dev.ready = 0;
        break;
    case 2:
        if (dev.transport == TRANSPORT_PCI) {
            u64 m = resolve_method(METHOD_AUTO);
            u32 cmd = cfg_read(m, dev.address + PCI_COMMAND, 2);
            send_request(32, rnd());
            cfg_write(m, dev.address + PCI_COMMAND, 2, cmd & ~PCI_COMMAND_MASTER);
            dev.ops->notify(&dev.tx);
            if (below(2))
                cfg_write(m, dev.address + PCI_COMMAND, 2, cmd);
        }
        break;
    default:
        mem_write(below(2) ? dev.rx.notify : dev.tx.notify, random_width(), random_value(8));
        break;
    }
}

/* A random MSI message in a random vector of any device. */
static void hostile_msi(void)
{
    u64 n = boot->virtio_mmio_count + hostile_fn_count;
    if (n == 0)
        return;
    u64 pick = below(n);
    u32 lo = below(2) ? (u32)(MSI_ADDRESS_BASE | (rnd() & 0xffff0)) : (u32)rnd();
    u32 hi = below(4) ? 0 : (u32)rnd(), data = msi_safe((u32)rnd());
    if (pick < boot->virtio_mmio_count) {
        u64 base = boot->virtio_mmio_base[pick];
        mem_write(base + VIRTIO_MMIO_MSI_SEL, 4, below(8));
        mem_write(base + VIRTIO_MMIO_MSI_ADDRESS_LOW, 4, lo);
        mem_write(base + VIRTIO_MMIO_MSI_ADDRESS_HIGH, 4, hi);
        mem_write(base + VIRTIO_MMIO_MSI_DATA, 4, data);
        mem_write(base + VIRTIO_MMIO_MSI_COMMAND, 4, 1 + below(3));
        if (below(2))
            mem_write(base + VIRTIO_MMIO_MSI_CONTROL, 4, (u32)below(2));
        return;
    }
    const struct hostile_fn *f = &hostile_fns[pick - boot->virtio_mmio_count];
    u64 e = f->bar0 + f->msix_table + below(f->msix_entries) * PCI_MSIX_ENTRY_SIZE;
    mem_write(e + PCI_MSIX_ENTRY_LOWER_ADDR, 4, lo);
    mem_write(e + PCI_MSIX_ENTRY_UPPER_ADDR, 4, hi);
    mem_write(e + PCI_MSIX_ENTRY_DATA, 4, data);
    mem_write(e + PCI_MSIX_ENTRY_VECTOR_CTRL, 4, (u32)below(2));
}

static void hostile_burst(const struct op *op, struct op_result *res)
{
    if (!hostile_found)
        hostile_find();
    rng_state = op->value * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull; /* never 0 for xorshift */
    if (!rng_state)
        rng_state = 1;
    u64 irqs_before = 0;
    for (u32 v = 0x20; v < 256; v++)
        irqs_before += irq_counts[v];
    res->resets = 0;
    for (u64 i = 0; i < op->count; i++) {
        const struct hostile_fn *f = hostile_fn_count ? &hostile_fns[below(hostile_fn_count)] : 0;
        switch (below(16)) {
        case 0: case 1: case 2: case 3: case 4: case 5:
            hostile_window();
            break;
        case 6: case 7: case 8:
            hostile_config();
            break;
        case 9:
            if (f && f->pci_cfg)
                hostile_pci_cfg(f);
            break;
        case 10:
            if (f)
                hostile_bar(f);
            break;
        case 11: case 12:
            hostile_device(res);
            break;
        case 13:
            hostile_msi();
            break;
        default: /* a device reset through its status register */
            if (boot->virtio_mmio_count && below(2)) {
                mem_write(boot->virtio_mmio_base[below(boot->virtio_mmio_count)] + VIRTIO_MMIO_STATUS, 4, 0);
                res->resets++;
            } else if (f) {
                mem_write(f->bar0 + f->common + VIRTIO_PCI_COMMON_STATUS, 1, 0);
                res->resets++;
            }
            break;
        }
        res->value++;
    }
    dev.ready = 0; /* whatever the burst did, the next op brings the devices up again */
    hostile_restore();
    for (u32 v = 0x20; v < 256; v++)
        res->irqs += irq_counts[v];
    res->irqs -= irqs_before;
}
