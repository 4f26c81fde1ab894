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
 * describing a live VT-d unit must be there; default 0), intremap=1 (its DMAR must set
 * INTR_REMAP with the IOAPIC in the unit's scope), ioapic=1|2 (take the RTC's interrupts
 * through the IOAPIC; 2: also through the unit's interrupt remapping), echo=1 (read a line from the
 * console), spam=N (print N numbered lines before the checks end, for a console reader that
 * falls behind), disk=1 (drive the first virtio-blk disk; disk_rounds=N: then N write, flush
 * and read-back rounds on sectors 1 to N; disk_resets=N: N rounds that each reset the disk, move
 * its virtio-pci BAR 0 away or back, set it up again and write, flush and read back sector i),
 * disk=reconnect (drive it across a
 * backend's restart: DEVICE_NEEDS_RESET, reset, set up again), net=1 ip=A.B.C.D peer=A.B.C.D (ask
 * the host on the first virtio-net device's network for peer's MAC by ARP, and check the answer;
 * net_rounds=N: then N more requests, each answered),
 * net=reconnect (ask again across a backend's restart, with a round on the disk beside it),
 * net=mq (a card with several queue pairs: ARP answered on pair 1, and on pair 2 once
 * VQ_PAIRS_SET 2 enabled it),
 * dirty=MIB dirty_rounds=N (N rounds each writing one byte in every page of MIB MiB of RAM
 * from 64 MiB, a memory dirtier for live migration's figures),
 * virtio_mmio=0xADDR[,0xADDR...] (virtio-mmio windows to look for those devices in before PCI),
 * exit=debug|poweroff|reset|kbd|panic (how to end; default debug: isa-debug-exit with
 * 0x10 when every check passed, 0x11 otherwise, so the VMM exits with 33 or 35; panic: read
 * the pvpanic port's events and write PANICKED, as Linux's panic notifier does).
 *
 * It prints PASS/FAIL lines on COM1, polled. Everything runs at ring 0, which the KVM of
 * exitless's machines emulates at about a microsecond an instruction (docs/host-kvm.md): the
 * kernel stays small, and its loops are short. */
#include <stdint.h>

#include "testkernel.h"

#define DEBUG_EXIT      0xf4            /* -device isa-debug-exit,iobase=0xf4 */
#define EXIT_PASS       0x10
#define EXIT_FAIL       0x11
#define RESET_CONTROL   0xcf9
#define I8042_COMMAND   0x64
#define PVPANIC         0x505           /* QEMU's -device pvpanic, docs/specs/pvpanic.rst */
#define PVPANIC_PANICKED 1u
#define SLP_EN          (1u << 13)
#define S5_SLP_TYP      0u              /* QEMU's \_S5, and exitless's */

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

uint32_t length(const char *s)
{
    uint32_t n = 0;
    while (s[n])
        n++;
    return n;
}

/* ---- the command line ---- */

const char *cmdline = "";

/* The value of `key=` in the command line (a pointer into it), or 0. */
const char *arg(const char *key)
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


/* spam=N: N numbered lines of 67 bytes, for the VMM's console to carry through a reader that
 * falls behind (none may be lost, none reordered). */
static void spam(uint32_t lines)
{
    for (uint32_t i = 1; i <= lines; i++)
        print("spam %06u of %06u: the quick brown fox jumps over the lazy dog\n", i, lines);
}

/* dirty=MIB dirty_rounds=N: N rounds, each writing its number into one byte of every page of
 * the MIB MiB of RAM from 64 MiB (paging is off: every address is physical) where the round
 * before left its own, then saying so: what a live migration must send again after each
 * round, and a page it lost or sent stale shows as the wrong byte. */
static void dirty(uint32_t mib, uint32_t rounds)
{
    volatile uint8_t *ram = (volatile uint8_t *)(64u << 20);
    uint32_t wrong = 0;
    for (uint32_t r = 1; r <= rounds; r++) {
        for (uint32_t page = 0; page < mib << 8; page++) {
            wrong += ram[page << 12] != (uint8_t)(r - 1);
            ram[page << 12] = (uint8_t)r;
        }
        print("dirty round %06u of %06u\n", r, rounds);
    }
    if (rounds)
        check(wrong == 0, "dirty: %u pages of %u MiB held another round's byte", wrong, mib);
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
    } else if (arg_is("exit", "panic")) {
        print("testkernel: pvpanic events %x\n", inb(PVPANIC));
        outb(PVPANIC, PVPANIC_PANICKED);
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
    check_highmem(mb, arg_number("highmem", 0));
    check_fw_cfg(cpus, mem);
    check_acpi();
    check_fadt();
    check_rtc();
    if (pm_timer_port) {
        uint32_t before = pm_timer();
        check_madt(cpus);
        check_mcfg(arg_number("ecam", 1));
        check_dmar(arg_number("iommu", 0), arg_number("intremap", 0));
        uint32_t ticks = (pm_timer() - before) & pm_timer_mask;
        check(ticks > 0 && ticks < pm_timer_mask / 2, "pm timer: %u ticks across the last checks",
              ticks);
        if (cpus > 1)
            check_smp(cpus);
        if (arg_number("echo", 0))
            check_echo();
        if (arg_number("disk", 0) || arg_is("disk", "reconnect"))
            check_disk(arg_is("disk", "reconnect"));
        disk_rounds(arg_number("disk_rounds", 0));
        disk_resets(arg_number("disk_resets", 0));
        if (arg_number("net", 0) || arg_is("net", "reconnect"))
            check_net(arg_is("net", "reconnect"));
        net_rounds(arg_number("net_rounds", 0));
        if (arg_is("net", "mq"))
            check_net_mq();
        if (arg_number("cpuid", 0))
            check_cpuid();
        if (arg_number("ioapic", 0))
            check_ioapic(arg_number("ioapic", 0) == 2);
    }
    dirty(arg_number("dirty", 0), arg_number("dirty_rounds", 0));
out:
    spam(arg_number("spam", 0));
    finish();
    for (;;)
        __asm__ volatile("cli; hlt");
}
