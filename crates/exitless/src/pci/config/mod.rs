//! Configuration space: the bytes, and what a guest write may change.
//!
//! Every function's 4 KiB lives in one [`ConfigWindow`] laid out exactly as ECAM addresses it.
//! That window *is* the ECAM shadow: in shadow mode the VMM maps it into the guest as a read-only
//! memslot, so there is a single copy of each register and a stale read is impossible. PIO and
//! trapped ECAM read the same bytes.
//!
//! A write goes through two byte masks, as in real hardware: `wmask` (bits the guest may set)
//! and `w1cmask` (RW1C bits: writing 1 clears). BAR sizing needs nothing more: a BAR's `wmask`
//! holds its address bits, so writing all-ones reads back the size mask (PCI 3.0 §6.2.5.1).

mod bar;
mod capability;
mod persist;
#[cfg(test)]
mod tests;
mod window;

use std::sync::Arc;

pub use bar::{Bar, BarSlots};
pub use capability::{Capability, ExtCapability};
pub use window::{ConfigWindow, FUNCTIONS_PER_BUS};

use crate::pci::regs::*;

/// A function's configuration space through ECAM: 4 KiB (PCIe 4.0 §7.2.2).
const FUNCTION_SIZE: usize = PCI_CFG_SPACE_EXP_SIZE as usize;

/// Whether a configuration access of `len` bytes at `offset` touches any of the `size` bytes
/// at `start`: whether the two byte ranges overlap. Empty ranges touch nothing.
///
/// ```
/// use exitless::pci::config::touches;
/// use exitless::pci::regs::{PCI_BAR0, PCI_COMMAND};
///
/// assert!(touches(PCI_COMMAND, 4, PCI_COMMAND, 2)); // a dword write at Command
/// assert!(touches(PCI_BAR0 + 4, 1, PCI_BAR0, 8)); // a byte of a 64-bit BAR's high half
/// assert!(!touches(PCI_COMMAND + 2, 2, PCI_COMMAND, 2)); // Status, beside Command
/// assert!(!touches(PCI_COMMAND, 0, PCI_COMMAND, 2));
/// assert!(touches(u16::MAX, usize::MAX, 0, usize::MAX)); // no overflow
/// ```
pub fn touches(offset: u16, len: usize, start: u16, size: usize) -> bool {
    let (offset, start) = (usize::from(offset), usize::from(start));
    // The u16 side of each sum is below usize::MAX, so a saturated sum compares as the true one.
    offset < start.saturating_add(size) && start < offset.saturating_add(len)
}

/// Errors building configuration space.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Cannot allocate the configuration window.
    #[error("cannot allocate the PCI configuration window: {0}")]
    Alloc(#[from] vm_memory::mmap::MmapRegionError),
    /// A BAR size that is not a power of two of at least the minimum for its kind.
    #[error("BAR {index}: size {size:#x} is not a power of two ≥ {min:#x}")]
    BarSize {
        /// The BAR's index in the layout.
        index: usize,
        /// The size the layout asked for.
        size: u64,
        /// Smallest size allowed for the kind.
        min: u64,
    },
    /// More BAR slots than a type-0 header has.
    #[error("the BARs need more than the 6 slots of a type-0 header")]
    TooManyBars,
    /// Capabilities that do not fit where they must go.
    #[error("capabilities do not fit in configuration space")]
    CapabilitiesOverflow,
    /// Extended capabilities on a function without a PCI Express capability: software only
    /// looks past 256 bytes on PCIe functions (PCIe 4.0 §7.5.3, §7.6).
    #[error("extended capabilities need a PCI Express capability")]
    ExtCapabilitiesWithoutPcie,
}

/// Everything that describes a type-0 function's configuration space.
#[derive(Clone, Debug, Default)]
pub struct FunctionLayout {
    /// Vendor ID (PCI 3.0 §6.2.1); like every ID here, read-only to the guest.
    pub vendor_id: u16,
    /// Device ID, chosen by the vendor (PCI 3.0 §6.2.1).
    pub device_id: u16,
    /// Class code: base class, sub-class, programming interface (24 bits).
    pub class_code: u32,
    /// Revision ID, chosen by the vendor (PCI 3.0 §6.2.1).
    pub revision: u8,
    /// Subsystem vendor ID (PCI 3.0 §6.2.4).
    pub subsystem_vendor_id: u16,
    /// Subsystem ID, chosen by the subsystem vendor (PCI 3.0 §6.2.4).
    pub subsystem_id: u16,
    /// BARs in slot order; a 64-bit one takes two slots.
    pub bars: Vec<Bar>,
    /// Standard capabilities, chained from offset 0x40.
    pub capabilities: Vec<Capability>,
    /// Extended capabilities, chained from offset 0x100.
    pub ext_capabilities: Vec<ExtCapability>,
}

/// Command register bits the guest may write (PCI 3.0 §6.2.2): I/O space, memory space, bus
/// master, and bits 6 (parity error response), 8 (SERR# enable), 10 (interrupt disable). The
/// others are hardwired to 0.
const COMMAND_WMASK: u16 =
    PCI_COMMAND_IO | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER | 1 << 6 | 1 << 8 | 1 << 10;
/// Status register RW1C bits (PCI 3.0 §6.2.3): 8 (master data parity error), 11 (signaled
/// target abort), 12 (received target abort), 13 (received master abort), 14 (signaled system
/// error), 15 (detected parity error).
const STATUS_W1C: u16 =
    1 << 8 | PCI_STATUS_SIG_TARGET_ABORT | 1 << 12 | 1 << 13 | 1 << 14 | 1 << 15;
/// Cache Line Size register (PCI 3.0 §6.2.4): read-write, unused by a virtual function.
const CACHE_LINE_SIZE: u16 = 0x0c;
/// Latency Timer register (PCI 3.0 §6.2.4): read-write, unused by a virtual function.
const LATENCY_TIMER: u16 = 0x0d;

/// One function's configuration space: 4 KiB of the window plus its write masks.
pub struct ConfigSpace {
    window: Arc<ConfigWindow>,
    base: usize,
    wmask: Box<[u8]>,
    w1cmask: Box<[u8]>,
}

impl ConfigSpace {
    /// Lay out `layout` at `base` of `window` (the function's ECAM offset), with `bar_addresses`
    /// (one per BAR, as assigned by the platform) programmed in. Returns the BARs' slots.
    pub fn new(
        window: Arc<ConfigWindow>,
        base: usize,
        layout: &FunctionLayout,
        bar_addresses: &[u64],
    ) -> Result<(Self, BarSlots), ConfigError> {
        assert!(base.is_multiple_of(FUNCTION_SIZE) && base + FUNCTION_SIZE <= window.len());
        let mut cs = ConfigSpace {
            window,
            base,
            wmask: vec![0; FUNCTION_SIZE].into_boxed_slice(),
            w1cmask: vec![0; FUNCTION_SIZE].into_boxed_slice(),
        };
        // Present functions read zero where nothing is implemented (PCI 3.0 §6.1).
        for off in (0..FUNCTION_SIZE).step_by(4) {
            cs.window.store_u32(base + off, 0);
        }
        cs.init_u16(PCI_VENDOR_ID, layout.vendor_id, 0);
        cs.init_u16(PCI_DEVICE_ID, layout.device_id, 0);
        cs.init_u32(
            PCI_CLASS_REVISION,
            (layout.class_code << 8) | u32::from(layout.revision),
            0,
        );
        cs.init_u16(PCI_SUBSYSTEM_VENDOR_ID, layout.subsystem_vendor_id, 0);
        cs.init_u16(PCI_SUBSYSTEM_ID, layout.subsystem_id, 0);
        cs.init_u16(PCI_COMMAND, 0, COMMAND_WMASK);
        cs.w1cmask[PCI_STATUS as usize..][..2].copy_from_slice(&STATUS_W1C.to_le_bytes());
        cs.init_u8(CACHE_LINE_SIZE, 0, 0xff);
        cs.init_u8(LATENCY_TIMER, 0, 0xff);
        cs.init_u8(PCI_INTERRUPT_LINE, 0xff, 0xff);
        let slots = cs.init_bars(&layout.bars, bar_addresses)?;
        cs.init_capabilities(&layout.capabilities)?;
        if !layout.ext_capabilities.is_empty()
            && !layout.capabilities.iter().any(|c| c.id == PCI_CAP_ID_EXP)
        {
            return Err(ConfigError::ExtCapabilitiesWithoutPcie);
        }
        cs.init_ext_capabilities(&layout.ext_capabilities)?;
        Ok((cs, slots))
    }

    /// Device-side `body` at `offset` with its write mask; the caller checked that it fits.
    fn write_raw(&mut self, offset: u16, body: &[u8], wmask: &[u8]) {
        self.set_bytes(offset, body);
        let start = usize::from(offset);
        self.wmask[start..start + wmask.len()].copy_from_slice(wmask);
    }

    fn init_u8(&mut self, reg: u16, value: u8, wmask: u8) {
        self.set_u8(reg, value);
        self.wmask[usize::from(reg)] = wmask;
    }

    fn init_u16(&mut self, reg: u16, value: u16, wmask: u16) {
        self.set_u16(reg, value);
        self.wmask[usize::from(reg)..][..2].copy_from_slice(&wmask.to_le_bytes());
    }

    fn init_u32(&mut self, reg: u16, value: u32, wmask: u32) {
        self.set_u32(reg, value);
        self.wmask[usize::from(reg)..][..4].copy_from_slice(&wmask.to_le_bytes());
    }

    /// Guest read of `data.len()` bytes at `offset`; bytes past the 4 KiB read all-ones.
    pub fn read(&self, offset: u16, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            let off = usize::from(offset) + i;
            *byte = if off < FUNCTION_SIZE {
                let dword = self.window.load_u32(self.base + (off & !3));
                dword.to_le_bytes()[off & 3]
            } else {
                0xff
            };
        }
    }

    /// Guest write of `data` at `offset`, through the write and RW1C masks; bytes past the
    /// 4 KiB are dropped. Each touched dword is updated with one store.
    pub fn write(&self, offset: u16, data: &[u8]) {
        self.update(offset, data, |off, old, v| {
            let (w, c) = (self.wmask[off], self.w1cmask[off]);
            ((old & !w) | (v & w)) & !(v & c)
        });
    }

    /// Replace the bytes `start..start + data.len()` (clipped to the 4 KiB) by `merge(offset,
    /// old, new)`, one aligned dword store per touched dword.
    fn update(&self, start: u16, data: &[u8], merge: impl Fn(usize, u8, u8) -> u8) {
        let start = usize::from(start);
        let end = (start + data.len()).min(FUNCTION_SIZE);
        for dword_off in (start & !3..end).step_by(4) {
            let mut bytes = self.window.load_u32(self.base + dword_off).to_le_bytes();
            for (lane, byte) in bytes.iter_mut().enumerate() {
                let off = dword_off + lane;
                if (start..end).contains(&off) {
                    *byte = merge(off, *byte, data[off - start]);
                }
            }
            self.window
                .store_u32(self.base + dword_off, u32::from_le_bytes(bytes));
        }
    }

    /// Device-side read of a dword (any alignment inside the 4 KiB).
    pub fn get_u32(&self, reg: u16) -> u32 {
        let mut b = [0; 4];
        self.read(reg, &mut b);
        u32::from_le_bytes(b)
    }

    /// Device-side read of a byte.
    pub fn get_u8(&self, reg: u16) -> u8 {
        let mut b = [0; 1];
        self.read(reg, &mut b);
        b[0]
    }

    /// Device-side read of a word.
    pub fn get_u16(&self, reg: u16) -> u16 {
        let mut b = [0; 2];
        self.read(reg, &mut b);
        u16::from_le_bytes(b)
    }

    /// Device-side update, ignoring the guest's write masks: e.g. hardware setting a status bit.
    /// Goes straight to the shadow, so the guest sees it on its next read.
    pub fn set_bytes(&self, reg: u16, bytes: &[u8]) {
        assert!(
            usize::from(reg) + bytes.len() <= FUNCTION_SIZE,
            "device-side config write out of range"
        );
        self.update(reg, bytes, |_, _, new| new);
    }

    /// Device-side update of the byte at `reg`.
    pub fn set_u8(&self, reg: u16, value: u8) {
        self.set_bytes(reg, &[value]);
    }

    /// Device-side update of the word at `reg`, little-endian.
    pub fn set_u16(&self, reg: u16, value: u16) {
        self.set_bytes(reg, &value.to_le_bytes());
    }

    /// Device-side update of the dword at `reg`, little-endian.
    pub fn set_u32(&self, reg: u16, value: u32) {
        self.set_bytes(reg, &value.to_le_bytes());
    }
}
