/* The checks of the platform a VMM gives a kernel it did not build: the multiboot information,
 * fw_cfg, the ACPI tables, the PM timer, the application processors and console input. */
#include <stdint.h>

#include "testkernel.h"

#define FW_CFG_SIGNATURE 0x00
#define FW_CFG_ID       0x01
#define FW_CFG_RAM_SIZE 0x03
#define FW_CFG_NB_CPUS  0x05
#define CMDLINE_FILE    "opt/exitless/cmdline"
#define LAPIC           0xfee00000u
#define LAPIC_SVR       0xf0
#define LAPIC_ICR_LOW   0x300
#define LAPIC_ICR_HIGH  0x310
#define ICR_INIT_OTHERS 0x000c4500u     /* INIT, assert, to all excluding self */
#define ICR_SIPI_OTHERS 0x000c4600u     /* start-up, to all excluding self */
#define IOAPIC          0xfec00000u
#define PM_TIMER_MASK   0xffffffu       /* 24 bits unless the FADT says 32 */

/* Set by the application processors (entry.S). */
volatile uint32_t ap_count;
extern const char ap_trampoline[], ap_trampoline_end[];

/* ---- the PM timer ---- */

uint16_t pm_timer_port;
uint32_t pm_timer_mask = PM_TIMER_MASK;

uint32_t pm_timer(void)
{
    return inl(pm_timer_port) & pm_timer_mask;
}

/* Wait `ticks` of the PM timer (at most half its range). */
void delay(uint32_t ticks)
{
    uint32_t start = pm_timer();
    while (((pm_timer() - start) & pm_timer_mask) < ticks)
        ;
}

/* ---- the checks ---- */

void check_multiboot(const struct mb_info *mb, uint32_t mem_mib)
{
    check((mb->flags & (MB_INFO_MEMORY | MB_INFO_MMAP)) == (MB_INFO_MEMORY | MB_INFO_MMAP),
          "multiboot: memory sizes and map given (flags %x)", mb->flags);
    if (mb->flags & MB_INFO_LOADER_NAME)
        print("testkernel: booted by %s\n", (const char *)mb->boot_loader_name);
    /* RAM available from 1 MiB on, by the map: no more than mem_upper says. */
    uint32_t kib_above_1m = 0, entries = 0;
    for (uint32_t at = mb->mmap_addr; at < mb->mmap_addr + mb->mmap_length; entries++) {
        const uint8_t *e = (const uint8_t *)at;
        uint32_t base = fw_rd32(e + 4), base_high = fw_rd32(e + 8), len = fw_rd32(e + 12);
        if (fw_rd32(e + 20) == 1 && base_high == 0 && base >= 0x100000)
            kib_above_1m += len >> 10;
        at += fw_rd32(e) + 4;
    }
    check(mb->mem_lower >= 512 && mb->mem_lower <= 640 && kib_above_1m > 0 &&
          kib_above_1m <= mb->mem_upper,
          "multiboot: mem_lower %u KiB, mem_upper %u KiB, %u map entries with %u KiB of RAM "
          "above 1 MiB", mb->mem_lower, mb->mem_upper, entries, kib_above_1m);
    if (mem_mib)
        check(mb->mem_upper + 1024 <= mem_mib * 1024 && mb->mem_upper + 2048 > mem_mib * 1024,
              "multiboot: mem_upper matches mem=%u", mem_mib);
}

void check_fw_cfg(uint32_t cpus, uint32_t mem_mib)
{
    char signature[5] = {0};
    fw_cfg_select(FW_CFG_SIGNATURE);
    fw_cfg_read(signature, 4);
    if (!check(fw_equal(signature, "QEMU", 4), "fw_cfg: signature '%s'", signature))
        return;
    uint32_t id;
    fw_cfg_select(FW_CFG_ID);
    fw_cfg_read(&id, 4);
    check(id & 1, "fw_cfg: traditional interface (ID %x)", id);
    uint16_t nb_cpus;
    fw_cfg_select(FW_CFG_NB_CPUS);
    fw_cfg_read(&nb_cpus, 2);
    check(nb_cpus == cpus, "fw_cfg: %u CPUs, cpus=%u", nb_cpus, cpus);
    uint32_t ram[2];
    fw_cfg_select(FW_CFG_RAM_SIZE);
    fw_cfg_read(ram, 8);
    if (mem_mib)
        check(ram[1] == 0 && ram[0] == mem_mib << 20, "fw_cfg: RAM %u MiB, mem=%u",
              ram[0] >> 20, mem_mib);
    else
        check(ram[0] || ram[1], "fw_cfg: RAM %u MiB", ram[0] >> 20);

    uint32_t size = 0;
    uint16_t select = fw_cfg_file(CMDLINE_FILE, sizeof(CMDLINE_FILE) - 1, &size);
    if (!check(select, "fw_cfg: %s among the files", CMDLINE_FILE))
        return;
    /* It holds the command line as given: ours without the kernel's path before it. */
    const char *given = cmdline;
    while (*given && *given != ' ')
        given++;
    if (*given)
        given++;
    char file[256] = {0};
    uint32_t n = size < sizeof file - 1 ? size : sizeof file - 1;
    fw_cfg_select(select);
    fw_cfg_read(file, n);
    if (n && file[n - 1] == 0)
        n--;
    check(n == length(given) && fw_equal(file, given, n), "fw_cfg: %s is '%s'", CMDLINE_FILE, file);
}

static int contains(const uint8_t *p, uint32_t len, const void *needle, uint32_t n)
{
    for (uint32_t i = 0; i + n <= len; i++)
        if (fw_equal(p + i, needle, n))
            return 1;
    return 0;
}

const uint8_t *fadt;
static const uint8_t *madt, *mcfg, *dmar;

void check_acpi(void)
{
    const uint8_t *rsdp = acpi_find_rsdp();
    if (!check(rsdp != 0, "acpi: RSDP found by scanning"))
        return;
    /* Revision 2 and up: the XSDT, 64-bit entries; before that the RSDT (QEMU's). */
    uint32_t step;
    const uint8_t *root = acpi_root(rsdp, &step);
    int x = step == 8;
    uint32_t root_len = fw_rd32(root + 4), tables = (root_len - 36) / step;
    int sums = acpi_checksum_ok(root, root_len) && fw_equal(root, x ? "XSDT" : "RSDT", 4);
    for (uint32_t i = 0; i < tables; i++) {
        const uint8_t *t = fw_phys(fw_rd32(root + 36 + i * step));
        sums &= acpi_checksum_ok(t, fw_rd32(t + 4));
        if (fw_equal(t, "FACP", 4))
            fadt = t;
        else if (fw_equal(t, "APIC", 4))
            madt = t;
        else if (fw_equal(t, "MCFG", 4))
            mcfg = t;
        else if (fw_equal(t, "DMAR", 4))
            dmar = t;
    }
    check(sums, "acpi: RSDP revision %u at %x, %s lists %u tables, every checksum right", rsdp[15],
          (uint32_t)rsdp, x ? "XSDT" : "RSDT", tables);
}

void check_fadt(void)
{
    if (!check(fadt != 0, "fadt: present"))
        return;
    uint32_t fadt_len = fw_rd32(fadt + 4);
    pm_timer_port = (uint16_t)fw_rd32(fadt + 76);
    if (fw_rd32(fadt + 112) & (1u << 8)) /* TMR_VAL_EXT */
        pm_timer_mask = 0xffffffffu;
    check(pm_timer_port == 0x608 && fw_rd32(fadt + 64) == 0x604,
          "fadt: PM timer at %x, PM1a control at %x", pm_timer_port, fw_rd32(fadt + 64));
    /* X_DSDT if the FADT has it and it is set, else DSDT. */
    uint32_t dsdt_at = fadt_len >= 148 && fw_rd32(fadt + 140) ? fw_rd32(fadt + 140) : fw_rd32(fadt + 40);
    const uint8_t *dsdt = (const uint8_t *)dsdt_at;
    uint32_t len = fw_rd32(dsdt + 4);
    static const uint8_t pnp0a08[] = {0x41, 0xd0, 0x0a, 0x08}; /* EISAID("PNP0A08") */
    check(fw_equal(dsdt, "DSDT", 4) && acpi_checksum_ok(dsdt, len) && contains(dsdt, len, pnp0a08, 4) &&
          contains(dsdt, len, "_S5_", 4),
          "dsdt: %u bytes, a PCI Express host bridge (PNP0A08) and \\_S5", len);
}

void check_madt(uint32_t cpus)
{
    if (!check(madt != 0, "madt: present"))
        return;
    uint32_t len = fw_rd32(madt + 4), lapics = 0, ioapic = 0, irq0_gsi = 0xffffffffu;
    for (uint32_t at = 44; at + 2 <= len && madt[at + 1] >= 2; at += madt[at + 1]) {
        const uint8_t *e = madt + at;
        if (e[0] == 0 && (fw_rd32(e + 4) & 1)) /* an enabled processor local APIC */
            lapics++;
        else if (e[0] == 1)
            ioapic = fw_rd32(e + 4);
        else if (e[0] == 2 && e[3] == 0) /* the override of ISA IRQ 0 */
            irq0_gsi = fw_rd32(e + 4);
    }
    check(fw_rd32(madt + 36) == LAPIC && lapics == cpus,
          "madt: local APICs at %x, %u enabled, cpus=%u", fw_rd32(madt + 36), lapics, cpus);
    check(ioapic == IOAPIC && irq0_gsi == 2, "madt: IOAPIC at %x, IRQ 0 on GSI %u", ioapic,
          irq0_gsi);
}

static uint16_t vendor_by_ports(void)
{
    outl(PCI_CONFIG_ADDRESS, 0x80000000u); /* 00:00.0, register 0 */
    return inw(PCI_CONFIG_DATA);
}

void check_mcfg(uint32_t ecam)
{
    if (!ecam) {
        check(mcfg == 0, "mcfg: absent, as ecam=0 says");
        return;
    }
    if (!check(mcfg != 0 && fw_rd32(mcfg + 4) >= 60, "mcfg: present"))
        return;
    const uint8_t *e = mcfg + 44;
    uint32_t base = fw_rd32(e), start_bus = e[10], end_bus = e[11];
    uint16_t by_ecam = 0xffff;
    if (fw_rd32(e + 4) == 0 && rd16(e + 8) == 0 && start_bus == 0)
        by_ecam = (uint16_t)mmio32(base);
    uint16_t by_ports = vendor_by_ports();
    check(by_ecam != 0xffff && by_ecam == by_ports,
          "mcfg: ECAM at %x for buses %u-%u; 00:00.0 vendor %04x by ECAM, %04x by port I/O", base,
          start_bus, end_bus, by_ecam, by_ports);
}

/* The DMAR (Intel VT-d §8.1): its first remapping structure a DRHD (type 0) with
 * INCLUDE_PCI_ALL, whose register page answers with its version (VER, §10.4.1). */
void check_dmar(uint32_t iommu, uint32_t intremap)
{
    if (!iommu) {
        check(dmar == 0, "dmar: absent, as iommu=0 says");
        return;
    }
    if (!check(dmar != 0 && fw_rd32(dmar + 4) >= 48 + 16, "dmar: present"))
        return;
    const uint8_t *drhd = dmar + 48;
    uint32_t base = fw_rd32(drhd + 8), version = mmio32(base);
    check(rd16(drhd) == 0 && (drhd[4] & 1) && version == 0x10,
          "dmar: host address width %u, a DRHD for every PCI device at %x, VER %x", dmar[36] + 1u,
          base, version);
    if (intremap) {
        uint32_t unit = 0;
        uint16_t sid = 0;
        int found = dmar_ioapic_scope(&unit, &sid);
        check(found && !(dmar[37] & 2),
              "dmar: INTR_REMAP, x2APIC opt-out clear, the IOAPIC in the DRHD's scope as %02x:%02x.%u",
              sid >> 8u, (sid >> 3u) & 0x1fu, sid & 7u);
    }
}

/* With INTR_REMAP set (DMAR flags bit 0), the first DRHD's base and the source-id of the
 * IOAPIC its device scope names (type 3, §8.3.1: start bus, then one (device, function) path
 * element); 0 if either is missing. */
int dmar_ioapic_scope(uint32_t *unit, uint16_t *sid)
{
    if (!dmar || !(dmar[37] & 1))
        return 0;
    const uint8_t *drhd = dmar + 48;
    uint32_t len = rd16(drhd + 2);
    for (uint32_t at = 16; at + 8 <= len && drhd[at + 1] >= 8; at += drhd[at + 1]) {
        const uint8_t *s = drhd + at;
        if (s[0] == 3) {
            *unit = fw_rd32(drhd + 8);
            *sid = (uint16_t)(s[5] << 8 | s[6] << 3 | s[7]);
            return 1;
        }
    }
    return 0;
}

void check_smp(uint32_t cpus)
{
    uint32_t others = cpus - 1;
    memcpy((void *)TRAMPOLINE, ap_trampoline, (uint32_t)(ap_trampoline_end - ap_trampoline));
    ap_count = 0;
    mmio_write32(LAPIC + LAPIC_SVR, mmio32(LAPIC + LAPIC_SVR) | 0x1ff); /* enable, vector 0xff */
    mmio_write32(LAPIC + LAPIC_ICR_HIGH, 0);
    mmio_write32(LAPIC + LAPIC_ICR_LOW, ICR_INIT_OTHERS);
    delay(PM_TIMER_HZ / 100); /* 10 ms, then two start-up IPIs 200 us apart (SDM §9.4.4.1) */
    for (int i = 0; i < 2; i++) {
        mmio_write32(LAPIC + LAPIC_ICR_LOW, ICR_SIPI_OTHERS | TRAMPOLINE >> 12);
        delay(PM_TIMER_HZ / 5000);
    }
    for (int waited = 0; ap_count < others && waited < 100; waited++)
        delay(PM_TIMER_HZ / 100);
    check(ap_count == others, "smp: %u of %u application processors started by INIT/SIPI",
          ap_count, others);
}

void check_echo(void)
{
    char line[64];
    uint32_t n = 0, waited = 0, last = pm_timer();
    print("echo: type a line\n");
    while (n < sizeof line - 1 && waited < 10 * PM_TIMER_HZ) {
        if (inb(COM1_LSR) & LSR_DATA_READY) {
            char c = (char)inb(COM1);
            if (c == '\n' || c == '\r')
                break;
            line[n++] = c;
        }
        uint32_t now = pm_timer();
        waited += (now - last) & pm_timer_mask;
        last = now;
    }
    line[n] = 0;
    check(n > 0 && waited < 10 * PM_TIMER_HZ, "echo: read '%s' from the console", line);
}
