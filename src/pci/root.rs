//! The PCI root complex of bus 0: the functions, the configuration window they live in, the
//! platform's BAR assignment, and BAR decoding for the MMIO and I/O windows.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::bus::BusDevice;
use crate::pci::PciAddress;
use crate::pci::config::{BarSlots, ConfigError, ConfigSpace, ConfigWindow, FunctionLayout};
use crate::pci::function::PciFunction;
use crate::pci::regs::{
    PCI_COMMAND, PCI_COMMAND_IO, PCI_COMMAND_MEMORY, PCI_HEADER_TYPE, PCI_HEADER_TYPE_MULTIFUNCTION,
};

/// Errors adding functions.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    /// Bad configuration layout.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The slot is taken.
    #[error("PCI function {0} already exists")]
    Occupied(PciAddress),
    /// Only bus 0 exists.
    #[error("PCI function {0} is not on bus 0")]
    NoSuchBus(PciAddress),
    /// Function > 0 added before function 0 (PCI 3.0 §6.2.1 requires function 0).
    #[error("PCI function {0} needs function 0 of its device first")]
    NoFunctionZero(PciAddress),
    /// The BAR window is full.
    #[error("no room left in the PCI {0} window for a BAR of {1:#x} bytes")]
    WindowFull(&'static str, u64),
}

/// Guest-physical ranges the platform gives to BARs.
#[derive(Clone, Copy, Debug)]
pub struct BarWindows {
    /// Memory BARs, 32- and 64-bit, are placed here (below 4 GiB).
    pub mmio: (u64, u64),
    /// I/O BARs are placed in these ports.
    pub io: (u64, u64),
}

struct Slot {
    config: ConfigSpace,
    bars: BarSlots,
    function: Box<dyn PciFunction>,
}

struct Allocator {
    next: u64,
    end: u64,
}

impl Allocator {
    fn take(&mut self, size: u64, what: &'static str) -> Result<u64, PciError> {
        let base = self.next.next_multiple_of(size);
        match base.checked_add(size) {
            Some(end) if end <= self.end => {
                self.next = end;
                Ok(base)
            }
            _ => Err(PciError::WindowFull(what, size)),
        }
    }
}

/// Bus 0 and everything on it. All guest accesses take the one lock, `inner`.
pub struct PciRoot {
    window: Arc<ConfigWindow>,
    inner: Mutex<RootInner>,
}

struct RootInner {
    slots: BTreeMap<u8, Slot>,
    mmio: Allocator,
    io: Allocator,
}

/// Which address space a BAR decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarSpace {
    /// Memory space.
    Memory,
    /// I/O space.
    Io,
}

impl PciRoot {
    /// An empty bus 0 whose BARs will be placed in `windows`.
    pub fn new(windows: BarWindows) -> Result<Self, PciError> {
        Ok(PciRoot {
            window: Arc::new(ConfigWindow::new(1)?),
            inner: Mutex::new(RootInner {
                slots: BTreeMap::new(),
                mmio: Allocator {
                    next: windows.mmio.0,
                    end: windows.mmio.1,
                },
                io: Allocator {
                    next: windows.io.0,
                    end: windows.io.1,
                },
            }),
        })
    }

    /// The configuration window (the ECAM shadow).
    pub fn window(&self) -> &ConfigWindow {
        &self.window
    }

    /// Add a function, assign its BARs as firmware would and enable their decoding.
    pub fn add(
        &self,
        address: PciAddress,
        layout: &FunctionLayout,
        function: Box<dyn PciFunction>,
    ) -> Result<(), PciError> {
        if address.bus != 0 {
            return Err(PciError::NoSuchBus(address));
        }
        let mut inner = self.inner.lock().unwrap();
        let devfn = address.devfn();
        if inner.slots.contains_key(&devfn) {
            return Err(PciError::Occupied(address));
        }
        let fn0 = devfn & !7;
        if address.function != 0 && !inner.slots.contains_key(&fn0) {
            return Err(PciError::NoFunctionZero(address));
        }
        let mut addresses = Vec::new();
        let mut command = 0u16;
        for bar in &layout.bars {
            let (alloc, what, enable) = if bar.is_io() {
                (&mut inner.io, "I/O", PCI_COMMAND_IO)
            } else {
                (&mut inner.mmio, "MMIO", PCI_COMMAND_MEMORY)
            };
            addresses.push(alloc.take(bar.size(), what)?);
            command |= enable;
        }
        let base = usize::try_from(address.ecam_offset()).expect("bus 0 offsets fit");
        let (config, bars) = ConfigSpace::new(self.window.clone(), base, layout, &addresses)?;
        config.set_u16(PCI_COMMAND, command);
        if address.function != 0 {
            let fn0_config = &inner.slots[&fn0].config;
            let header = fn0_config.get_u8(PCI_HEADER_TYPE);
            fn0_config.set_u8(PCI_HEADER_TYPE, header | PCI_HEADER_TYPE_MULTIFUNCTION);
        }
        let mut function = function;
        function.attached(&config);
        inner.slots.insert(
            devfn,
            Slot {
                config,
                bars,
                function,
            },
        );
        Ok(())
    }

    /// Guest configuration read; absent functions and buses read all-ones.
    pub fn config_read(&self, address: PciAddress, reg: u16, data: &mut [u8]) {
        let inner = self.inner.lock().unwrap();
        match inner
            .slots
            .get(&address.devfn())
            .filter(|_| address.bus == 0)
        {
            Some(slot) => slot.config.read(reg, data),
            None => data.fill(0xff),
        }
    }

    /// Guest configuration write; writes to absent functions are dropped.
    pub fn config_write(&self, address: PciAddress, reg: u16, data: &[u8]) {
        let mut inner = self.inner.lock().unwrap();
        if address.bus != 0 {
            return;
        }
        if let Some(slot) = inner.slots.get_mut(&address.devfn()) {
            slot.config.write(reg, data);
            slot.function.config_written(&slot.config, reg, data.len());
        }
    }

    /// Route an access at `addr` in `space` to the BAR that decodes it, if decoding is enabled
    /// in that function's command register. Returns whether a BAR claimed it.
    fn bar_access(&self, space: BarSpace, addr: u64, access: BarAccess<'_>) -> bool {
        let mut inner = self.inner.lock().unwrap();
        let enable = match space {
            BarSpace::Memory => PCI_COMMAND_MEMORY,
            BarSpace::Io => PCI_COMMAND_IO,
        };
        for slot in inner.slots.values_mut() {
            if slot.config.get_u16(PCI_COMMAND) & enable == 0 {
                continue;
            }
            for &(index, bar) in &slot.bars {
                if bar.is_io() != (space == BarSpace::Io) {
                    continue;
                }
                let base = slot.config.bar_address(index, &bar);
                if addr < base || addr - base >= bar.size() {
                    continue;
                }
                let offset = addr - base;
                match access {
                    BarAccess::Read(data) => {
                        slot.function.bar_read(&slot.config, index, offset, data)
                    }
                    BarAccess::Write(data) => {
                        slot.function.bar_write(&slot.config, index, offset, data)
                    }
                }
                return true;
            }
        }
        false
    }
}

enum BarAccess<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

/// The window of guest-physical or port space in which BARs decode, as one bus device.
pub struct BarWindow {
    root: Arc<PciRoot>,
    space: BarSpace,
    base: u64,
}

impl BarWindow {
    /// A device for `space` whose bus range starts at `base`.
    pub fn new(root: Arc<PciRoot>, space: BarSpace, base: u64) -> Self {
        BarWindow { root, space, base }
    }
}

impl BusDevice for BarWindow {
    fn read(&self, offset: u64, data: &mut [u8]) {
        let claimed = self
            .root
            .bar_access(self.space, self.base + offset, BarAccess::Read(data));
        if !claimed {
            data.fill(0xff); // master abort: all-ones
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        self.root
            .bar_access(self.space, self.base + offset, BarAccess::Write(data));
    }
}
