//! Base Address Registers: what a device declares, how the registers are laid out and sized,
//! and where a BAR decodes now (PCI 3.0 §6.2.5.1).

use super::{ConfigError, ConfigSpace};
use crate::pci::regs::{
    PCI_BAR_COUNT, PCI_BAR_MEM_PREFETCH, PCI_BAR_MEM_TYPE_64, PCI_BAR_SPACE_IO, PCI_BAR0,
};

/// A BAR as the device declares it (PCI 3.0 §6.2.5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bar {
    /// 32-bit memory BAR, decoded below 4 GiB.
    Memory32 {
        /// Size in bytes, a power of two ≥ 16.
        size: u32,
        /// Reads have no side effects.
        prefetchable: bool,
    },
    /// 64-bit memory BAR, taking two slots.
    Memory64 {
        /// Size in bytes, a power of two ≥ 16.
        size: u64,
        /// Reads have no side effects.
        prefetchable: bool,
    },
    /// I/O BAR, decoded in port space.
    Io {
        /// Size in bytes, a power of two ≥ 4.
        size: u32,
    },
}

/// Where the layout's BARs ended up: (slot index, BAR) for each BAR.
pub type BarSlots = Vec<(usize, Bar)>;

/// Offset of BAR slot `slot` (0..6) in a type-0 header.
fn bar_register(slot: usize) -> u16 {
    assert!(slot < PCI_BAR_COUNT, "BAR slot {slot} out of range");
    PCI_BAR0 + 4 * u16::try_from(slot).expect("asserted < 6")
}

/// Bits 31:0 of `v`.
fn low32(v: u64) -> u32 {
    u32::try_from(v & 0xffff_ffff).expect("masked to 32 bits")
}

/// Bits 63:32 of `v`.
fn high32(v: u64) -> u32 {
    u32::try_from(v >> 32).expect("shifted to 32 bits")
}

impl Bar {
    /// The BAR's size in bytes: how much address space it decodes.
    pub fn size(&self) -> u64 {
        match *self {
            Bar::Memory32 { size, .. } | Bar::Io { size } => size.into(),
            Bar::Memory64 { size, .. } => size,
        }
    }

    /// Whether it decodes I/O space.
    pub fn is_io(&self) -> bool {
        matches!(self, Bar::Io { .. })
    }

    fn slots(&self) -> usize {
        if matches!(self, Bar::Memory64 { .. }) {
            2
        } else {
            1
        }
    }

    /// The smallest size of its kind.
    fn min_size(&self) -> u64 {
        if self.is_io() { 4 } else { 16 }
    }

    /// The read-only low bits of the register (PCI 3.0 §6.2.5.1).
    fn flag_bits(&self) -> u32 {
        let prefetch = |p: bool| if p { PCI_BAR_MEM_PREFETCH } else { 0 };
        match *self {
            Bar::Memory32 { prefetchable, .. } => prefetch(prefetchable),
            Bar::Memory64 { prefetchable, .. } => PCI_BAR_MEM_TYPE_64 | prefetch(prefetchable),
            Bar::Io { .. } => PCI_BAR_SPACE_IO,
        }
    }

    /// Where the flag bits sit: bits 1:0 of an I/O BAR, 3:0 of a memory BAR (PCI 3.0
    /// §6.2.5.1).
    fn flag_mask(&self) -> u32 {
        if self.is_io() { 0x3 } else { 0xf }
    }
}

impl ConfigSpace {
    /// Program `bars` into consecutive slots at `addresses` (one per BAR; a missing one is 0),
    /// with write masks that make all-ones read back the size (PCI 3.0 §6.2.5.1).
    pub(super) fn init_bars(
        &mut self,
        bars: &[Bar],
        addresses: &[u64],
    ) -> Result<BarSlots, ConfigError> {
        let mut slot = 0;
        let mut slots = Vec::new();
        for (index, bar) in bars.iter().enumerate() {
            let (size, min) = (bar.size(), bar.min_size());
            if !size.is_power_of_two() || size < min {
                return Err(ConfigError::BarSize { index, size, min });
            }
            if slot + bar.slots() > PCI_BAR_COUNT {
                return Err(ConfigError::TooManyBars);
            }
            let reg = bar_register(slot);
            let addr_mask = !(size - 1);
            let address = addresses.get(index).copied().unwrap_or(0) & addr_mask;
            self.init_u32(
                reg,
                low32(address) | bar.flag_bits(),
                low32(addr_mask) & !bar.flag_mask(),
            );
            if bar.slots() == 2 {
                self.init_u32(reg + 4, high32(address), high32(addr_mask));
            }
            slots.push((slot, *bar));
            slot += bar.slots();
        }
        Ok(slots)
    }

    /// The address a BAR currently decodes (both slots for a 64-bit BAR).
    pub fn bar_address(&self, slot: usize, bar: &Bar) -> u64 {
        let reg = bar_register(slot);
        let low = self.get_u32(reg);
        let high = if bar.slots() == 2 {
            self.get_u32(reg + 4)
        } else {
            0
        };
        ((u64::from(high) << 32) | u64::from(low & !bar.flag_mask())) & !(bar.size() - 1)
    }
}
