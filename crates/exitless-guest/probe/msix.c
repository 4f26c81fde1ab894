/* MSI-X on any PCI function (PCI 3.0 §6.8.2): program, mask, retarget and check its table, and
 * time the interrupts the VMM sends on request. Builds on pci.c and irq.c. */

#define MSIX_MAX_ENTRIES 2048

struct msix_fn {
    u64 control;          /* config address of Message Control */
    u64 table, pba;       /* guest-physical */
    u32 entries;
};

/* What the last check (or program) left: interrupt counts and pending bits. */
static u64 msix_seen[256];
static u8 msix_was_pending[MSIX_MAX_ENTRIES];

static int msix_locate(u64 fn, struct msix_fn *x)
{
    u64 m = resolve_method(METHOD_AUTO);
    if (cfg_read(m, fn + PCI_VENDOR_ID, 2) == 0xffff)
        return 0;
    u32 ptr = cfg_read(m, fn + PCI_CAPABILITY_LIST, 1) & 0xfc;
    for (int n = 0; ptr >= 0x40 && n < 48; n++) {
        u64 cap = fn + ptr;
        if (cfg_read(m, cap, 1) == PCI_CAP_ID_MSIX) {
            u32 table = cfg_read(m, cap + PCI_MSIX_TABLE, 4);
            u32 pba = cfg_read(m, cap + PCI_MSIX_PBA, 4);
            x->control = cap + PCI_MSIX_FLAGS;
            x->entries = (cfg_read(m, x->control, 2) & PCI_MSIX_FLAGS_QSIZE) + 1;
            x->table = pci_bar(fn, table & PCI_MSIX_BIR_MASK) + (table & ~PCI_MSIX_BIR_MASK);
            x->pba = pci_bar(fn, pba & PCI_MSIX_BIR_MASK) + (pba & ~PCI_MSIX_BIR_MASK);
            pci_enable_master(fn);
            return 1;
        }
        ptr = cfg_read(m, cap + 1, 1) & 0xfc;
    }
    return 0;
}

static u64 msix_entry(const struct msix_fn *x, u32 i, u32 field)
{
    return x->table + (u64)i * PCI_MSIX_ENTRY_SIZE + field;
}

static int msix_pending(const struct msix_fn *x, u32 i)
{
    return (mem_read(x->pba + 4 * (i / 32), 4) >> (i % 32)) & 1;
}

static void msix_remember(const struct msix_fn *x)
{
    for (u32 v = 0; v < 256; v++)
        msix_seen[v] = irq_counts[v];
    for (u32 i = 0; i < x->entries; i++)
        msix_was_pending[i] = (u8)msix_pending(x, i);
}

/* Interrupts since `before`, on vector `v` and on all others. */
static void count_since(const u64 *before, u32 v, u64 *on_v, u64 *elsewhere)
{
    *on_v = *elsewhere = 0;
    for (u32 w = 0; w < 256; w++) {
        u64 n = vtd_ir_counted(w) ? irq_counts[w] - before[w] : 0;
        if (w == v)
            *on_v += n;
        else
            *elsewhere += n;
    }
}

static void msix_check(const struct msix_fn *x, const struct op *op, struct op_result *res)
{
    static u32 vector[MSIX_MAX_ENTRIES];
    static u8 live[MSIX_MAX_ENTRIES];
    u64 m = resolve_method(METHOD_AUTO);
    u32 control = cfg_read(m, x->control, 2);
    int fn_live = (control & PCI_MSIX_FLAGS_ENABLE) && !(control & PCI_MSIX_FLAGS_MASKALL);
    u64 expect[256], before[256], start[256], counted = 0;
    for (u32 v = 0; v < 256; v++)
        expect[v] = 0;
    for (u32 i = 0; i < x->entries; i++) {
        u32 lo = (u32)mem_read(msix_entry(x, i, PCI_MSIX_ENTRY_LOWER_ADDR), 4);
        u32 hi = (u32)mem_read(msix_entry(x, i, PCI_MSIX_ENTRY_UPPER_ADDR), 4);
        u32 data = (u32)mem_read(msix_entry(x, i, PCI_MSIX_ENTRY_DATA), 4);
        u32 ctrl = (u32)mem_read(msix_entry(x, i, PCI_MSIX_ENTRY_VECTOR_CTRL), 4);
        /* A message the CPU does not take (256) must be dropped, not sent anywhere; a
         * remappable one arrives where its interrupt remapping entry says. */
        vector[i] = vtd_ir_vector(lo, hi, data);
        live[i] = fn_live && !(ctrl & PCI_MSIX_ENTRY_CTRL_MASKBIT);
        if (live[i] && msix_was_pending[i] && vector[i] < 256)
            expect[vector[i]]++;
    }
    /* Messages left pending at the last check and unmasked since: each arrived once. */
    spin_us(1000);
    u64 wrong = 0;
    for (u32 v = 0; v < 256; v++) {
        u64 got = vtd_ir_counted(v) ? irq_counts[v] - msix_seen[v] : 0;
        res->irqs += got < expect[v] ? got : expect[v];
        if (got > expect[v])
            res->stray_irqs += got - expect[v];
        wrong += got != expect[v];
        start[v] = irq_counts[v];
    }
    /* Then, if asked, one vector at a time: it must arrive on its own IDT vector and nowhere
     * else, or, held back, show its pending bit. */
    for (u32 i = 0; i < x->entries; i++) {
        int ok = 1;
        if (op->count) {
            for (u32 v = 0; v < 256; v++)
                before[v] = irq_counts[v];
            outl(PORT_MSIX_SEND, (u32)op->address | i);
            u64 on_v, elsewhere, deadline = tsc_timeout();
            int expected = live[i] && vector[i] < 256;
            if (expected)
                do
                    count_since(before, vector[i], &on_v, &elsewhere);
                while (on_v == 0 && rdtsc() < deadline);
            else
                spin_us(50);
            count_since(before, vector[i], &on_v, &elsewhere);
            ok = on_v == (u64)expected && elsewhere == 0;
            counted += on_v + elsewhere;
            res->irqs += on_v;
            res->stray_irqs += elsewhere + (on_v > (u64)expected ? on_v - 1 : 0);
            if (!live[i] && !msix_pending(x, i))
                ok = 0;
        }
        res->value += ok;
    }
    /* Anything arriving late is misdirected too. */
    spin_us(1000);
    u64 total = 0;
    for (u32 v = 0; v < 256; v++)
        total += vtd_ir_counted(v) ? irq_counts[v] - start[v] : 0;
    res->stray_irqs += total - counted;
    if (wrong || res->stray_irqs || res->value != x->entries)
        res->status = STATUS_BAD_DATA;
    msix_remember(x);
}

/* Message data of entry i for a table programmed from IDT vector `first`: first + i, wrapping
 * within first..0xff, so a table with more entries than vectors above `first` reuses them
 * instead of reaching the exception and legacy vectors below. */
static u32 msix_data(u64 first, u32 i)
{
    u32 span = first < 0x100 ? 0x100 - (u32)first : 1;
    return (u32)first + i % span;
}

/* Time requests for interrupts, each waited for on its own IDT vector (OP_MSIX_LATENCY). The
 * vectors are read from the table before the clock starts; only the request (one port exit)
 * and the wait for the handler are timed. */
static void msix_latency(const struct msix_fn *x, const struct op *op, struct op_result *res)
{
    static u32 vector[MSIX_MAX_ENTRIES];
    u64 first = op->value, n = op->size ? op->size : 1;
    if (first >= x->entries || n > x->entries - first) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    for (u64 i = first; i < first + n; i++) {
        u32 lo = (u32)mem_read(msix_entry(x, (u32)i, PCI_MSIX_ENTRY_LOWER_ADDR), 4);
        u32 hi = (u32)mem_read(msix_entry(x, (u32)i, PCI_MSIX_ENTRY_UPPER_ADDR), 4);
        u32 data = (u32)mem_read(msix_entry(x, (u32)i, PCI_MSIX_ENTRY_DATA), 4);
        vector[i] = vtd_ir_vector(lo, hi, data) & 0xff; /* none: times out, as documented */
    }
    op_start = rdtsc();
    for (u64 round = 0; round < op->count && res->status == STATUS_OK; round++) {
        for (u64 i = first; i < first + n; i++) {
            u64 before = irq_counts[vector[i]];
            u64 deadline = tsc_timeout(); /* per request: a long op is not a late interrupt */
            outl(PORT_MSIX_SEND, (u32)op->address | (u32)i);
            res->value++;
            while (irq_counts[vector[i]] == before && rdtsc() < deadline)
                ;
            if (irq_counts[vector[i]] == before) {
                res->status = STATUS_TIMEOUT;
                break;
            }
            res->irqs++;
        }
    }
    /* These interrupts were asked for: the next OP_MSIX_CHECK counts from here. */
    for (u32 v = 0; v < 256; v++)
        msix_seen[v] = irq_counts[v];
}

static void msix_op(const struct op *op, struct op_result *res)
{
    struct msix_fn x;
    if (!msix_locate(op->address, &x) || x.entries > MSIX_MAX_ENTRIES) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    u64 m = resolve_method(METHOD_AUTO);
    switch (op->kind) {
    case OP_MSIX_PROGRAM:
        cfg_write(m, x.control, 2, cfg_read(m, x.control, 2) & ~(u32)PCI_MSIX_FLAGS_ENABLE);
        op_start = rdtsc();
        for (u32 i = 0; i < x.entries; i++) {
            mem_write(msix_entry(&x, i, PCI_MSIX_ENTRY_LOWER_ADDR), 4, op->size ? op->size : MSI_ADDRESS_BASE);
            mem_write(msix_entry(&x, i, PCI_MSIX_ENTRY_UPPER_ADDR), 4, 0);
            mem_write(msix_entry(&x, i, PCI_MSIX_ENTRY_DATA), 4, msix_data(op->value, i));
            mem_write(msix_entry(&x, i, PCI_MSIX_ENTRY_VECTOR_CTRL), 4,
                      op->count == 1 ? 0 : PCI_MSIX_ENTRY_CTRL_MASKBIT);
        }
        res->value = x.entries;
        msix_remember(&x);
        break;
    case OP_MSIX_CONTROL:
        op_start = rdtsc();
        cfg_write(m, x.control, 2, (u32)op->value);
        break;
    case OP_MSIX_MASK_EACH:
        for (u32 i = 0; i < x.entries; i++)
            mem_write(msix_entry(&x, i, PCI_MSIX_ENTRY_VECTOR_CTRL), 4,
                      op->value ? PCI_MSIX_ENTRY_CTRL_MASKBIT : 0);
        res->value = x.entries;
        break;
    case OP_MSIX_RETARGET:
        for (u32 i = 0; i < x.entries; i++) {
            mem_write(msix_entry(&x, i, PCI_MSIX_ENTRY_LOWER_ADDR), 4, MSI_ADDRESS_BASE);
            mem_write(msix_entry(&x, i, PCI_MSIX_ENTRY_DATA), 4, msix_data(op->value, i));
        }
        res->value = x.entries;
        break;
    case OP_MSIX_CHECK:
        msix_check(&x, op, res);
        break;
    case OP_MSIX_LATENCY:
        msix_latency(&x, op, res);
        break;
    }
}
