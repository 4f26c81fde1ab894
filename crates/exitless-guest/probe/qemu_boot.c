/* Booted by QEMU (its multiboot loader, entry.S): learn the machine as an OS does, from ACPI
 * and fw_cfg (firmware.h), and report through the serial port. Builds on cpu.h. */

#define PM_TIMER_HZ 3579545u /* ACPI 6.5 §4.8.3.3 */
#define PM_TIMER_MASK 0xffffffu /* 24 bits at least: 20 ms is 71,591 ticks */

/* The TSC frequency against the ACPI PM timer over 20 ms, at CPL 3: each timer read is an exit
 * (~35 us here), so the figure is good to about 0.2%. QEMU passes none (CPUID leaf 0x15 is
 * empty under -cpu host on AMD), and the guest measures it as Linux does without one. */
static u64 calibrate_tsc_khz(u16 pm_timer)
{
    u32 t0 = inl(pm_timer), ticks;
    u64 c0 = rdtsc();
    do
        ticks = (inl(pm_timer) - t0) & PM_TIMER_MASK;
    while (ticks < PM_TIMER_HZ / 50);
    return (rdtsc() - c0) * PM_TIMER_HZ / ((u64)ticks * 1000);
}

/* Without 1 GiB pages the multiboot entry maps 0..4 GiB (entry.S), but firmware may place
 * 64-bit BARs higher: map 4..64 GiB in 2 MiB pages here, at CPL 3, where the 30,720 entries
 * cost microseconds instead of the emulated ring 0's tenths of a second. The tables lie in
 * identity-mapped user RAM; each PDPT entry goes from not present to present, which needs no
 * invalidation (Intel SDM vol. 3 §4.10.4.3). */
static void map_high_memory(void)
{
    volatile u64 *pdpt = (volatile u64 *)BOOT_PDPT_ADDR;
    if (pdpt[BOOT_PD_COUNT] & PTE_PRESENT)
        return; /* 1 GiB pages: 0..512 GiB are mapped */
    for (u64 g = 0; g < HIGH_PD_COUNT; g++) {
        u64 *pd = (u64 *)(HIGH_PD_ADDR + g * 0x1000);
        u64 gib = BOOT_PD_COUNT + g;
        for (u64 i = 0; i < 512; i++)
            pd[i] = (gib << 30 | i << 21) | PTE_PRESENT | PTE_WRITABLE | PTE_USER | PTE_HUGE;
        pdpt[gib] = (u64)pd | PTE_PRESENT | PTE_WRITABLE | PTE_USER;
    }
}

/* Fill the boot info exitless's VMM would have written: ECAM from the MCFG (PCI Firmware 3.2
 * §4.1.2: base, segment, first and last bus of the first allocation), the TSC frequency, no
 * virtio-mmio devices, the VT-d unit if there is a DMAR; and copy the ops from fw_cfg. 0 if
 * all was there. */
static const char *qemu_boot_info(void)
{
    struct boot_info *info = (struct boot_info *)BOOT_INFO_ADDR;
    const u8 *rsdp = acpi_find_rsdp();
    if (!rsdp)
        return "no ACPI RSDP";
    const u8 *fadt = acpi_table(rsdp, "FACP"), *mcfg = acpi_table(rsdp, "MCFG");
    const u8 *dmar = acpi_table(rsdp, "DMAR"); /* with QEMU's intel-iommu */
    if (!fadt)
        return "no ACPI FADT";
    u32 size = 0;
    u16 file = fw_cfg_file(QEMU_OPS_FILE, sizeof(QEMU_OPS_FILE) - 1, &size);
    if (!file)
        return "no fw_cfg file " QEMU_OPS_FILE;
    if (size % sizeof(struct op) || size / sizeof(struct op) > MAX_OPS)
        return "fw_cfg file " QEMU_OPS_FILE " is not an op array";
    info->magic = BOOT_INFO_MAGIC;
    info->ecam_base = info->ecam_bus_start = info->ecam_bus_end = 0;
    if (mcfg && fw_rd32(mcfg + 4) >= 60 && (mcfg[52] | mcfg[53]) == 0) {
        info->ecam_base = fw_rd32(mcfg + 44) | (u64)fw_rd32(mcfg + 48) << 32;
        info->ecam_bus_start = mcfg[54];
        info->ecam_bus_end = mcfg[55];
    }
    info->tsc_khz = calibrate_tsc_khz((u16)fw_rd32(fadt + 76)); /* PM_TMR_BLK */
    info->op_count = size / sizeof(struct op);
    info->virtio_mmio_count = 0;
    info->iommu_base = dmar ? acpi_dmar_unit(dmar) : 0;
    fw_cfg_select(file);
    fw_cfg_read((void *)OPS_ADDR, size);
    return 0;
}

/* The serial dump (parsed by crates/exitless-peer/src/dump.rs): a line `DUMP_BEGIN tsc_khz ops records`, one
 * line `r` per op result and `e` per enumeration record of the last OP_ENUMERATE, their
 * fields in contract order, then `DUMP_END checksum`: FNV-1a 64 over every byte before that
 * line. Numbers are lowercase hex. Written after every op has run, never inside one. */
static u64 dump_hash;

static void dump_byte(char c)
{
    dump_hash = (dump_hash ^ (u8)c) * 0x100000001b3ull;
    outb(PORT_SERIAL, (u8)c);
}

static void dump_str(const char *s)
{
    for (; *s; s++)
        dump_byte(*s);
}

static void dump_hex(u64 v)
{
    char digits[16];
    int n = 0;
    do
        digits[n++] = "0123456789abcdef"[v & 0xf];
    while (v >>= 4);
    dump_byte(' ');
    while (n)
        dump_byte(digits[--n]);
}

static void dump_block(const char *tag, const u64 *words, u64 n)
{
    dump_str(tag);
    for (u64 i = 0; i < n; i++)
        dump_hex(words[i]);
    dump_byte('\n');
}

static void dump_results(const struct op *ops, const struct op_result *results, u64 count)
{
    u64 records = 0;
    for (u64 i = 0; i < count; i++)
        if (ops[i].kind == OP_ENUMERATE)
            records = results[i].value < MAX_ENUM_RECORDS ? results[i].value : MAX_ENUM_RECORDS;
    dump_hash = 0xcbf29ce484222325ull;
    dump_str(DUMP_BEGIN);
    dump_hex(boot->tsc_khz);
    dump_hex(count);
    dump_hex(records);
    dump_byte('\n');
    for (u64 i = 0; i < count; i++)
        dump_block("r", (const u64 *)&results[i], sizeof(struct op_result) / 8);
    const struct enum_record *r = (const struct enum_record *)ENUM_ADDR;
    for (u64 i = 0; i < records; i++)
        dump_block("e", (const u64 *)&r[i], sizeof(struct enum_record) / 8);
    u64 sum = dump_hash;
    serial_puts(DUMP_END);
    dump_hex(sum);
    serial_puts("\n");
}
