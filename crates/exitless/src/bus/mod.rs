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
        /// Name of the device whose range was refused.
        name: String,
        /// The refused range's first address.
        base: u64,
        /// The refused range's length.
        len: u64,
        /// The device already there.
        other: String,
    },
    /// A zero-length or wrapping range.
    #[error("the range {base:#x}+{len:#x} of {name} is empty or wraps")]
    BadRange {
        /// Name of the device whose range was refused.
        name: String,
        /// The refused range's first address.
        base: u64,
        /// The refused range's length.
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
    /// The device that serves accesses to the range.
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
mod tests;
