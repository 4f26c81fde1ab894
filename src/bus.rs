//! Guest address spaces (port I/O and MMIO) mapped to devices.
//!
//! A [`Bus`] is an ordered map of non-overlapping ranges, built before the vCPUs start and then
//! shared read-only: lookups take no lock. Devices take `&self` and do their own locking, so a
//! hot device never waits behind an unrelated one.

use std::collections::BTreeMap;
use std::sync::Arc;

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
    device: Arc<dyn BusDevice>,
}

/// One address space: port I/O or MMIO.
#[derive(Default, Clone)]
pub struct Bus {
    entries: BTreeMap<u64, BusEntry>,
}

impl Bus {
    fn insert(
        &mut self,
        names: &[String],
        id: DeviceId,
        base: u64,
        len: u64,
        device: Arc<dyn BusDevice>,
    ) -> Result<(), BusError> {
        let name = names[id].clone();
        let last = match base.checked_add(len) {
            Some(end) if len > 0 => end - 1,
            _ => return Err(BusError::BadRange { name, base, len }),
        };
        // The entry starting at or before `last` with the greatest base is the only candidate.
        if let Some((&b, e)) = self.entries.range(..=last).next_back()
            && b + e.len > base
        {
            let other = names[e.id].clone();
            return Err(BusError::Overlap {
                name,
                base,
                len,
                other,
            });
        }
        self.entries.insert(base, BusEntry { len, id, device });
        Ok(())
    }

    fn resolve(&self, addr: u64) -> Option<(&BusEntry, u64)> {
        let (&base, entry) = self.entries.range(..=addr).next_back()?;
        let offset = addr - base;
        (offset < entry.len).then_some((entry, offset))
    }

    /// The device that claims `addr`, if any.
    pub fn device_at(&self, addr: u64) -> Option<DeviceId> {
        self.resolve(addr).map(|(entry, _)| entry.id)
    }

    /// Read at `addr`; unclaimed addresses read all-ones, as a floating x86 bus does.
    pub fn read(&self, addr: u64, data: &mut [u8]) {
        match self.resolve(addr) {
            Some((entry, offset)) => entry.device.read(offset, data),
            None => data.fill(0xff),
        }
    }

    /// Write at `addr`; writes to unclaimed addresses are dropped.
    pub fn write(&self, addr: u64, data: &[u8]) {
        if let Some((entry, offset)) = self.resolve(addr) {
            entry.device.write(offset, data);
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
    fn id_for(&mut self, name: &str) -> DeviceId {
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
        self.pio
            .insert(&self.names, id, base.into(), len.into(), device)?;
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
        self.mmio.insert(&self.names, id, base, len, device)?;
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
    fn a_device_on_both_buses_keeps_one_id() {
        let mut io = IoBuses::default();
        let dev = Arc::new(Recorder::default());
        let a = io.add_pio("pci", 0xcf8, 8, dev.clone()).unwrap();
        let b = io.add_mmio("pci", 0xe000_0000, 0x10_0000, dev).unwrap();
        assert_eq!(a, b);
    }
}
