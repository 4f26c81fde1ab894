//! Guest address spaces (port I/O and MMIO) mapped to devices.
//!
//! A [`Bus`] is an ordered map of non-overlapping ranges. Most ranges are placed before the
//! vCPUs start; PCI BARs come, move and go at run time as the guest programs them (the PCI root
//! calls [`Bus::update_range`]). Devices take `&self` and do their own locking, so a hot device
//! never waits behind an unrelated one.
//!
//! Lock order: a device's own lock may be held while it updates a bus (the PCI root does, to
//! move a BAR); the bus lock is never held while a device is called.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock, Weak};

/// A device as the bus sees it: accesses arrive as an offset into its range.
pub trait BusDevice: Send + Sync {
    /// Fill `data` (1..=8 bytes) from `offset`.
    fn read(&self, offset: u64, data: &mut [u8]);
    /// Accept `data` (1..=8 bytes) written at `offset`.
    fn write(&self, offset: u64, data: &[u8]);
}

/// Index of a device in the [`DeviceTable`]; exit counters are kept per `DeviceId`.
pub type DeviceId = usize;

/// Errors building a bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    /// The range {base:#x}+{len:#x} of {name} overlaps {other}.
    #[error("the range {base:#x}+{len:#x} of {name} overlaps {other}")]
    Overlap {
        /// Device being inserted.
        name: String,
        /// Its base.
        base: u64,
        /// Its length.
        len: u64,
        /// The device already there.
        other: String,
    },
    /// A zero-length or wrapping range.
    #[error("the range {base:#x}+{len:#x} of {name} is empty or wraps")]
    BadRange {
        /// Device being inserted.
        name: String,
        /// Its base.
        base: u64,
        /// Its length.
        len: u64,
    },
}

#[derive(Clone)]
struct BusEntry {
    len: u64,
    id: DeviceId,
    name: Arc<str>,
    device: Arc<dyn BusDevice>,
}

type Entries = BTreeMap<u64, BusEntry>;

/// One address space: port I/O or MMIO. Clones share the same ranges.
///
/// The map sits behind an `RwLock` held only for the lookup (the device is cloned out and
/// called after the lock is dropped): an uncontended read lock is one atomic operation, noise
/// beside the exit that brought the access here, and updates (BAR moves) are rare. arc-swap
/// would spare readers even that shared cache line, at the price of a dependency and of copying
/// the whole map on every update; with a handful of vCPUs the lock is the simpler fit.
#[derive(Default, Clone)]
pub struct Bus {
    entries: Arc<RwLock<Entries>>,
}

/// A [`Bus`] that does not keep its ranges alive: for devices on the bus that update it (the
/// PCI root), which would otherwise keep themselves alive through it.
#[derive(Clone, Default)]
pub struct WeakBus(Weak<RwLock<Entries>>);

impl WeakBus {
    /// The bus, if it still exists.
    pub fn upgrade(&self) -> Option<Bus> {
        self.0.upgrade().map(|entries| Bus { entries })
    }
}

/// A range to place on a bus with [`Bus::update_range`].
pub struct BusRange {
    /// First address.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    /// Device id, for exit accounting.
    pub id: DeviceId,
    /// Device name, for error messages.
    pub name: Arc<str>,
    /// The device.
    pub device: Arc<dyn BusDevice>,
}

fn check_free(entries: &Entries, r: &BusRange) -> Result<(), BusError> {
    let name = r.name.to_string();
    let (base, len) = (r.base, r.len);
    let last = match base.checked_add(len) {
        Some(end) if len > 0 => end - 1,
        _ => return Err(BusError::BadRange { name, base, len }),
    };
    // The entry starting at or before `last` with the greatest base is the only candidate.
    if let Some((&b, e)) = entries.range(..=last).next_back()
        && b + e.len > base
    {
        return Err(BusError::Overlap {
            name,
            base,
            len,
            other: e.name.to_string(),
        });
    }
    Ok(())
}

impl Bus {
    /// Place `range`; refused if it is empty, wraps, or overlaps a range already there.
    pub fn insert(&self, range: BusRange) -> Result<(), BusError> {
        self.update_range(None, Some(range))
    }

    /// In one step, remove the range at `old` (base and device: only if that device is the one
    /// there) and place `new`. If `new` does not fit, `old` is still removed and the error
    /// returned: a moved BAR that lands on another range decodes nowhere until its range is free.
    pub fn update_range(
        &self,
        old: Option<(u64, &Arc<dyn BusDevice>)>,
        new: Option<BusRange>,
    ) -> Result<(), BusError> {
        let mut entries = self.entries.write().unwrap();
        if let Some((base, device)) = old
            && entries
                .get(&base)
                .is_some_and(|e| Arc::ptr_eq(&e.device, device))
        {
            entries.remove(&base);
        }
        let Some(r) = new else {
            return Ok(());
        };
        check_free(&entries, &r)?;
        let entry = BusEntry {
            len: r.len,
            id: r.id,
            name: r.name,
            device: r.device,
        };
        entries.insert(r.base, entry);
        Ok(())
    }

    /// A handle that does not keep the bus alive.
    pub fn downgrade(&self) -> WeakBus {
        WeakBus(Arc::downgrade(&self.entries))
    }

    /// The device claiming `addr` (cloned out, so no lock is held while it runs), its id and
    /// the offset of `addr` in its range.
    fn resolve(&self, addr: u64) -> Option<(Arc<dyn BusDevice>, DeviceId, u64)> {
        let entries = self.entries.read().unwrap();
        let (&base, entry) = entries.range(..=addr).next_back()?;
        let offset = addr - base;
        (offset < entry.len).then(|| (entry.device.clone(), entry.id, offset))
    }

    /// The device that claims `addr`, if any.
    pub fn device_at(&self, addr: u64) -> Option<DeviceId> {
        let entries = self.entries.read().unwrap();
        let (&base, entry) = entries.range(..=addr).next_back()?;
        (addr - base < entry.len).then_some(entry.id)
    }

    /// Read at `addr`; unclaimed addresses read all-ones, as a floating x86 bus does.
    pub fn read(&self, addr: u64, data: &mut [u8]) {
        match self.resolve(addr) {
            Some((device, _, offset)) => device.read(offset, data),
            None => data.fill(0xff),
        }
    }

    /// Write at `addr`; writes to unclaimed addresses are dropped.
    pub fn write(&self, addr: u64, data: &[u8]) {
        if let Some((device, _, offset)) = self.resolve(addr) {
            device.write(offset, data);
        }
    }
}

/// Both address spaces and the names of the devices on them.
#[derive(Default, Clone)]
pub struct IoBuses {
    /// Port I/O space (16-bit addresses).
    pub pio: Bus,
    /// Memory-mapped I/O space.
    pub mmio: Bus,
    /// Device names, indexed by [`DeviceId`].
    pub names: DeviceTable,
}

/// Names of the devices, indexed by [`DeviceId`]. A device on both buses has one id.
pub type DeviceTable = Vec<String>;

impl IoBuses {
    /// The id of the device called `name`, registered now if it is new: for devices placed on
    /// a bus later, at run time (PCI BARs). Exit counters are sized when the vCPUs start, so
    /// every name must be known by then.
    pub fn id_for(&mut self, name: &str) -> DeviceId {
        match self.names.iter().position(|n| n == name) {
            Some(id) => id,
            None => {
                self.names.push(name.to_owned());
                self.names.len() - 1
            }
        }
    }

    /// Map `device` at ports `base..base+len`.
    pub fn add_pio(
        &mut self,
        name: &str,
        base: u16,
        len: u16,
        device: Arc<dyn BusDevice>,
    ) -> Result<DeviceId, BusError> {
        let id = self.id_for(name);
        self.pio.insert(BusRange {
            base: base.into(),
            len: len.into(),
            id,
            name: name.into(),
            device,
        })?;
        Ok(id)
    }

    /// Map `device` at guest-physical `base..base+len`.
    pub fn add_mmio(
        &mut self,
        name: &str,
        base: u64,
        len: u64,
        device: Arc<dyn BusDevice>,
    ) -> Result<DeviceId, BusError> {
        let id = self.id_for(name);
        self.mmio.insert(BusRange {
            base,
            len,
            id,
            name: name.into(),
            device,
        })?;
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<(u64, Vec<u8>)>>);

    impl BusDevice for Recorder {
        fn read(&self, offset: u64, data: &mut [u8]) {
            data.fill(u8::try_from(offset).unwrap());
        }
        fn write(&self, offset: u64, data: &[u8]) {
            self.0.lock().unwrap().push((offset, data.to_vec()));
        }
    }

    #[test]
    fn dispatches_by_range_with_offsets() {
        let mut io = IoBuses::default();
        let dev = Arc::new(Recorder::default());
        let id = io.add_mmio("rec", 0x1000, 0x10, dev.clone()).unwrap();
        let mut b = [0u8; 2];
        assert_eq!(io.mmio.device_at(0x1003), Some(id));
        io.mmio.read(0x1003, &mut b);
        assert_eq!(b, [3, 3]);
        io.mmio.write(0x100f, &[7]);
        assert_eq!(io.mmio.device_at(0x1010), None);
        assert_eq!(dev.0.lock().unwrap()[0], (0xf, vec![7]));
    }

    #[test]
    fn unclaimed_reads_all_ones_and_drops_writes() {
        let io = IoBuses::default();
        let mut b = [0u8; 4];
        io.pio.read(0x80, &mut b);
        assert_eq!(b, [0xff; 4]);
        io.pio.write(0x80, &[1]);
    }

    #[test]
    fn overlapping_and_empty_ranges_are_refused() {
        let mut io = IoBuses::default();
        let dev = Arc::new(Recorder::default());
        io.add_pio("a", 0x10, 8, dev.clone()).unwrap();
        assert!(matches!(
            io.add_pio("b", 0x17, 1, dev.clone()),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            io.add_pio("c", 0x0c, 5, dev.clone()),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            io.add_pio("d", 0x40, 0, dev.clone()),
            Err(BusError::BadRange { .. })
        ));
        io.add_pio("e", 0x18, 1, dev).unwrap();
    }

    #[test]
    fn ranges_move_and_go_at_run_time_and_clones_see_it() {
        let mut io = IoBuses::default();
        let dev: Arc<dyn BusDevice> = Arc::new(Recorder::default());
        let other: Arc<dyn BusDevice> = Arc::new(Recorder::default());
        io.add_mmio("fixed", 0x2000, 0x100, other.clone()).unwrap();
        let id = io.id_for("bar");
        let vcpu_view = io.mmio.clone();
        let range = |base| BusRange {
            base,
            len: 0x10,
            id,
            name: "bar".into(),
            device: dev.clone(),
        };
        io.mmio.insert(range(0x1000)).unwrap();
        assert_eq!(vcpu_view.device_at(0x1008), Some(id));
        io.mmio
            .update_range(Some((0x1000, &dev)), Some(range(0x3000)))
            .unwrap();
        assert_eq!(vcpu_view.device_at(0x1008), None, "moved away");
        assert_eq!(vcpu_view.device_at(0x3008), Some(id));
        // Moved onto another range: refused, and decoded nowhere.
        let err = io
            .mmio
            .update_range(Some((0x3000, &dev)), Some(range(0x20f8)));
        assert!(matches!(err, Err(BusError::Overlap { ref other, .. }) if other == "fixed"));
        assert_eq!(vcpu_view.device_at(0x3008), None);
        assert_eq!(
            vcpu_view.device_at(0x20f8),
            Some(0),
            "the fixed device keeps its range"
        );
        // Another device's range is not removed by a stale base.
        io.mmio
            .update_range(Some((0x2000, &dev)), Some(range(0x4000)))
            .unwrap();
        assert_eq!(vcpu_view.device_at(0x2000), Some(0));
        io.mmio.update_range(Some((0x4000, &dev)), None).unwrap();
        assert_eq!(vcpu_view.device_at(0x4000), None, "decoding off");
        let weak = io.mmio.downgrade();
        assert!(weak.upgrade().is_some());
        drop((io, vcpu_view));
        assert!(
            weak.upgrade().is_none(),
            "a weak handle does not keep the bus"
        );
    }

    #[test]
    fn a_device_on_both_buses_keeps_one_id() {
        let mut io = IoBuses::default();
        let dev = Arc::new(Recorder::default());
        let a = io.add_pio("pci", 0xcf8, 8, dev.clone()).unwrap();
        let b = io.add_mmio("pci", 0xe000_0000, 0x10_0000, dev).unwrap();
        assert_eq!(a, b);
    }
}
