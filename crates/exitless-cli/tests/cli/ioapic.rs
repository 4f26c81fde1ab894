//! The IOAPIC as the test kernel sees it: KVM's own on a plain machine, exitless's on a split
//! irqchip with `--iommu`, where the DMAR names it in the unit's scope and sets INTR_REMAP and
//! its remappable entries are delivered through IRTEs (docs/iommu.md, the split irqchip).

use std::path::Path;
use std::process::{Command, Stdio};

/// The test kernel's `exit=debug` status when every check passed: (0x10 << 1) | 1.
const PASSED: i32 = 0x21;

/// `exitless run ARGS` on the test kernel with `cmdline`; it must pass every check, silently
/// on stderr. Returns its console.
fn passes(args: &[&str], cmdline: &str) -> String {
    let exitless = env!("CARGO_BIN_EXE_exitless");
    let elf = Path::new(exitless).with_file_name("testkernel.elf");
    let out = Command::new(exitless)
        .args(["run", "--timeout", "60", "--kernel"])
        .arg(elf)
        .args(["--cmdline", cmdline])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("exitless runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.code() == Some(PASSED) && !stdout.contains("FAIL ") && stderr.is_empty(),
        "{}:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}

fn assert_lines(console: &str, lines: &[&str]) {
    for line in lines {
        assert!(console.contains(line), "{line:?} in:\n{console}");
    }
}

#[test]
fn kvms_ioapic_delivers_the_rtc_edge_and_level_triggered_and_the_pits_tick() {
    let console = passes(&[], "ioapic=1");
    assert_lines(
        &console,
        &[
            "PASS ioapic: 3 edge-triggered RTC interrupts on pin 8",
            "PASS ioapic: 3 level-triggered RTC interrupts, each EOI clearing remote IRR",
            "PASS ioapic: 3 PIT channel 0 interrupts on pin 2, each awaited in hlt",
        ],
    );
}

#[test]
fn with_the_iommu_the_ioapic_and_pit_are_the_vmms_and_its_entries_are_remapped() {
    let console = passes(&["--iommu"], "iommu=1 intremap=1 ioapic=2");
    assert_lines(
        &console,
        &[
            "PASS dmar: INTR_REMAP, x2APIC opt-out clear, the IOAPIC in the DRHD's scope as ff:00.0",
            "PASS ioapic: 3 edge-triggered RTC interrupts on pin 8",
            "PASS ioapic: 3 level-triggered RTC interrupts, each EOI clearing remote IRR",
            // The split irqchip has no KVM PIT: exitless's own raises IRQ 0.
            "PASS ioapic: 3 PIT channel 0 interrupts on pin 2, each awaited in hlt",
            "PASS ioapic: 3 level-triggered interrupts through IRTE 5 (remappable RTE, source-id ff00)",
            "PASS ioapic: 3 edge-triggered interrupts on the IRTE's vector 42, none on the RTE's",
        ],
    );
}
