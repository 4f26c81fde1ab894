//! The ECAM-layout store of every function's configuration space.

use vm_memory::{Bytes, MmapRegion, VolatileMemory};

use super::{ConfigError, FUNCTION_SIZE};

/// Functions per bus in an ECAM window: 32 devices × 8 functions (PCIe 4.0 §7.2.2).
pub const FUNCTIONS_PER_BUS: usize = 256;

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

    /// Size of the window in bytes: 1 MiB per bus.
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

    pub(super) fn load_u32(&self, offset: usize) -> u32 {
        // Offsets are dword-aligned and inside a function's 4 KiB, checked by ConfigSpace; the
        // aligned volatile load is a single access, as a concurrent guest read would do.
        self.region
            .get_ref::<u32>(offset)
            .expect("config offset checked by caller")
            .load()
    }

    pub(super) fn store_u32(&self, offset: usize, value: u32) {
        // One aligned store, so a guest reading the shadow on another vCPU sees the whole old or
        // the whole new dword, never a mix.
        self.region
            .get_ref::<u32>(offset)
            .expect("config offset checked by caller")
            .store(value)
    }
}
