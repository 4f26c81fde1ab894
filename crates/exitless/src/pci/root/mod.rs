//! The PCI root complex of bus 0: the functions, the configuration window they live in, the
//! platform's BAR assignment, and configuration routing.
//!
//! BARs are not decoded here. Each decoded BAR is its own range on the MMIO or port bus
//! (Cloud Hypervisor's `update_range`): placed when the command register enables decoding,
//! moved when the guest reprograms the BAR, removed when decoding is turned off. A BAR moved
//! onto another range (another BAR, a fixed device, the ECAM window) is not decoded, with a
//! warning, until its range is free: when it is moved somewhere free, or when the BAR in its
//! way moves off (every refused BAR is tried again then). Real hardware would decode both
//! meanwhile. Over RAM it is placed, and RAM wins: KVM serves memslots before any exit.
//!
//! Locks, in order: the function table (`RwLock`, written only by [`PciRoot::add`]) → one
//! function's state → a bus. Configuration reads take none (the bytes live in the
//! ECAM-layout window, as the shadow shows them), except reads of a function's read-hooked
//! bytes, which take that function's lock. A BAR access takes only its function's lock, so a
//! busy function never stalls another one's accesses.
//!
//! Read hooks and the ECAM shadow: a read through the shadow never exits, so while a function
//! has read-hooked bytes (a read with a side effect) its 4 KiB page is taken out of the shadow
//! mapping and its reads exit like trapped ECAM; every other function stays shadowed.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

use crate::bus::{BusDevice, BusError, BusRange, DeviceId, IoBuses, WeakBus};
use crate::guest_error;
use crate::logging::DeviceLog;
use crate::pci::PciAddress;
use crate::pci::config::{
    Bar, BarSlots, ConfigError, ConfigSpace, ConfigWindow, FUNCTIONS_PER_BUS, FunctionLayout,
    touches,
};
use crate::pci::function::{HostBridge, PciFunction, TestDevice};
use crate::pci::regs::{
    PCI_BAR_COUNT, PCI_BAR0, PCI_CFG_SPACE_EXP_SIZE, PCI_COMMAND, PCI_COMMAND_IO,
    PCI_COMMAND_MEMORY, PCI_HEADER_TYPE, PCI_HEADER_TYPE_MULTIFUNCTION,
};
use crate::vm::shadow::ShadowRegion;

/// Errors adding functions.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    /// The function's configuration layout is invalid.
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

/// The buses BARs decode on, and the device id and name their ranges are counted under.
/// Weak, because the root is itself on those buses (CF8, ECAM).
#[derive(Clone)]
pub struct BarBuses {
    /// The bus memory BARs decode on.
    pub mmio: WeakBus,
    /// The bus I/O BARs decode on.
    pub pio: WeakBus,
    /// Id of every BAR range in the exit accounting.
    pub id: DeviceId,
    /// Name of every BAR range, for messages.
    pub name: Arc<str>,
}

impl BarBuses {
    /// The buses of `io`, every BAR range counted as the device `name`.
    pub fn on(io: &mut IoBuses, name: &str) -> Self {
        BarBuses {
            mmio: io.mmio.downgrade(),
            pio: io.pio.downgrade(),
            id: io.id_for(name),
            name: name.into(),
        }
    }

    /// No buses: BARs are programmed but decode nowhere (for tests of configuration space).
    pub fn detached() -> Self {
        BarBuses {
            mmio: WeakBus::default(),
            pio: WeakBus::default(),
            id: 0,
            name: "pci-bars".into(),
        }
    }
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

/// One BAR and where it decodes.
struct PlacedBar {
    /// BAR slot (a 64-bit BAR has the lower of its two).
    slot: usize,
    bar: Bar,
    /// Where the guest last asked it to decode; `None` while decoding is off.
    wanted: Option<u64>,
    /// Whether its range is on the bus at `wanted` (not when that was taken).
    decoded: bool,
    /// Its bus device, the same one every time, so its range can be found and moved.
    device: Arc<dyn BusDevice>,
}

struct FunctionState {
    address: PciAddress,
    config: ConfigSpace,
    bars: Vec<PlacedBar>,
    function: Box<dyn PciFunction>,
}

type Function = Mutex<FunctionState>;

/// A BAR's range on a bus: accesses go to its function, with the offset in the BAR.
struct BarDevice {
    /// Weak: the function owns this device (to move its range), not the other way round.
    function: Weak<Function>,
    /// Index in the function's `bars`.
    index: usize,
}

impl BarDevice {
    fn with<R>(&self, f: impl FnOnce(&mut FunctionState, usize) -> R) -> Option<R> {
        let function = self.function.upgrade()?;
        let mut st = function.lock().unwrap();
        // An access that found this range just before decoding was turned off: master abort.
        let placed = st.bars.get(self.index).filter(|b| b.decoded)?;
        let slot = placed.slot;
        Some(f(&mut st, slot))
    }
}

impl BusDevice for BarDevice {
    fn read(&self, offset: u64, data: &mut [u8]) {
        let done = self.with(|st, slot| st.function.bar_read(&st.config, slot, offset, data));
        if done.is_none() {
            data.fill(0xff);
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        self.with(|st, slot| st.function.bar_write(&st.config, slot, offset, data));
    }
}

/// A function's table entry: its state, with one bus device per BAR (none decoding yet) that
/// reaches back to it.
fn new_function(
    address: PciAddress,
    config: ConfigSpace,
    slots: &BarSlots,
    function: Box<dyn PciFunction>,
) -> Arc<Function> {
    Arc::new_cyclic(|weak: &Weak<Function>| {
        let bars = slots
            .iter()
            .enumerate()
            .map(|(index, &(slot, bar))| PlacedBar {
                slot,
                bar,
                wanted: None,
                decoded: false,
                device: Arc::new(BarDevice {
                    function: weak.clone(),
                    index,
                }),
            })
            .collect();
        Mutex::new(FunctionState {
            address,
            config,
            bars,
            function,
        })
    })
}

/// Pack a read-hooked range for [`PciRoot::read_hooks`]; 0 means none.
fn pack_hook(range: &Range<u16>) -> u32 {
    u32::from(range.start) | u32::from(range.end) << 16
}

/// Bus 0 and everything on it.
pub struct PciRoot {
    window: Arc<ConfigWindow>,
    functions: RwLock<BTreeMap<u8, Arc<Function>>>,
    /// Per devfn, the packed configuration range whose reads the function produces (see
    /// [`PciFunction::read_hooked`]), so that every other read takes no lock at all.
    read_hooks: Box<[AtomicU32]>,
    /// The ECAM shadow, if config space is served that way: a function's page is taken out
    /// of it while the function has read-hooked bytes, so those reads exit and reach it.
    shadow: OnceLock<Arc<ShadowRegion>>,
    buses: BarBuses,
    /// Guest errors of the bus (BARs programmed onto other ranges), under the BARs' name.
    log: Arc<DeviceLog>,
    /// MMIO, I/O and, if the platform has one, 64-bit MMIO.
    allocators: Mutex<(Allocator, Allocator, Option<Allocator>)>,
    /// The host bridge's apertures: a BAR decodes only inside them.
    windows: BarWindows,
    /// The host bridge's 64-bit aperture above RAM, if any: 64-bit BARs are placed there, and
    /// decode there or in the 32-bit one.
    mmio64: Option<(u64, u64)>,
}

impl PciRoot {
    /// An empty bus 0 whose BARs will be placed in `windows` and decode on `buses`.
    pub fn new(windows: BarWindows, buses: BarBuses) -> Result<Self, PciError> {
        let apertures = windows;
        Ok(PciRoot {
            window: Arc::new(ConfigWindow::new(1)?),
            functions: RwLock::new(BTreeMap::new()),
            read_hooks: (0..FUNCTIONS_PER_BUS).map(|_| AtomicU32::new(0)).collect(),
            shadow: OnceLock::new(),
            log: DeviceLog::new(&*buses.name),
            buses,
            allocators: Mutex::new((
                Allocator {
                    next: windows.mmio.0,
                    end: windows.mmio.1,
                },
                Allocator {
                    next: windows.io.0,
                    end: windows.io.1,
                },
                None,
            )),
            windows: apertures,
            mmio64: None,
        })
    }

    /// The same bus with a 64-bit window `(start, end)` above RAM, where its 64-bit memory
    /// BARs are then placed (PCI 3.0 §6.2.5.1: a 64-bit BAR may be mapped anywhere in the
    /// 64-bit address space). `None` leaves every BAR in the 32-bit window.
    pub fn with_mmio64(mut self, window: Option<(u64, u64)>) -> Self {
        self.mmio64 = window;
        self.allocators.get_mut().unwrap().2 =
            window.map(|(start, end)| Allocator { next: start, end });
        self
    }

    /// The bus's log: count its guest errors under the BARs' id.
    pub fn log(&self) -> &Arc<DeviceLog> {
        &self.log
    }

    /// The configuration window (the ECAM shadow).
    pub fn window(&self) -> &ConfigWindow {
        &self.window
    }

    /// The configuration window, for a mapping that must keep it alive.
    pub fn shared_window(&self) -> Arc<ConfigWindow> {
        self.window.clone()
    }

    /// Config space is also served by `shadow`, the window mapped read-only into the guest.
    pub fn set_shadow(&self, shadow: Arc<ShadowRegion>) {
        if self.shadow.set(shadow).is_err() {
            return;
        }
        for (devfn, hook) in self.read_hooks.iter().enumerate() {
            if hook.load(Ordering::Acquire) != 0 {
                self.trap_reads(devfn, true);
            }
        }
    }

    /// Record what function `devfn` now produces on reads, and make the shadow trap its page
    /// while that is anything.
    fn update_read_hook(&self, devfn: u8, range: Option<Range<u16>>) {
        let packed = range.as_ref().map_or(0, pack_hook);
        let old = self.read_hooks[usize::from(devfn)].swap(packed, Ordering::AcqRel);
        if (old != 0) != (packed != 0) {
            self.trap_reads(usize::from(devfn), packed != 0);
        }
    }

    fn trap_reads(&self, devfn: usize, trap: bool) {
        let Some(shadow) = self.shadow.get() else {
            return;
        };
        // Bus 0: a function's 4 KiB page is its devfn.
        if let Err(e) = shadow.set_hole(devfn as u64, trap) {
            self.log.warn(format_args!(
                "cannot {} config reads of devfn {devfn:#x} in the ECAM shadow: {e}",
                if trap { "trap" } else { "stop trapping" }
            ));
        }
    }

    /// The host bridge at 00:00.0, which every bus 0 has.
    pub fn add_host_bridge(&self) -> Result<(), PciError> {
        let at = PciAddress::new(0, 0, 0).expect("00:00.0");
        self.add(at, &HostBridge::layout(), Box::new(HostBridge))
    }

    /// The probe's test endpoints: a function at 00:01.0 and a two-function device at 00:02.0
    /// and 00:02.1, whose registers its config-space ops read and write.
    pub fn add_test_endpoints(&self) -> Result<(), PciError> {
        for (device, function, id) in [(1, 0, 0x0001), (2, 0, 0x0002), (2, 1, 0x0003)] {
            let at = PciAddress::new(0, device, function).expect("a valid address");
            self.add(at, &TestDevice::layout(id), Box::<TestDevice>::default())?;
        }
        Ok(())
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
        let mut functions = self.functions.write().unwrap();
        let devfn = address.devfn();
        if functions.contains_key(&devfn) {
            return Err(PciError::Occupied(address));
        }
        let fn0 = devfn & !7;
        if address.function != 0 && !functions.contains_key(&fn0) {
            return Err(PciError::NoFunctionZero(address));
        }
        let (addresses, command) = self.assign_bars(&layout.bars)?;
        let base = usize::try_from(address.ecam_offset()).expect("bus 0 offsets fit");
        let (config, slots) = ConfigSpace::new(self.window.clone(), base, layout, &addresses)?;
        config.set_u16(PCI_COMMAND, command);
        if address.function != 0 {
            let fn0_state = functions[&fn0].lock().unwrap();
            let header = fn0_state.config.get_u8(PCI_HEADER_TYPE);
            fn0_state
                .config
                .set_u8(PCI_HEADER_TYPE, header | PCI_HEADER_TYPE_MULTIFUNCTION);
        }
        let entry = new_function(address, config, &slots, function);
        {
            let mut st = entry.lock().unwrap();
            let FunctionState {
                config, function, ..
            } = &mut *st;
            function.attached(config);
            self.update_read_hook(devfn, function.read_hooked());
            self.sync_decoding(&mut st);
        }
        functions.insert(devfn, entry);
        Ok(())
    }

    /// Give each of `bars` an address in its window, as firmware would. Returns the addresses
    /// and the command register bits that enable their decoding.
    fn assign_bars(&self, bars: &[Bar]) -> Result<(Vec<u64>, u16), PciError> {
        let mut addresses = Vec::new();
        let mut command = 0u16;
        let (mmio, io, mmio64) = &mut *self.allocators.lock().unwrap();
        for bar in bars {
            let (alloc, what, enable) = match (bar, mmio64.as_mut()) {
                (Bar::Io { .. }, _) => (&mut *io, "I/O", PCI_COMMAND_IO),
                (Bar::Memory64 { .. }, Some(high)) => (high, "64-bit MMIO", PCI_COMMAND_MEMORY),
                _ => (&mut *mmio, "MMIO", PCI_COMMAND_MEMORY),
            };
            addresses.push(alloc.take(bar.size(), what)?);
            command |= enable;
        }
        Ok((addresses, command))
    }

    fn function(&self, address: PciAddress) -> Option<Arc<Function>> {
        if address.bus != 0 {
            return None;
        }
        self.functions
            .read()
            .unwrap()
            .get(&address.devfn())
            .cloned()
    }

    /// Guest configuration read; absent functions and buses read all-ones. Served from the
    /// window without a lock, unless the bytes are read-hooked.
    pub fn config_read(&self, address: PciAddress, reg: u16, data: &mut [u8]) {
        if address.bus != 0 {
            data.fill(0xff);
            return;
        }
        // Bytes past the function's 4 KiB read all-ones (callers split at functions anyway).
        let n = data
            .len()
            .min(usize::from(PCI_CFG_SPACE_EXP_SIZE.saturating_sub(reg)));
        let (inside, past) = data.split_at_mut(n);
        past.fill(0xff);
        let offset =
            usize::try_from(address.ecam_offset()).expect("bus 0 offsets fit") + usize::from(reg);
        let hook = self.read_hooks[usize::from(address.devfn())].load(Ordering::Acquire);
        let (start, end) = (hook & 0xffff, hook >> 16);
        let end_of_read = u32::from(reg) + u32::try_from(n).expect("≤ 4 KiB");
        if hook != 0
            && u32::from(reg) < end
            && start < end_of_read
            && let Some(function) = self.function(address)
        {
            // Produce the bytes, then read them under the same lock, so another vCPU's
            // hooked read cannot replace them in between.
            let mut st = function.lock().unwrap();
            let FunctionState {
                config, function, ..
            } = &mut *st;
            function.config_read(config, reg, n);
            self.window.read(offset, inside);
            return;
        }
        self.window.read(offset, inside);
    }

    /// Guest configuration write; writes to absent functions are dropped. A write to the
    /// command register or a BAR moves the function's BAR ranges on the buses.
    pub fn config_write(&self, address: PciAddress, reg: u16, data: &[u8]) {
        let Some(function) = self.function(address) else {
            return;
        };
        let mut st = function.lock().unwrap();
        st.config.write(reg, data);
        let FunctionState {
            config, function, ..
        } = &mut *st;
        function.config_written(config, reg, data.len());
        self.update_read_hook(address.devfn(), function.read_hooked());
        let written = |start: u16, size: usize| touches(reg, data.len(), start, size);
        if (written(PCI_COMMAND, 2) || written(PCI_BAR0, 4 * PCI_BAR_COUNT))
            && self.sync_decoding(&mut st)
        {
            // Taken one function at a time, with this one's lock released (lock order).
            drop(st);
            self.retry_refused();
        }
    }

    /// Place again every BAR refused for a conflict whose range is free now.
    fn retry_refused(&self) {
        let functions: Vec<Arc<Function>> =
            self.functions.read().unwrap().values().cloned().collect();
        for function in functions {
            let mut st = function.lock().unwrap();
            let FunctionState {
                config,
                bars,
                function,
                ..
            } = &mut *st;
            for placed in bars.iter_mut().filter(|p| p.wanted.is_some() && !p.decoded) {
                if self.place(placed, None).is_ok() {
                    function.bar_decoded(config, placed.slot, placed.wanted);
                }
            }
        }
    }

    /// Move `placed`'s range on its bus from `old` to where it is wanted now, and record
    /// whether it decodes there.
    fn place(&self, placed: &mut PlacedBar, old: Option<u64>) -> Result<(), BusError> {
        let bus = if placed.bar.is_io() {
            &self.buses.pio
        } else {
            &self.buses.mmio
        };
        let Some(bus) = bus.upgrade() else {
            return Ok(());
        };
        let new = placed.wanted.map(|base| BusRange {
            base,
            len: placed.bar.size(),
            id: self.buses.id,
            name: self.buses.name.clone(),
            device: placed.device.clone(),
        });
        let result = bus.update_range(old.map(|base| (base, &placed.device)), new);
        placed.decoded = result.is_ok() && placed.wanted.is_some();
        result
    }

    /// Whether the host bridge forwards `bar` at `base`: only its apertures (the windows the
    /// platform describes to the guest) are, so a BAR programmed outside them decodes nowhere.
    /// A 64-bit BAR may sit in either memory window.
    fn forwards(&self, bar: &Bar, base: u64) -> bool {
        let inside = |(start, end): (u64, u64)| {
            base >= start
                && base
                    .checked_add(bar.size())
                    .is_some_and(|bar_end| bar_end <= end)
        };
        match bar {
            Bar::Io { .. } => inside(self.windows.io),
            Bar::Memory32 { .. } => inside(self.windows.mmio),
            Bar::Memory64 { .. } => inside(self.windows.mmio) || self.mmio64.is_some_and(inside),
        }
    }

    /// Bring the function's BAR ranges on the buses in line with its command register and
    /// BARs. A BAR whose wanted place did not change is left alone. Returns whether a range
    /// left its place, so that BARs refused for a conflict may now fit.
    fn sync_decoding(&self, st: &mut FunctionState) -> bool {
        let FunctionState {
            address,
            config,
            bars,
            function,
        } = st;
        let command = config.get_u16(PCI_COMMAND);
        let mut freed = false;
        for placed in bars.iter_mut() {
            let enable = if placed.bar.is_io() {
                PCI_COMMAND_IO
            } else {
                PCI_COMMAND_MEMORY
            };
            let want = (command & enable != 0)
                .then(|| config.bar_address(placed.slot, &placed.bar))
                .filter(|&base| self.forwards(&placed.bar, base));
            if want == placed.wanted {
                continue;
            }
            let old = placed.wanted.filter(|_| placed.decoded);
            placed.wanted = want;
            freed |= old.is_some();
            if let Err(e) = self.place(placed, old) {
                guest_error!(
                    self.log,
                    "PCI {address}: BAR {} not decoded until its range is free: {e}",
                    placed.slot
                );
            }
            let now = want.filter(|_| placed.decoded);
            if now != old {
                function.bar_decoded(config, placed.slot, now);
            }
        }
        freed
    }
}

mod persist;
#[cfg(test)]
mod tests;
