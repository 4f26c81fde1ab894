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

use std::sync::Arc;

use vm_memory::{Bytes, MmapRegion, VolatileMemory};

use crate::pci::regs::*;

const FUNCTION_SIZE: usize = PCI_CFG_SPACE_EXP_SIZE as usize;
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

/// Functions per bus in an ECAM window: 32 devices × 8 functions.
pub const FUNCTIONS_PER_BUS: usize = 256;

/// Errors building configuration space.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Cannot allocate the configuration window.
    #[error("cannot allocate the PCI configuration window: {0}")]
    Alloc(#[from] vm_memory::mmap::MmapRegionError),
    /// A BAR size that is not a power of two of at least the minimum for its kind.
    #[error("BAR {index}: size {size:#x} is not a power of two ≥ {min:#x}")]
    BarSize {
        /// BAR slot.
        index: usize,
        /// Requested size.
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

/// The ECAM-layout store of configuration space for a range of buses, page-aligned so it can
/// back a KVM memslot. Absent functions read all-ones (PCIe 4.0 §2.3.2: unsupported request
/// completion for a configuration read returns all-ones).
pub struct ConfigWindow {
    region: MmapRegion,
}

impl ConfigWindow {
    /// A window for `buses` buses, every byte 0xFF.
    pub fn new(buses: usize) -> Result<Self, ConfigError> {
        let region = MmapRegion::new(buses * FUNCTIONS_PER_BUS * FUNCTION_SIZE)?;
        region
            .as_volatile_slice()
            .write_slice(&vec![0xff; region.size()], 0)
            .expect("the slice covers the region");
        Ok(ConfigWindow { region })
    }

    /// The backing memory, for mapping it into the guest.
    pub fn region(&self) -> &MmapRegion {
        &self.region
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.region.size()
    }

    /// Whether the window covers no bus.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Read `data.len()` bytes at `offset`, exactly what a guest read of the shadow returns;
    /// bytes past the window read all-ones. Takes no lock: each dword is one aligned load.
    pub fn read(&self, offset: usize, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = match offset.checked_add(i).filter(|&o| o < self.len()) {
                Some(o) => self.load_u32(o & !3).to_le_bytes()[o & 3],
                None => 0xff,
            };
        }
    }

    fn load_u32(&self, offset: usize) -> u32 {
        // Offsets are dword-aligned and inside a function's 4 KiB, checked by ConfigSpace; the
        // aligned volatile load is a single access, as a concurrent guest read would do.
        self.region
            .get_ref::<u32>(offset)
            .expect("config offset checked by caller")
            .load()
    }

    fn store_u32(&self, offset: usize, value: u32) {
        // One aligned store, so a guest reading the shadow on another vCPU sees the whole old or
        // the whole new dword, never a mix.
        self.region
            .get_ref::<u32>(offset)
            .expect("config offset checked by caller")
            .store(value)
    }
}

/// A BAR as the device declares it (PCI 3.0 §6.2.5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bar {
    /// 32-bit memory BAR.
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
    /// I/O BAR.
    Io {
        /// Size in bytes, a power of two ≥ 4.
        size: u32,
    },
}

impl Bar {
    /// Size in bytes.
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

    /// The read-only low bits of the register (PCI 3.0 §6.2.5.1).
    fn flag_bits(&self) -> u32 {
        let prefetch = |p: bool| if p { PCI_BAR_MEM_PREFETCH } else { 0 };
        match *self {
            Bar::Memory32 { prefetchable, .. } => prefetch(prefetchable),
            Bar::Memory64 { prefetchable, .. } => PCI_BAR_MEM_TYPE_64 | prefetch(prefetchable),
            Bar::Io { .. } => PCI_BAR_SPACE_IO,
        }
    }
}

/// A standard capability (PCI 3.0 §6.7): its ID and the bytes after the 2-byte header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capability {
    /// Capability ID.
    pub id: u8,
    /// Register contents after the ID and next-pointer bytes.
    pub body: Vec<u8>,
    /// Which body bits the guest may write.
    pub body_wmask: Vec<u8>,
}

/// An extended capability (PCIe 4.0 §7.6): ID, version and the bytes after the 4-byte header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtCapability {
    /// Extended capability ID.
    pub id: u16,
    /// Capability version (4 bits).
    pub version: u8,
    /// Register contents after the header dword.
    pub body: Vec<u8>,
    /// Which body bits the guest may write.
    pub body_wmask: Vec<u8>,
}

/// Everything that describes a type-0 function's configuration space.
#[derive(Clone, Debug, Default)]
pub struct FunctionLayout {
    /// Vendor ID.
    pub vendor_id: u16,
    /// Device ID.
    pub device_id: u16,
    /// Class code: base class, sub-class, programming interface (24 bits).
    pub class_code: u32,
    /// Revision ID.
    pub revision: u8,
    /// Subsystem vendor ID (PCI 3.0 §6.2.4).
    pub subsystem_vendor_id: u16,
    /// Subsystem ID.
    pub subsystem_id: u16,
    /// BARs in slot order; a 64-bit one takes two slots.
    pub bars: Vec<Bar>,
    /// Standard capabilities, chained from offset 0x40.
    pub capabilities: Vec<Capability>,
    /// Extended capabilities, chained from offset 0x100.
    pub ext_capabilities: Vec<ExtCapability>,
}

/// Where the layout's BARs ended up: (slot index, BAR) for each BAR.
pub type BarSlots = Vec<(usize, Bar)>;

/// Command register bits the guest may write: I/O, memory, bus master, parity error response,
/// SERR# enable, interrupt disable (PCI 3.0 §6.2.2).
const COMMAND_WMASK: u16 = 0x0001 | 0x0002 | 0x0004 | 0x0040 | 0x0100 | 0x0400;
/// Status register RW1C bits: master data parity error, signaled/received target abort,
/// received master abort, signaled system error, detected parity error (PCI 3.0 §6.2.3).
const STATUS_W1C: u16 = 0x0100 | 0x0800 | 0x1000 | 0x2000 | 0x4000 | 0x8000;
/// Capabilities start here and must be dword-aligned (PCI 3.0 §6.7).
const CAP_START: u16 = 0x40;

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
        cs.init_u8(0x0c, 0, 0xff); // cache line size
        cs.init_u8(0x0d, 0, 0xff); // latency timer
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

    fn init_bars(&mut self, bars: &[Bar], addresses: &[u64]) -> Result<BarSlots, ConfigError> {
        let mut slot = 0;
        let mut slots = Vec::new();
        for (index, bar) in bars.iter().enumerate() {
            let min = if bar.is_io() { 4 } else { 16 };
            let size = bar.size();
            if !size.is_power_of_two() || size < min {
                return Err(ConfigError::BarSize { index, size, min });
            }
            if slot + bar.slots() > PCI_BAR_COUNT {
                return Err(ConfigError::TooManyBars);
            }
            let reg = bar_register(slot);
            let addr_mask = !(size - 1);
            let flag_mask = if bar.is_io() { 0x3 } else { 0xf };
            let address = addresses.get(index).copied().unwrap_or(0) & addr_mask;
            self.init_u32(
                reg,
                low32(address) | bar.flag_bits(),
                low32(addr_mask) & !flag_mask,
            );
            if bar.slots() == 2 {
                self.init_u32(reg + 4, high32(address), high32(addr_mask));
            }
            slots.push((slot, *bar));
            slot += bar.slots();
        }
        Ok(slots)
    }

    fn init_capabilities(&mut self, caps: &[Capability]) -> Result<(), ConfigError> {
        let mut offset = CAP_START;
        let mut link = PCI_CAPABILITY_LIST;
        for cap in caps {
            let len =
                u16::try_from(2 + cap.body.len()).map_err(|_| ConfigError::CapabilitiesOverflow)?;
            let len = len.next_multiple_of(4);
            if offset + len > PCI_CFG_SPACE_SIZE || cap.body_wmask.len() > cap.body.len() {
                return Err(ConfigError::CapabilitiesOverflow);
            }
            let [pointer, _] = offset.to_le_bytes(); // < 0x100: fits the 8-bit pointer
            self.set_u8(link, pointer);
            self.set_u8(offset, cap.id);
            self.write_raw(offset + 2, &cap.body, &cap.body_wmask);
            link = offset + 1;
            offset += len;
        }
        if !caps.is_empty() {
            self.set_u16(PCI_STATUS, PCI_STATUS_CAP_LIST);
        }
        Ok(())
    }

    fn init_ext_capabilities(&mut self, caps: &[ExtCapability]) -> Result<(), ConfigError> {
        let mut offset = PCI_EXT_CAP_START;
        for (i, cap) in caps.iter().enumerate() {
            let len =
                u16::try_from(4 + cap.body.len()).map_err(|_| ConfigError::CapabilitiesOverflow)?;
            let len = len.next_multiple_of(4);
            if offset + len > PCI_CFG_SPACE_EXP_SIZE || cap.body_wmask.len() > cap.body.len() {
                return Err(ConfigError::CapabilitiesOverflow);
            }
            let next = if i + 1 < caps.len() { offset + len } else { 0 };
            // Header: ID 15:0, version 19:16, next offset 31:20 (PCIe 4.0 §7.6.3).
            let header =
                u32::from(cap.id) | (u32::from(cap.version & 0xf) << 16) | (u32::from(next) << 20);
            self.set_u32(offset, header);
            self.write_raw(offset + 4, &cap.body, &cap.body_wmask);
            offset += len;
        }
        Ok(())
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

    /// Offset of the first capability with ID `id` in the standard list (PCI 3.0 §6.7). The
    /// walk is bounded, so a list the guest could not change anyway still cannot loop.
    pub fn find_capability(&self, id: u8) -> Option<u16> {
        self.capabilities()
            .find(|&(_, cap)| cap == id)
            .map(|(offset, _)| offset)
    }

    /// The standard capabilities: (offset, ID) of each, in list order (PCI 3.0 §6.7).
    pub fn capabilities(&self) -> impl Iterator<Item = (u16, u8)> + '_ {
        let mut ptr = u16::from(self.get_u8(PCI_CAPABILITY_LIST) & 0xfc);
        // 48 = the most 4-byte capabilities that fit in 0x40..0xff: bounds a looping list.
        (0..48).map_while(move |_| {
            if ptr < CAP_START {
                return None;
            }
            let at = ptr;
            ptr = u16::from(self.get_u8(at + 1) & 0xfc);
            Some((at, self.get_u8(at)))
        })
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

    /// Device-side byte update.
    pub fn set_u8(&self, reg: u16, value: u8) {
        self.set_bytes(reg, &[value]);
    }

    /// Device-side word update.
    pub fn set_u16(&self, reg: u16, value: u16) {
        self.set_bytes(reg, &value.to_le_bytes());
    }

    /// Device-side dword update.
    pub fn set_u32(&self, reg: u16, value: u32) {
        self.set_bytes(reg, &value.to_le_bytes());
    }

    /// The address a BAR currently decodes (both slots for a 64-bit BAR).
    pub fn bar_address(&self, slot: usize, bar: &Bar) -> u64 {
        let reg = bar_register(slot);
        let low = self.get_u32(reg);
        let flag_mask = if bar.is_io() { 0x3 } else { 0xf };
        let high = if bar.slots() == 2 {
            self.get_u32(reg + 4)
        } else {
            0
        };
        ((u64::from(high) << 32) | u64::from(low & !flag_mask)) & !(bar.size() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touches_is_range_overlap_for_every_edge() {
        for (offset, len, start, size, want) in [
            (4, 2, 4, 2, true),
            (3, 1, 4, 2, false),
            (3, 2, 4, 2, true),
            (5, 4, 4, 2, true),
            (6, 4, 4, 2, false),
            (4, 0, 4, 2, false),
            (4, 2, 4, 0, false),
            (0, usize::MAX, u16::MAX, 1, true),
            (u16::MAX, usize::MAX, u16::MAX, usize::MAX, true),
            (u16::MAX, 1, 0, usize::from(u16::MAX), false),
        ] {
            assert_eq!(
                touches(offset, len, start, size),
                want,
                "{offset} {len} {start} {size}"
            );
            assert_eq!(touches(start, size, offset, len), want, "symmetric");
        }
    }

    fn space(layout: &FunctionLayout, addrs: &[u64]) -> ConfigSpace {
        let window = Arc::new(ConfigWindow::new(1).unwrap());
        ConfigSpace::new(window, 0x8000, layout, addrs).unwrap().0
    }

    fn read32(cs: &ConfigSpace, reg: u16) -> u32 {
        let mut b = [0; 4];
        cs.read(reg, &mut b);
        u32::from_le_bytes(b)
    }

    fn layout() -> FunctionLayout {
        crate::pci::function::TestDevice::layout(0x0001)
    }

    #[test]
    fn header_fields_and_read_only_ids() {
        let cs = space(&layout(), &[]);
        assert_eq!(read32(&cs, 0), 0x0001_7e57);
        assert_eq!(read32(&cs, 8), 0xff00_0001);
        cs.write(0, &[0, 0, 0, 0]);
        cs.write(8, &0xffff_ffffu32.to_le_bytes());
        assert_eq!(read32(&cs, 0), 0x0001_7e57, "IDs are read-only");
        assert_eq!(read32(&cs, 8), 0xff00_0001, "class/revision are read-only");
    }

    #[test]
    fn bar_sizing_reads_back_the_size_mask() {
        let cs = space(&layout(), &[0xc000_0000, 0xc040, 0x1_0000_0000]);
        assert_eq!(read32(&cs, 0x10), 0xc000_0000);
        assert_eq!(read32(&cs, 0x14), 0xc041);
        assert_eq!(read32(&cs, 0x18), 0x0000_000c);
        assert_eq!(read32(&cs, 0x1c), 0x1);
        for reg in [0x10, 0x14, 0x18, 0x1c, 0x20, 0x24] {
            cs.write(reg, &[0xff; 4]);
        }
        assert_eq!(read32(&cs, 0x10), 0xffff_f000, "4 KiB memory BAR");
        assert_eq!(
            read32(&cs, 0x14),
            0xffff_ffe1,
            "32-byte I/O BAR keeps its I/O bit"
        );
        assert_eq!(
            read32(&cs, 0x18),
            0xfff0_000c,
            "64-bit prefetchable keeps its type bits"
        );
        assert_eq!(read32(&cs, 0x1c), 0xffff_ffff);
        assert_eq!(read32(&cs, 0x20), 0, "unimplemented BAR");
        cs.write(0x10, &0xd000_0123u32.to_le_bytes());
        assert_eq!(read32(&cs, 0x10), 0xd000_0000);
    }

    #[test]
    fn bar_address_follows_guest_writes() {
        let l = layout();
        let window = Arc::new(ConfigWindow::new(1).unwrap());
        let (cs, slots) =
            ConfigSpace::new(window, 0, &l, &[0xc000_0000, 0xc040, 0x2_0000_0000]).unwrap();
        assert_eq!(slots.iter().map(|s| s.0).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(cs.bar_address(2, &slots[2].1), 0x2_0000_0000);
        cs.write(0x1c, &[0, 0, 0, 0]);
        cs.write(0x18, &0x0030_0000u32.to_le_bytes());
        assert_eq!(cs.bar_address(2, &slots[2].1), 0x30_0000);
    }

    #[test]
    fn status_bits_are_rw1c_and_device_settable() {
        let cs = space(&layout(), &[]);
        cs.set_u16(
            PCI_STATUS,
            cs.get_u16(PCI_STATUS) | PCI_STATUS_SIG_TARGET_ABORT,
        );
        assert_eq!(cs.get_u16(PCI_STATUS), 0x0810);
        cs.write(PCI_STATUS, &0x0010u16.to_le_bytes()); // writing 0 to 0x800 keeps it
        assert_eq!(cs.get_u16(PCI_STATUS), 0x0810);
        cs.write(PCI_STATUS, &0xffffu16.to_le_bytes()); // 1 clears; CAP_LIST is read-only
        assert_eq!(cs.get_u16(PCI_STATUS), 0x0010);
    }

    #[test]
    fn capability_chain_and_masks() {
        let cs = space(&layout(), &[]);
        assert_eq!(
            cs.get_u16(PCI_STATUS) & PCI_STATUS_CAP_LIST,
            PCI_STATUS_CAP_LIST
        );
        let mut b = [0; 1];
        cs.read(PCI_CAPABILITY_LIST, &mut b);
        assert_eq!(b[0], 0x40);
        assert_eq!(cs.get_u16(0x40), 0x4809, "vendor cap, next at 0x48");
        assert_eq!(cs.get_u16(0x48), 0x5001, "PM cap, next at 0x50");
        assert_eq!(cs.get_u16(0x50), 0x6005, "MSI cap, next at 0x60");
        assert_eq!(cs.get_u16(0x60), 0x0010, "PCI Express cap, end of list");
        assert_eq!(cs.get_u16(0x62), 0x0002, "version 2, Endpoint");
        assert_eq!(cs.find_capability(PCI_CAP_ID_EXP), Some(0x60));
        assert_eq!(cs.find_capability(PCI_CAP_ID_MSIX), None);
        cs.write(0x4c, &[0xff]); // PMCSR power state: only bits 1:0 writable
        assert_eq!(cs.get_u16(0x4c) & 0xff, 0x03);
        cs.write(0x42, &[0x55, 0x55]);
        assert_eq!(cs.get_u16(0x42), 0x0008, "vendor cap body is read-only");
        assert_eq!(cs.get_u32(0x100), 0x0001_000b);
        cs.write(0x104, &0x1234_5678u32.to_le_bytes());
        assert_eq!(cs.get_u32(0x104), 0x00c1_0001, "VSEC header is read-only");
        cs.write(0x108, &0x1234_5678u32.to_le_bytes());
        assert_eq!(cs.get_u32(0x108), 0x1234_5678);
    }

    #[test]
    fn unaligned_and_odd_sized_accesses_are_bytewise() {
        let cs = space(&layout(), &[]);
        let mut b = [0; 4];
        cs.read(1, &mut b); // crosses into the device ID and the command register
        assert_eq!(b, [0x7e, 0x01, 0x00, 0x00]);
        cs.write(3, &[0xff, 0xff]); // device ID high byte (RO) and command low byte
        assert_eq!(
            cs.get_u16(PCI_COMMAND) & 0xff,
            (COMMAND_WMASK & 0xff) as u8 as u16
        );
        assert_eq!(cs.get_u16(PCI_DEVICE_ID), 1);
        let mut tail = [0; 4];
        cs.read(0xffe, &mut tail);
        assert_eq!(tail[2..], [0xff, 0xff], "past the 4 KiB reads all-ones");
        cs.write(0xffe, &[1, 2, 3, 4]); // must not spill into the next function
    }

    #[test]
    fn bad_layouts_are_refused() {
        let window = Arc::new(ConfigWindow::new(1).unwrap());
        let mut l = layout();
        l.bars = vec![Bar::Memory32 {
            size: 0x1800,
            prefetchable: false,
        }];
        assert!(matches!(
            ConfigSpace::new(window.clone(), 0, &l, &[]),
            Err(ConfigError::BarSize { .. })
        ));
        l.bars = vec![
            Bar::Memory64 {
                size: 0x1000,
                prefetchable: false
            };
            4
        ];
        assert!(matches!(
            ConfigSpace::new(window.clone(), 0, &l, &[]),
            Err(ConfigError::TooManyBars)
        ));
        l.bars.clear();
        l.capabilities = vec![Capability {
            id: 9,
            body: vec![0; 200],
            body_wmask: vec![],
        }];
        assert!(matches!(
            ConfigSpace::new(window.clone(), 0, &l, &[]),
            Err(ConfigError::CapabilitiesOverflow)
        ));
        // Extended capabilities only on a PCI Express function (PCIe 4.0 §7.6).
        let mut l = layout();
        l.capabilities.retain(|c| c.id != PCI_CAP_ID_EXP);
        assert!(matches!(
            ConfigSpace::new(window, 0, &l, &[]),
            Err(ConfigError::ExtCapabilitiesWithoutPcie)
        ));
    }
}
