/* exitless's multiboot test kernel. It checks the platform a VMM gives a kernel it did not
 * build, by QEMU's conventions, so the same image runs under `exitless run` and under
 * `qemu-system-x86_64 -machine q35 -kernel`:
 *
 *   - the multiboot information (Multiboot 0.6.96 §3.3): memory sizes, map, command line;
 *   - fw_cfg (QEMU docs/specs/fw_cfg.rst): signature, CPU count, RAM size, the file directory
 *     and the file opt/exitless/cmdline, which must hold this kernel's command line;
 *   - ACPI (ACPI 6.5 §5.2): the RSDP found by scanning, every table's checksum, the FADT's PM
 *     timer and PM1a control, the DSDT's PCIe host bridge and \_S5, the MADT's local APICs,
 *     IOAPIC and IRQ 0 override, the MCFG and config space read through it;
 *   - the PM timer advancing; the application processors answering INIT/SIPI; console input.
 *
 * What it expects comes from its command line: cpus=N (default 1), mem=MIB (RAM size, if
 * given), ecam=0|1 (whether an MCFG must be there; default 1), iommu=0|1 (whether a DMAR
 * describing a live VT-d unit must be there; default 0), echo=1 (read a line from the
 * console), disk=1 (drive the first virtio-blk disk), net=1 ip=A.B.C.D peer=A.B.C.D (ask the
 * host on the first virtio-net device's network for peer's MAC by ARP, and check the answer),
 * exit=debug|poweroff|reset|kbd (how to end; default debug: isa-debug-exit with
 * 0x10 when every check passed, 0x11 otherwise, so the VMM exits with 33 or 35).
 *
 * It prints PASS/FAIL lines on COM1, polled. Everything runs at ring 0, which the KVM of
 * exitless's machines emulates at about a microsecond an instruction (PLATFORM.md): the
 * kernel stays small, and its loops are short. */
#include <stdarg.h>
#include <stdint.h>

#include "testkernel.h"

#define COM1            0x3f8
#define COM1_LSR        (COM1 + 5)
#define LSR_DATA_READY  0x01
#define LSR_THR_EMPTY   0x20
#define DEBUG_EXIT      0xf4            /* -device isa-debug-exit,iobase=0xf4 */
#define EXIT_PASS       0x10
#define EXIT_FAIL       0x11
#define FW_CFG_SIGNATURE 0x00
#define FW_CFG_ID       0x01
#define FW_CFG_RAM_SIZE 0x03
#define FW_CFG_NB_CPUS  0x05
#define CMDLINE_FILE    "opt/exitless/cmdline"
#define PCI_CONFIG_ADDRESS 0xcf8
#define PCI_CONFIG_DATA 0xcfc
#define RESET_CONTROL   0xcf9
#define I8042_COMMAND   0x64
#define LAPIC           0xfee00000u
#define LAPIC_SVR       0xf0
#define LAPIC_ICR_LOW   0x300
#define LAPIC_ICR_HIGH  0x310
#define ICR_INIT_OTHERS 0x000c4500u     /* INIT, assert, to all excluding self */
#define ICR_SIPI_OTHERS 0x000c4600u     /* start-up, to all excluding self */
#define IOAPIC          0xfec00000u
#define PM_TIMER_HZ     3579545u
#define PM_TIMER_MASK   0xffffffu       /* 24 bits unless the FADT says 32 */
#define SLP_EN          (1u << 13)
#define S5_SLP_TYP      0u              /* QEMU's \_S5, and exitless's */
#define MB_BOOTLOADER_MAGIC 0x2badb002u
#define MB_INFO_MEMORY  (1u << 0)
#define MB_INFO_CMDLINE (1u << 2)
#define MB_INFO_MMAP    (1u << 6)
#define MB_INFO_LOADER_NAME (1u << 9)

/* The multiboot information (§3.3), up to the fields read here. */
struct mb_info {
    uint32_t flags, mem_lower, mem_upper, boot_device, cmdline, mods_count, mods_addr;
    uint32_t syms[4];
    uint32_t mmap_length, mmap_addr, drives_length, drives_addr, config_table;
    uint32_t boot_loader_name;
};

/* Set by the application processors (entry.S). */
volatile uint32_t ap_count;
extern const char ap_trampoline[], ap_trampoline_end[];

/* gcc may call these even in freestanding code. */
void *memcpy(void *d, const void *s, __SIZE_TYPE__ n)
{
    uint8_t *dp = d;
    const uint8_t *sp = s;
    while (n--)
        *dp++ = *sp++;
    return d;
}

void *memset(void *d, int c, __SIZE_TYPE__ n)
{
    uint8_t *dp = d;
    while (n--)
        *dp++ = (uint8_t)c;
    return d;
}

static uint32_t length(const char *s)
{
    uint32_t n = 0;
    while (s[n])
        n++;
    return n;
}

#include "../portio.h"

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

#include "../firmware.h"
static inline uint32_t mmio32(uint32_t addr) { return *(volatile uint32_t *)addr; }
static inline void mmio_write32(uint32_t addr, uint32_t v) { *(volatile uint32_t *)addr = v; }

/* ---- console ---- */

static void putc(char c)
{
    while (!(inb(COM1_LSR) & LSR_THR_EMPTY))
        ;
    outb(COM1, (uint8_t)c);
}

static void puts(const char *s)
{
    while (*s)
        putc(*s++);
}

static void put_number(uint32_t v, uint32_t base, int width)
{
    char digits[12];
    int n = 0;
    do {
        digits[n++] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v);
    while (width-- > n)
        putc('0');
    while (n)
        putc(digits[--n]);
}

/* printf's %s %c %u %x, with a zero-padded width. */
static void vprint(const char *fmt, va_list ap)
{
    for (; *fmt; fmt++) {
        if (*fmt != '%') {
            putc(*fmt);
            continue;
        }
        int width = 0;
        while (fmt[1] >= '0' && fmt[1] <= '9')
            width = width * 10 + (*++fmt - '0');
        switch (*++fmt) {
        case 's': puts(va_arg(ap, const char *)); break;
        case 'c': putc((char)va_arg(ap, int)); break;
        case 'u': put_number(va_arg(ap, uint32_t), 10, width); break;
        case 'x': put_number(va_arg(ap, uint32_t), 16, width); break;
        default: putc('%'); putc(*fmt); break;
        }
    }
}

static void print(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprint(fmt, ap);
    va_end(ap);
}

static uint32_t passed, failed;

/* One result line: "PASS what" or "FAIL what". */
static int check(int ok, const char *fmt, ...)
{
    va_list ap;
    puts(ok ? "PASS " : "FAIL ");
    va_start(ap, fmt);
    vprint(fmt, ap);
    va_end(ap);
    putc('\n');
    if (ok)
        passed++;
    else
        failed++;
    return ok;
}

/* ---- the command line ---- */

static const char *cmdline = "";

/* The value of `key=` in the command line (a pointer into it), or 0. */
static const char *arg(const char *key)
{
    uint32_t n = length(key);
    for (const char *p = cmdline; *p; p++) {
        if ((p == cmdline || p[-1] == ' ') && fw_equal(p, key, n) && p[n] == '=')
            return p + n + 1;
    }
    return 0;
}

static uint32_t arg_number(const char *key, uint32_t otherwise)
{
    const char *v = arg(key);
    if (!v)
        return otherwise;
    uint32_t n = 0;
    while (*v >= '0' && *v <= '9')
        n = n * 10 + (uint32_t)(*v++ - '0');
    return n;
}

static int arg_is(const char *key, const char *value)
{
    const char *v = arg(key);
    uint32_t n = length(value);
    return v && fw_equal(v, value, n) && (v[n] == ' ' || v[n] == 0);
}

/* ---- the PM timer ---- */

static uint16_t pm_timer_port;
static uint32_t pm_timer_mask = PM_TIMER_MASK;

static uint32_t pm_timer(void)
{
    return inl(pm_timer_port) & pm_timer_mask;
}

/* Wait `ticks` of the PM timer (at most half its range). */
static void delay(uint32_t ticks)
{
    uint32_t start = pm_timer();
    while (((pm_timer() - start) & pm_timer_mask) < ticks)
        ;
}

/* ---- the checks ---- */

static void check_multiboot(const struct mb_info *mb, uint32_t mem_mib)
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

static void check_fw_cfg(uint32_t cpus, uint32_t mem_mib)
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

static const uint8_t *fadt, *madt, *mcfg, *dmar;

static void check_acpi(void)
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

static void check_fadt(void)
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

static void check_madt(uint32_t cpus)
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

static void check_mcfg(uint32_t ecam)
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
static void check_dmar(uint32_t iommu)
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
}

static void check_smp(uint32_t cpus)
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

static void check_echo(void)
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

/* ---- virtio-pci (virtio 1.2 §4.1), as a minimal polling driver drives it ----
 *
 * Find the function on bus 0 by port I/O, take BAR 0 where the platform placed it, walk the
 * vendor capabilities for the common, notify and device configuration, negotiate VERSION_1 and
 * what the device driver asks, set up its queues and poll their used rings (no interrupts).
 * Addresses are guest-physical (paging is off). */
#define VIRTIO_VENDOR 0x1af4
#define VQ_SIZE 8

static uint32_t pci_read32(uint32_t dev, uint32_t reg)
{
    outl(PCI_CONFIG_ADDRESS, 0x80000000u | dev << 11 | (reg & 0xfc));
    return inl(PCI_CONFIG_DATA);
}

static void pci_write32(uint32_t dev, uint32_t reg, uint32_t v)
{
    outl(PCI_CONFIG_ADDRESS, 0x80000000u | dev << 11 | (reg & 0xfc));
    outl(PCI_CONFIG_DATA, v);
}

static void mmio_write16(uint32_t a, uint16_t v) { *(volatile uint16_t *)a = v; }
static void mmio_write8(uint32_t a, uint8_t v) { *(volatile uint8_t *)a = v; }
static uint8_t mmio8(uint32_t a) { return *(volatile uint8_t *)a; }

/* A split virtqueue (§2.7) of VQ_SIZE entries, its index and where its doorbell is. */
struct vq_desc { uint64_t addr; uint32_t len; uint16_t flags, next; };
struct vq {
    struct vq_desc desc[VQ_SIZE];
    volatile uint16_t avail[2 + VQ_SIZE + 1];
    volatile uint32_t used[1 + 2 * VQ_SIZE + 1];
    uint32_t notify;
    uint16_t index, next_avail, used_seen;
} __attribute__((aligned(16)));

/* A virtio-pci function's configuration structures (§4.1.4). */
struct vpci { uint32_t dev, common, notify, device, multiplier; };

/* Find the first function of virtio device ID `id` (§4.1.2.1: 0x1040 + ID) on bus 0, enable
 * its memory space and bus mastering, and find its structures; checks named `what`. */
static int vpci_find(struct vpci *v, uint32_t id, const char *what, const char *name)
{
    *v = (struct vpci){ 0 };
    for (uint32_t d = 3; d < 32 && !v->dev; d++)
        if (pci_read32(d, 0) == ((0x1040 + id) << 16 | VIRTIO_VENDOR))
            v->dev = d;
    if (!check(v->dev != 0, "%s: a %s function on bus 0 (00:%02x.0)", what, name, v->dev))
        return 0;
    /* BAR 0 as the platform placed it (a 64-bit memory BAR below 4 GiB). */
    uint32_t bar = pci_read32(v->dev, 0x10) & ~0xfu;
    if (!check(bar != 0 && pci_read32(v->dev, 0x14) == 0, "%s: BAR 0 at %x", what, bar))
        return 0;
    pci_write32(v->dev, 0x04, 0x6); /* memory space, bus master */
    for (uint32_t cap = pci_read32(v->dev, 0x34) & 0xff; cap;
         cap = pci_read32(v->dev, cap) >> 8 & 0xff) {
        uint32_t head = pci_read32(v->dev, cap);
        if ((head & 0xff) != 0x09)
            continue;
        uint32_t type = head >> 24, at = bar + pci_read32(v->dev, cap + 8);
        if (type == 1)
            v->common = at;
        else if (type == 2) {
            v->notify = at;
            v->multiplier = pci_read32(v->dev, cap + 16);
        } else if (type == 4)
            v->device = at;
    }
    return check(v->common && v->notify && v->device, "%s: common %x, notify %x, device %x", what,
                 v->common, v->notify, v->device);
}

/* Reset, ACKNOWLEDGE and DRIVER, accept VIRTIO_F_VERSION_1 and `features` (bits 0-31), set
 * FEATURES_OK (§3.1.1); whether the device kept it. */
static int vpci_negotiate(const struct vpci *v, uint32_t features)
{
    mmio_write8(v->common + 0x14, 0);
    mmio_write8(v->common + 0x14, 1);
    mmio_write8(v->common + 0x14, 3);
    mmio_write32(v->common + 0x08, 1);
    mmio_write32(v->common + 0x0c, 1); /* VIRTIO_F_VERSION_1 */
    mmio_write32(v->common + 0x08, 0);
    mmio_write32(v->common + 0x0c, features);
    mmio_write8(v->common + 0x14, 0xb);
    return mmio8(v->common + 0x14) == 0xb;
}

/* Give the device queue `index` on `q`, and enable it. */
static void vpci_queue(const struct vpci *v, uint16_t index, struct vq *q)
{
    q->index = index;
    mmio_write16(v->common + 0x16, index);
    mmio_write16(v->common + 0x18, VQ_SIZE);
    mmio_write32(v->common + 0x20, (uint32_t)q->desc);
    mmio_write32(v->common + 0x24, 0);
    mmio_write32(v->common + 0x28, (uint32_t)q->avail);
    mmio_write32(v->common + 0x2c, 0);
    mmio_write32(v->common + 0x30, (uint32_t)q->used);
    mmio_write32(v->common + 0x34, 0);
    q->notify = v->notify + (*(volatile uint16_t *)(v->common + 0x1e)) * v->multiplier;
    mmio_write16(v->common + 0x1c, 1);
}

static void vpci_driver_ok(const struct vpci *v) { mmio_write8(v->common + 0x14, 0xf); }

/* Make the chain at descriptor `head` available (§2.7.13) and ring the queue's doorbell with
 * its index (§4.1.5.2). */
static void vq_submit(struct vq *q, uint16_t head)
{
    q->avail[2 + q->next_avail % VQ_SIZE] = head;
    __asm__ volatile("" ::: "memory");
    q->avail[1] = ++q->next_avail;
    __asm__ volatile("" ::: "memory");
    mmio_write16(q->notify, q->index);
}

/* The used ring's index: its second 16-bit field (§2.7.8). What the device wrote before it is
 * read after it. */
static uint16_t vq_used_idx(const struct vq *q)
{
    uint16_t idx = (uint16_t)(q->used[0] >> 16);
    __asm__ volatile("" ::: "memory");
    return idx;
}

/* virtio-blk (virtio 1.2 §5.2): write sector 1, flush, read it back, ask for the ID, and read
 * past the end, which must answer IOERR. */
static struct vq blk_q;
static uint8_t blk_header[16] __attribute__((aligned(16)));
static uint8_t blk_data[1024], blk_check[1024];
static volatile uint8_t blk_status;

/* One request: a header of type and sector, data of len bytes (device-writable if in), the
 * status byte. Returns the status, or 0xff if the device never answered. */
static uint8_t blk_request(uint32_t type, uint32_t sector, void *data, uint32_t len, int in)
{
    memset(blk_header, 0, sizeof blk_header);
    memcpy(blk_header, &type, 4);
    memcpy(blk_header + 8, &sector, 4);
    blk_status = 0xff;
    uint32_t n = 0;
    blk_q.desc[n] = (struct vq_desc){ (uint32_t)blk_header, 16, 1, n + 1 };
    n++;
    if (len) {
        blk_q.desc[n] = (struct vq_desc){ (uint32_t)data, len, (uint16_t)(1 | (in ? 2 : 0)), n + 1 };
        n++;
    }
    blk_q.desc[n] = (struct vq_desc){ (uint32_t)&blk_status, 1, 2, 0 };
    vq_submit(&blk_q, 0);
    for (uint32_t spin = 0; spin < 2000000; spin++)
        if (vq_used_idx(&blk_q) == blk_q.next_avail)
            return blk_status;
    return 0xff;
}

static void check_disk(void)
{
    struct vpci v;
    if (!vpci_find(&v, 2, "disk", "virtio-blk"))
        return;
    uint32_t sectors = mmio32(v.device);
    if (!check(vpci_negotiate(&v, 0), "disk: FEATURES_OK, %u sectors", sectors))
        return;
    vpci_queue(&v, 0, &blk_q);
    vpci_driver_ok(&v);
    for (uint32_t i = 0; i < 512; i++)
        blk_data[i] = (uint8_t)(i * 7 + 1);
    uint8_t st = blk_request(1, 1, blk_data, 512, 0);
    check(st == 0, "disk: sector 1 written, status %u", st);
    st = blk_request(4, 0, 0, 0, 0);
    check(st == 0, "disk: flushed, status %u", st);
    memset(blk_check, 0, sizeof blk_check);
    st = blk_request(0, 1, blk_check, 512, 1);
    check(st == 0 && fw_equal(blk_check, blk_data, 512), "disk: sector 1 read back, status %u", st);
    memset(blk_check, 0, 21);
    st = blk_request(8, 0, blk_check, 20, 1);
    check(st == 0 && blk_check[0] != 0, "disk: ID '%s', status %u", (const char *)blk_check, st);
    st = blk_request(0, sectors, blk_check, 512, 1);
    check(st == 1, "disk: a read past the end answered IOERR (status %u)", st);
}

/* virtio-net (virtio 1.2 §5.1) on a network the host's kernel is on (a tap): the kernel
 * answers an ARP request (RFC 826) for its own address. Receive buffers go on receiveq1
 * (queue 0), the request on transmitq1 (queue 1), each frame behind the 12-byte
 * virtio_net_hdr (§5.1.6), all zero: no offloads were negotiated. Frames other than the
 * answer (the host's IPv6 neighbour discovery, say) are skipped and their buffers given
 * back. */
#define NET_HDR 12
#define NET_FRAME 1514
#define VIRTIO_NET_F_MAC 5
#define ETH_ARP 0x0806

static struct vq net_rx, net_tx;
static uint8_t net_rx_buf[VQ_SIZE][NET_HDR + NET_FRAME];
static uint8_t net_tx_buf[NET_HDR + 60];

/* A dotted quad into `ip`; whether `s` held one. */
static int parse_ip(const char *s, uint8_t ip[4])
{
    for (int i = 0; i < 4; i++) {
        uint32_t n = 0, digits = 0;
        while (s && *s >= '0' && *s <= '9' && digits < 4) {
            n = n * 10 + (uint32_t)(*s++ - '0');
            digits++;
        }
        if (!digits || n > 255 || (i < 3 && *s++ != '.'))
            return 0;
        ip[i] = (uint8_t)n;
    }
    return 1;
}

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }

/* Whether `f` (len bytes) is the ARP reply from `peer` to `ip` at `mac`; its sender's MAC
 * into `peer_mac`. */
static int arp_reply(const uint8_t *f, uint32_t len, const uint8_t mac[6], const uint8_t ip[4],
                     const uint8_t peer[4], uint8_t peer_mac[6])
{
    const uint8_t *arp = f + 14;
    if (len < 42 || get16(f + 12) != ETH_ARP || get16(arp + 6) != 2 || !fw_equal(f, mac, 6) ||
        !fw_equal(arp + 14, peer, 4) || !fw_equal(arp + 18, mac, 6) || !fw_equal(arp + 24, ip, 4))
        return 0;
    memcpy(peer_mac, arp + 8, 6);
    return 1;
}

/* Send the ARP request for `peer` from `mac` at `ip`, and wait for it to be taken. */
static int arp_request(const uint8_t mac[6], const uint8_t ip[4], const uint8_t peer[4])
{
    uint8_t *f = net_tx_buf + NET_HDR, *arp = f + 14;
    memset(net_tx_buf, 0, sizeof net_tx_buf);
    memset(f, 0xff, 6); /* broadcast */
    memcpy(f + 6, mac, 6);
    put16(f + 12, ETH_ARP);
    put16(arp, 1);         /* Ethernet */
    put16(arp + 2, 0x0800); /* IPv4 */
    arp[4] = 6;
    arp[5] = 4;
    put16(arp + 6, 1);     /* request */
    memcpy(arp + 8, mac, 6);
    memcpy(arp + 14, ip, 4);
    memcpy(arp + 24, peer, 4);
    net_tx.desc[0] = (struct vq_desc){ (uint32_t)net_tx_buf, sizeof net_tx_buf, 0, 0 };
    vq_submit(&net_tx, 0);
    for (uint32_t spin = 0; spin < 2000000; spin++)
        if (vq_used_idx(&net_tx) == net_tx.next_avail)
            return 1;
    return 0;
}

/* Wait up to `ticks` of the PM timer for the ARP reply; buffers of other frames go back. */
static int await_arp_reply(uint32_t ticks, const uint8_t mac[6], const uint8_t ip[4],
                           const uint8_t peer[4], uint8_t peer_mac[6])
{
    uint32_t waited = 0, last = pm_timer();
    while (waited < ticks) {
        while (net_rx.used_seen != vq_used_idx(&net_rx)) {
            uint32_t slot = 1 + 2 * (net_rx.used_seen++ % VQ_SIZE);
            uint32_t id = net_rx.used[slot], len = net_rx.used[slot + 1];
            if (id >= VQ_SIZE)
                return 0;
            if (len > NET_HDR &&
                arp_reply(net_rx_buf[id] + NET_HDR, len - NET_HDR, mac, ip, peer, peer_mac))
                return 1;
            vq_submit(&net_rx, (uint16_t)id);
        }
        uint32_t now = pm_timer();
        waited += (now - last) & pm_timer_mask;
        last = now;
    }
    return 0;
}

static void check_net(void)
{
    uint8_t ip[4], peer[4], mac[6], peer_mac[6] = { 0 };
    if (!check(parse_ip(arg("ip"), ip) && parse_ip(arg("peer"), peer),
               "net: ip=A.B.C.D and peer=A.B.C.D given"))
        return;
    struct vpci v;
    if (!vpci_find(&v, 1, "net", "virtio-net"))
        return;
    for (uint32_t i = 0; i < 6; i++)
        mac[i] = mmio8(v.device + i);
    if (!check(vpci_negotiate(&v, 1u << VIRTIO_NET_F_MAC),
               "net: FEATURES_OK, MAC %02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2],
               mac[3], mac[4], mac[5]))
        return;
    vpci_queue(&v, 0, &net_rx);
    vpci_queue(&v, 1, &net_tx);
    for (uint16_t i = 0; i < VQ_SIZE; i++) {
        net_rx.desc[i] = (struct vq_desc){ (uint32_t)net_rx_buf[i], NET_HDR + NET_FRAME, 2, 0 };
        vq_submit(&net_rx, i);
    }
    vpci_driver_ok(&v);
    /* Three tries a second apart: a host that was still bringing its side up may miss one. */
    int sent = 0, answered = 0;
    for (int try = 0; try < 3 && !answered; try++) {
        sent |= arp_request(mac, ip, peer);
        answered = await_arp_reply(PM_TIMER_HZ, mac, ip, peer, peer_mac);
    }
    check(sent, "net: ARP request for %u.%u.%u.%u sent from %u.%u.%u.%u", peer[0], peer[1],
          peer[2], peer[3], ip[0], ip[1], ip[2], ip[3]);
    check(answered, "net: ARP reply: %u.%u.%u.%u is at %02x:%02x:%02x:%02x:%02x:%02x", peer[0],
          peer[1], peer[2], peer[3], peer_mac[0], peer_mac[1], peer_mac[2], peer_mac[3],
          peer_mac[4], peer_mac[5]);
}

static void finish(void)
{
    print("testkernel: %u passed, %u failed\n", passed, failed);
    if (arg_is("exit", "poweroff")) {
        uint16_t pm1a_cnt = fadt ? (uint16_t)fw_rd32(fadt + 64) : 0x604;
        outw(pm1a_cnt, S5_SLP_TYP << 10 | SLP_EN);
    } else if (arg_is("exit", "reset")) {
        outb(RESET_CONTROL, 0x06);
    } else if (arg_is("exit", "kbd")) {
        outb(I8042_COMMAND, 0xfe);
    } else {
        outb(DEBUG_EXIT, failed ? EXIT_FAIL : EXIT_PASS);
    }
    puts("testkernel: still running after its exit\n");
}

void kmain(uint32_t magic, const struct mb_info *mb)
{
    puts("testkernel: multiboot test kernel\n");
    if (!check(magic == MB_BOOTLOADER_MAGIC, "multiboot: EAX %x", magic))
        goto out;
    if (mb->flags & MB_INFO_CMDLINE)
        cmdline = (const char *)mb->cmdline;
    print("testkernel: command line '%s'\n", cmdline);
    uint32_t cpus = arg_number("cpus", 1), mem = arg_number("mem", 0);

    check_multiboot(mb, mem);
    check_fw_cfg(cpus, mem);
    check_acpi();
    check_fadt();
    if (pm_timer_port) {
        uint32_t before = pm_timer();
        check_madt(cpus);
        check_mcfg(arg_number("ecam", 1));
        check_dmar(arg_number("iommu", 0));
        uint32_t ticks = (pm_timer() - before) & pm_timer_mask;
        check(ticks > 0 && ticks < pm_timer_mask / 2, "pm timer: %u ticks across the last checks",
              ticks);
        if (cpus > 1)
            check_smp(cpus);
        if (arg_number("echo", 0))
            check_echo();
        if (arg_number("disk", 0))
            check_disk();
        if (arg_number("net", 0))
            check_net();
    }
out:
    finish();
    for (;;)
        __asm__ volatile("cli; hlt");
}
