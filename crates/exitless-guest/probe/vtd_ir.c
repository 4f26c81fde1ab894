/* Interrupt remapping in the VT-d driver (VT-d §5.1; docs/iommu.md). Builds on vtd.c.
 *
 * OP_IOMMU_INTREMAP fills an interrupt remapping table of VTD_IRT_ENTRIES entries, source-
 * validated to one PCI function, latches it (SIRTP), invalidates the interrupt entry cache
 * and turns remapping on, as Linux's intel_irq_remapping does. Entry k delivers IDT vector
 * k + delta to the boot CPU, so a remappable message whose data is the subhandle k (address:
 * handle 0, SHV set) arrives on another vector than its data says: only a unit that really
 * remapped it delivers it where msix.c expects it. Run again with another delta, the rewritten
 * entries take effect through the global invalidation. */

#define VTD_IRT_ENTRIES 256
#define VTD_IRT_S 7 /* 2^(S + 1) entries */

static struct {
    int on;
    int foreign; /* the entries admit another function only: every message is blocked */
    int level;   /* the entries are level-triggered (an IOAPIC's level lines) */
    u64 table, delta;
} vtd_ir;

/* The IDT vector the CPU takes `lo`/`hi`/`data` on, or 256 for none: a compatibility-format
 * message by its data unless remapping blocks it (CFI is left clear); a remappable one through
 * the entry it names (VT-d §5.1.2.2: handle in address 19:5 and 2, plus the subhandle in data
 * 15:0 with SHV). */
static u32 vtd_ir_vector(u32 lo, u32 hi, u32 data)
{
    if ((lo & MSI_ADDRESS_MASK) != MSI_ADDRESS_BASE || hi)
        return 256;
    u32 vector = data & 0xff;
    if (lo & VTD_MSI_REMAPPABLE) {
        if (!vtd_ir.on || vtd_ir.foreign)
            return 256;
        u32 index = ((lo >> VTD_MSI_HANDLE_SHIFT) & 0x7fff) | ((lo & VTD_MSI_HANDLE_15) ? 0x8000 : 0);
        if (lo & VTD_MSI_SHV)
            index += data & 0xffff;
        if (index >= VTD_IRT_ENTRIES)
            return 256;
        const volatile u64 *e = (const volatile u64 *)(vtd_ir.table + VTD_IRTE_SIZE * index);
        if (!(e[0] & VTD_IRTE_P))
            return 256;
        vector = (u32)(e[0] >> VTD_IRTE_VECTOR_SHIFT) & 0xff;
    } else if (vtd_ir.on) {
        return 256;
    }
    return vector >= 16 ? vector : 256;
}

/* The message a device is programmed with to interrupt on IDT vector `vector`: while
 * remapping is on, remappable (handle 0, SHV) naming the entry that delivers on it, as Linux's
 * drivers write them through intel_irq_remapping; compatibility format otherwise. */
static void vtd_ir_message(u32 vector, u32 *lo, u32 *data)
{
    *lo = vtd_ir.on ? MSI_REMAPPABLE_SHV : MSI_ADDRESS_BASE;
    *data = vtd_ir.on ? (vector - (u32)vtd_ir.delta) & 0xff : vector;
}

/* The IOAPIC redirection entry that delivers on IDT vector `vector`, level-triggered: while
 * remapping is on, remappable (VT-d §5.1.5.1: format bit 48, the index of the entry that
 * delivers on it in 63:49 and 11, the vector field the same as that entry's, for the EOI);
 * compatibility format to APIC 0 otherwise. */
static u64 vtd_ir_rte(u32 vector)
{
    if (!vtd_ir.on)
        return vector | IOAPIC_REDIR_LEVEL;
    u64 index = (vector - vtd_ir.delta) & 0xff;
    return (index & 0x7fff) << 49 | 1ull << 48 | (index >> 15) << 11 | vector | IOAPIC_REDIR_LEVEL;
}

/* Whether an interrupt on IDT vector `v` counts as an MSI-X delivery: the unit's fault events
 * (a blocked remapped message raises one) do not. */
static int vtd_ir_counted(u32 v)
{
    return !(vtd_ir.on && v == IOMMU_FAULT_VECTOR);
}

/* OP_IOMMU_INTREMAP: entries for the function at `address` (for the next device's function
 * 0 instead if `count` is 1), delta `value`. */
static void vtd_intremap(const struct op *op, struct op_result *res)
{
    res->status = vtd_init();
    if (res->status != STATUS_OK)
        return;
    if (!(vtd_read(VTD_ECAP_REG, 8) & VTD_ECAP_IR)) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    if (!vtd_ir.table && !(vtd_ir.table = vtd_alloc_page())) {
        res->status = STATUS_DEVICE_ERROR;
        return;
    }
    u64 sid = (op->address >> ECAM_FUNCTION_SHIFT) & 0xffff;
    vtd_ir.foreign = op->count == 1;
    vtd_ir.level = op->count == 2;
    if (vtd_ir.foreign)
        sid = (sid & ~7ull) + 8;
    u64 apic = mem_read(LAPIC_BASE + 0x20, 4) >> 24; /* the boot CPU's xAPIC ID (SDM §11.4.6) */
    volatile u64 *t = (volatile u64 *)vtd_ir.table;
    for (u64 k = 0; k < VTD_IRT_ENTRIES; k++) {
        u64 v = (k + op->value) & 0xff;
        t[2 * k + 1] = VTD_IRTE_SVT_SID << VTD_IRTE_SVT_SHIFT | sid;
        /* xAPIC mode (EIME clear): the APIC ID in DST 15:8; fixed, physical, edge */
        t[2 * k] = v < 16 ? 0 : VTD_IRTE_P | v << VTD_IRTE_VECTOR_SHIFT | apic << (VTD_IRTE_DST_SHIFT + 8) |
                                    (vtd_ir.level ? VTD_IRTE_TM : 0);
    }
    for (u64 p = 0; p < VTD_PAGE; p += 64)
        vtd_sync((const volatile void *)(vtd_ir.table + p));
    vtd_write(VTD_IRTA_REG, 8, vtd_ir.table | VTD_IRT_S);
    if (!vtd_command(VTD_GCMD_SIRTP)) {
        res->status = STATUS_TIMEOUT;
        return;
    }
    const u64 iec[1][2] = {{VTD_QI_IEC_TYPE, 0}}; /* global */
    vtd_submit(iec, 1);
    if (!vtd_command(VTD_GCMD_IRE)) {
        res->status = STATUS_TIMEOUT;
        return;
    }
    vtd_ir.on = 1;
    vtd_ir.delta = op->value;
    res->value = VTD_IRT_ENTRIES;
}
