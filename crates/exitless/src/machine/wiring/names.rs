//! Device names used on the buses, in exit reports and as snapshot ids.

use crate::pci::PciAddress;

/// Ports 0xCF8..=0xCFF.
pub const PCI_PIO: &str = "pci-cf8";
/// The ECAM window.
pub const PCI_ECAM: &str = "pci-ecam";
/// Every decoded BAR (each its own bus range).
pub const PCI_BARS: &str = "pci-bars";
/// Bus 0 in a snapshot: every function's configuration space and state, by address.
pub const PCI_ROOT: &str = "pci";
/// The console.
pub const SERIAL: &str = "serial";
/// The probe's phase ports.
pub const PROBE_PORTS: &str = "probe-ports";
/// The VT-d remapping unit's register page.
pub const IOMMU: &str = "iommu";
/// The userspace IOAPIC, under a split irqchip.
pub const IOAPIC: &str = "ioapic";

/// A virtio-pci function: its guest errors and its thread's CPU time are counted under
/// this name (its registers are reached through `PCI_BARS`).
pub fn virtio_pci(at: PciAddress) -> String {
    format!("virtio-pci.{at}")
}
/// QEMU's test exit.
pub const DEBUG_EXIT: &str = "debug-exit";
/// QEMU's panic port.
pub const PVPANIC: &str = "pvpanic";
/// QEMU's firmware configuration ports.
pub const FW_CFG: &str = "fw-cfg";
/// The ACPI power-management block.
pub const ACPI_PM: &str = "acpi-pm";
/// The RTC and CMOS at ports 0x70 and 0x71.
pub const RTC: &str = "rtc";
/// The keyboard controller's command port.
pub const I8042: &str = "i8042";
/// The DMA controller's channel 0 page register, with no chip behind it (reads float).
pub const DMA_PAGE: &str = "dma-page";
/// The Super I/O configuration pair at 0x2E, with no chip behind it (reads float).
pub const SUPER_IO: &str = "super-io";
/// The alternate Super I/O configuration pair at 0x4E, likewise.
pub const SUPER_IO_ALTERNATE: &str = "super-io-alt";
/// COM2, COM3 and COM4's ports, with no UART behind them (reads float).
pub const ABSENT_UARTS: [&str; 3] = ["com2-absent", "com3-absent", "com4-absent"];
/// The i8254 PIT's ports, where exitless models it (no KVM PIT).
pub const PIT: &str = "pit";
/// Port B (0x61), the PIT's channel 2 gate and OUT, beside it.
pub const PORT_B: &str = "port-b";
/// The Reset Control Register at 0xCF9 (its state in a snapshot).
pub const RESET_CONTROL: &str = "reset-control";
