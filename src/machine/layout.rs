//! The guest-physical map of a machine: RAM from 0, the PCI holes, ECAM, the virtio-mmio
//! windows, the I/O port windows and the interrupt pins, and the allocators that hand out the
//! virtio-mmio windows and their pins (vm-allocator's `AddressAllocator` and `IdAllocator`).
//!
//! The fixed addresses below are what the guest is told (boot info today, ACPI or a command
//! line for Linux later); the allocators only decide which slot inside a window a device gets.

use vm_allocator::{AddressAllocator, AllocPolicy, IdAllocator};

use crate::virtio::regs::VIRTIO_MMIO_WINDOW_SIZE;

/// Guest RAM of a machine unless configured otherwise, from address 0.
pub const DEFAULT_RAM_SIZE: usize = 16 << 20;
/// RAM is mapped in whole pages.
pub const RAM_ALIGN: usize = 0x1000;
/// Memory BARs are placed in this 32-bit hole; RAM must end below it.
pub const PCI_MMIO_WINDOW: (u64, u64) = (0xc000_0000, 0xe000_0000);
/// ECAM window for bus 0 (1 MiB: 32 devices × 8 functions × 4 KiB).
pub const ECAM_BASE: u64 = 0xe000_0000;
/// The last bus the ECAM window covers (and the host bridge decodes): bus 0 only.
pub const ECAM_LAST_BUS: u8 = 0;
/// Bytes of the ECAM window: 1 MiB per bus (PCIe 4.0 §7.2.2).
pub const ECAM_SIZE: u64 = (ECAM_LAST_BUS as u64 + 1) << 20;
/// I/O BARs are placed in ports `PCI_IO_BASE..PCI_IO_BASE + PCI_IO_LEN`.
pub const PCI_IO_BASE: u16 = 0xc000;
/// Length of the I/O BAR window.
pub const PCI_IO_LEN: u16 = 0x4000;
/// IOAPIC pin of the serial console (COM1's ISA IRQ).
pub const SERIAL_GSI: u32 = 4;
/// virtio-mmio devices, one `VIRTIO_MMIO_WINDOW_SIZE` window each, after the ECAM window.
pub const VIRTIO_MMIO_BASE: u64 = 0xe010_0000;
/// How many virtio-mmio windows the map has room for (one IOAPIC pin each, below).
pub const VIRTIO_MMIO_SLOTS: u32 = 8;
/// IOAPIC pin of the first virtio-mmio device's line; the next ones follow. Pins 16..23
/// have no 8259 PIC input behind them, so a line can only arrive through the IOAPIC.
pub const VIRTIO_MMIO_GSI_BASE: u32 = 16;
/// The VT-d remapping unit's register page, where QEMU's q35 puts it.
pub const IOMMU_BASE: u64 = 0xfed9_0000;
/// PCI device number of the first virtio-pci function; the next ones follow.
pub const VIRTIO_PCI_FIRST_DEVICE: u8 = 3;
/// MAC address of the first virtio-net device with no link; the last byte counts up. A tap's
/// device keeps the first three bytes (`config::tap_mac`).
pub const VIRTIO_NET_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x7e, 0x57, 0x00];

/// Why a layout cannot be made or a resource given out.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// RAM that is empty, not whole pages, or runs into the PCI hole.
    #[error(
        "RAM size {0:#x} bytes: it must be a non-zero multiple of {RAM_ALIGN:#x} and end at or \
         below the PCI hole at {hole:#x}",
        hole = PCI_MMIO_WINDOW.0
    )]
    RamSize(usize),
    /// Every virtio-mmio window (or its pin) is taken.
    #[error("no virtio-mmio window left: the machine has {VIRTIO_MMIO_SLOTS}")]
    VirtioMmioFull,
}

/// Where one virtio-mmio device sits and which IOAPIC pin carries its legacy line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmioSlot {
    /// Guest-physical base of its register window.
    pub base: u64,
    /// Length of the window.
    pub size: u64,
    /// IOAPIC pin (GSI) of its legacy interrupt line.
    pub gsi: u32,
}

/// The map of one machine: its RAM size, and the virtio-mmio slots given out so far.
#[derive(Debug)]
pub struct MemoryLayout {
    ram_size: usize,
    ecam: Option<u64>,
    iommu: Option<u64>,
    mmio_windows: AddressAllocator,
    mmio_gsis: IdAllocator,
    virtio_mmio: Vec<MmioSlot>,
}

impl MemoryLayout {
    /// A map with `ram_size` bytes of RAM from 0, ECAM described at [`ECAM_BASE`] if `ecam`.
    pub fn new(ram_size: usize, ecam: bool) -> Result<Self, LayoutError> {
        let fits = ram_size != 0
            && ram_size.is_multiple_of(RAM_ALIGN)
            && u64::try_from(ram_size).is_ok_and(|r| r <= PCI_MMIO_WINDOW.0);
        if !fits {
            return Err(LayoutError::RamSize(ram_size));
        }
        let window = u64::from(VIRTIO_MMIO_WINDOW_SIZE);
        let mmio_windows =
            AddressAllocator::new(VIRTIO_MMIO_BASE, window * u64::from(VIRTIO_MMIO_SLOTS))
                .expect("the virtio-mmio window is a valid range");
        let mmio_gsis = IdAllocator::new(
            VIRTIO_MMIO_GSI_BASE,
            VIRTIO_MMIO_GSI_BASE + VIRTIO_MMIO_SLOTS - 1,
        )
        .expect("the virtio-mmio pins are a valid range");
        Ok(MemoryLayout {
            ram_size,
            ecam: ecam.then_some(ECAM_BASE),
            iommu: None,
            mmio_windows,
            mmio_gsis,
            virtio_mmio: Vec::new(),
        })
    }

    /// Bytes of RAM, from guest-physical 0.
    pub fn ram_size(&self) -> usize {
        self.ram_size
    }

    /// Base of the ECAM window, if one is described.
    pub fn ecam_base(&self) -> Option<u64> {
        self.ecam
    }

    /// Place the IOMMU's register page; returns its base.
    pub fn place_iommu(&mut self) -> u64 {
        *self.iommu.insert(IOMMU_BASE)
    }

    /// Base of the IOMMU's register page, if the machine has one.
    pub fn iommu_base(&self) -> Option<u64> {
        self.iommu
    }

    /// Give the next virtio-mmio device its window and pin. Windows and pins are handed out
    /// in order, so the `n`th device always lands at the same place.
    pub fn allocate_virtio_mmio(&mut self) -> Result<MmioSlot, LayoutError> {
        let size = u64::from(VIRTIO_MMIO_WINDOW_SIZE);
        let range = self
            .mmio_windows
            .allocate(size, size, AllocPolicy::FirstMatch)
            .map_err(|_| LayoutError::VirtioMmioFull)?;
        let gsi = match self.mmio_gsis.allocate_id() {
            Ok(gsi) => gsi,
            Err(_) => {
                // Cannot happen (as many pins as windows), but give the window back anyway.
                let _ = self.mmio_windows.free(&range);
                return Err(LayoutError::VirtioMmioFull);
            }
        };
        let slot = MmioSlot {
            base: range.start(),
            size,
            gsi,
        };
        self.virtio_mmio.push(slot);
        Ok(slot)
    }

    /// The virtio-mmio slots given out, in order.
    pub fn virtio_mmio(&self) -> &[MmioSlot] {
        &self.virtio_mmio
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_must_be_whole_pages_below_the_pci_hole() {
        assert!(MemoryLayout::new(DEFAULT_RAM_SIZE, true).is_ok());
        for bad in [0, 0x1234, 0xc000_1000] {
            let e = MemoryLayout::new(bad, true).expect_err("invalid RAM size");
            assert!(e.to_string().contains("PCI hole"), "{e}");
        }
        assert!(
            MemoryLayout::new(0xc000_0000, false).is_ok(),
            "RAM up to the hole"
        );
    }

    #[test]
    fn virtio_mmio_slots_follow_each_other_until_the_window_is_full() {
        let mut l = MemoryLayout::new(DEFAULT_RAM_SIZE, false).unwrap();
        let window = u64::from(VIRTIO_MMIO_WINDOW_SIZE);
        for n in 0..VIRTIO_MMIO_SLOTS {
            let slot = l.allocate_virtio_mmio().unwrap();
            assert_eq!(slot.base, VIRTIO_MMIO_BASE + u64::from(n) * window);
            assert_eq!(slot.gsi, VIRTIO_MMIO_GSI_BASE + n);
        }
        assert!(matches!(
            l.allocate_virtio_mmio(),
            Err(LayoutError::VirtioMmioFull)
        ));
        assert_eq!(l.virtio_mmio().len(), VIRTIO_MMIO_SLOTS as usize);
        assert!(
            l.virtio_mmio().last().unwrap().base + window <= 0xe020_0000,
            "the windows stay inside the 1 MiB after ECAM"
        );
    }
}
