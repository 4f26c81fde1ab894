/* The exitless probe guest: runs at CPL 3, executes the ops the VMM put at OPS_ADDR and writes
 * their results at RESULTS_ADDR (contract: crates/exitless-contract/src/lib.rs, via the generated contract.h).
 *
 * It reads PCI configuration space by configuration mechanism #1 (ports 0xCF8/0xCFC) or
 * through the ECAM window, drives virtio-net over virtio-mmio and virtio-pci (behind a VT-d
 * unit if asked), programs MSI-X tables, attacks every device window, and times each op with
 * rdtsc, which runs natively at CPL 3 on this host.
 *
 * The probe is one translation unit: the files below hold one concern each and are included
 * in the order they build on each other, each using only those above it. One unit lets gcc
 * inline across concerns as it must for the timed loops: cfg_read into OP_CFG_READ_LOOP, each
 * op with a loop into run_op, the ring helpers into the virtio-net ops. */

#include "cpu.h"

#include "pci.c"
#include "irq.c"
#include "vtd.c"
#include "vtd_ir.c"

#include "virtio.c"
#include "virtio_mmio.c"
#include "virtio_mmio_msi.c"
#include "virtio_pci.c"
#include "virtio_net.c"

/* When the running op's timed part began: ops with untimed set-up move it forward. */
static u64 op_start;

#include "icmp.c"
#include "msix.c"
#include "hostile.c"
#include "interpreter.c"
#include "qemu_boot.c"

/* End the run: exitless stops at PORT_DONE; QEMU ignores that port and stops at its
 * isa-debug-exit, exiting with (status << 1) | 1. */
static void done(u64 status)
{
    outl(PORT_DONE, (u32)status);
    outl(QEMU_DEBUG_EXIT_PORT, (u32)status);
}

void probe_main(u64 loader_magic);

/* `loader_magic`: MULTIBOOT_BOOTLOADER_MAGIC when QEMU's multiboot loader started the probe
 * (entry.S), 0 when exitless did and wrote the boot info and the ops itself. */
void probe_main(u64 loader_magic)
{
    under_qemu = loader_magic == MULTIBOOT_BOOTLOADER_MAGIC;
    if (under_qemu) {
        map_high_memory();
        const char *missing = qemu_boot_info();
        if (missing) {
            serial_puts("exitless probe: ");
            serial_puts(missing);
            serial_puts("\n");
            done(DONE_BAD_BOOT_INFO);
            return;
        }
    }
    if (boot->magic != BOOT_INFO_MAGIC) {
        done(DONE_BAD_BOOT_INFO);
        return;
    }
    interrupts_init();
    serial_puts("exitless probe: running\n");
    const struct op *ops = (const struct op *)OPS_ADDR;
    struct op_result *results = (struct op_result *)RESULTS_ADDR;
    u64 count = boot->op_count < MAX_OPS ? boot->op_count : MAX_OPS;
    for (u64 i = 0; i < count; i++) {
        outl(PORT_PHASE_BEGIN, (u32)i);
        run_op(&ops[i], &results[i]);
        outl(PORT_PHASE_END, (u32)i);
    }
    serial_puts("exitless probe: done\n");
    if (under_qemu)
        dump_results(ops, results, count);
    done(DONE_OK);
}
