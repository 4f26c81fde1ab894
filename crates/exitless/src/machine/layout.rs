//! The guest-physical map of a machine: RAM from 0 up to the 32-bit PCI hole and the rest from
//! 4 GiB, the PCI holes (the 32-bit one and a 64-bit one above RAM), ECAM, the virtio-mmio
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
/// Memory BARs are placed in this 32-bit hole; RAM below 4 GiB ends where it starts.
pub const PCI_MMIO_WINDOW: (u64, u64) = (0xc000_0000, 0xe000_0000);
/// RAM past the 32-bit hole resumes here, as on every PC (the hole, ECAM, the IOAPIC, the local
/// APIC and the BIOS flash all sit in the last GiB below 4 GiB).
pub const HIGH_RAM_BASE: u64 = 1 << 32;
/// The 64-bit BAR window starts on the first boundary of this size above RAM.
pub const PCI_MMIO64_ALIGN: u64 = 1 << 30;
/// Bytes of the 64-bit BAR window.
pub const PCI_MMIO64_SIZE: u64 = 16 << 30;
/// Guest-physical addresses the map keeps below: 39 bits, the physical address width of
/// Intel's client processors (CPUID 0x80000008 EAX[7:0]; server parts and AMD's report more),
/// so that RAM and the 64-bit window stay addressable on the hosts exitless runs on.
pub const MAX_PHYS_ADDR: u64 = 1 << 39;
/// The most RAM a layout holds: what fits below [`MAX_PHYS_ADDR`] with the 64-bit window.
pub const MAX_RAM_SIZE: u64 =
    MAX_PHYS_ADDR - PCI_MMIO64_SIZE - PCI_MMIO64_ALIGN - (HIGH_RAM_BASE - PCI_MMIO_WINDOW.0);
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
    /// RAM that is empty, not whole pages, or more than the address space holds.
    #[error(
        "RAM size {0:#x} bytes: it must be a non-zero multiple of {RAM_ALIGN:#x} and at most \
         {MAX_RAM_SIZE:#x}"
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
    /// A map with `ram_size` bytes of RAM, from 0 up to the PCI hole and the rest from
    /// [`HIGH_RAM_BASE`]; ECAM described at [`ECAM_BASE`] if `ecam`.
    pub fn new(ram_size: usize, ecam: bool) -> Result<Self, LayoutError> {
        let fits = ram_size != 0
            && ram_size.is_multiple_of(RAM_ALIGN)
            && u64::try_from(ram_size).is_ok_and(|r| r <= MAX_RAM_SIZE);
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

    /// Bytes of RAM, below and above 4 GiB together.
    pub fn ram_size(&self) -> usize {
        self.ram_size
    }

    /// Where RAM below 4 GiB ends: the whole RAM, or the start of the PCI hole.
    pub fn low_ram_end(&self) -> u64 {
        low_ram_end(self.ram_size)
    }

    /// RAM above 4 GiB, as `(base, bytes)`; `None` when all of it is below the hole.
    pub fn high_ram(&self) -> Option<(u64, u64)> {
        let high = self.ram_size as u64 - self.low_ram_end();
        (high != 0).then_some((HIGH_RAM_BASE, high))
    }

    /// The RAM regions, `(guest-physical base, bytes)`, in address order: the one from 0, and
    /// the one from 4 GiB if RAM runs past the hole.
    pub fn ram_regions(&self) -> Vec<(u64, usize)> {
        let low = (0, usize::try_from(self.low_ram_end()).expect("below 4 GiB"));
        let high = self.high_ram().map(|(base, len)| {
            (
                base,
                usize::try_from(len).expect("the RAM size was a usize"),
            )
        });
        std::iter::once(low).chain(high).collect()
    }

    /// The 64-bit BAR window, `(start, end)`: [`PCI_MMIO64_SIZE`] bytes from the first
    /// [`PCI_MMIO64_ALIGN`] boundary above RAM. Only a machine with RAM above 4 GiB has one:
    /// one whose RAM ends below the hole keeps every BAR where it always was.
    pub fn mmio64_window(&self) -> Option<(u64, u64)> {
        let (base, len) = self.high_ram()?;
        let start = (base + len).next_multiple_of(PCI_MMIO64_ALIGN);
        Some((start, start + PCI_MMIO64_SIZE))
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

/// Where RAM below 4 GiB ends for a machine of `ram_size` bytes: RAM stops at the 32-bit
/// PCI hole and resumes at [`HIGH_RAM_BASE`]. Everything a 32-bit loader places goes below it.
pub fn low_ram_end(ram_size: usize) -> u64 {
    (ram_size as u64).min(PCI_MMIO_WINDOW.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_must_be_whole_pages_that_fit_the_address_space() {
        assert!(MemoryLayout::new(DEFAULT_RAM_SIZE, true).is_ok());
        let too_much = usize::try_from(MAX_RAM_SIZE).unwrap() + RAM_ALIGN;
        for bad in [0, 0x1234, too_much] {
            let e = MemoryLayout::new(bad, true).expect_err("invalid RAM size");
            assert!(e.to_string().contains("multiple of"), "{e}");
        }
        let most = MemoryLayout::new(usize::try_from(MAX_RAM_SIZE).unwrap(), false).unwrap();
        assert!(most.mmio64_window().unwrap().1 <= MAX_PHYS_ADDR);
    }

    #[test]
    fn ram_up_to_the_hole_is_one_region_without_a_64_bit_window() {
        let l = MemoryLayout::new(0xc000_0000, false).unwrap();
        assert_eq!(l.ram_regions(), vec![(0, 0xc000_0000)]);
        assert_eq!((l.low_ram_end(), l.high_ram()), (0xc000_0000, None));
        assert_eq!(l.mmio64_window(), None);
    }

    #[test]
    fn ram_past_the_hole_resumes_at_4_gib_with_the_64_bit_window_above_it() {
        // 4.5 GiB: 3 GiB below the hole, 1.5 GiB from 4 GiB.
        let l = MemoryLayout::new(4608 << 20, true).unwrap();
        assert_eq!(
            l.ram_regions(),
            vec![(0, 0xc000_0000), (HIGH_RAM_BASE, 0x6000_0000)]
        );
        assert_eq!(l.low_ram_end(), PCI_MMIO_WINDOW.0);
        assert_eq!(l.high_ram(), Some((HIGH_RAM_BASE, 0x6000_0000)));
        let (start, end) = l.mmio64_window().unwrap();
        assert_eq!(
            start, 0x1_8000_0000,
            "the first GiB boundary above 0x1_6000_0000"
        );
        assert_eq!(end - start, PCI_MMIO64_SIZE);
        let total: usize = l.ram_regions().iter().map(|r| r.1).sum();
        assert_eq!(total, 4608 << 20);
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
