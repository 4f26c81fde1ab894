//! The interrupt entry cache (VT-d §6.5.2.7): decoded IRTEs by interrupt index, so a message
//! does not read guest memory each time, and so an entry the guest rewrote stays in use until
//! software invalidates it, as on hardware. Only usable entries are cached (a not-present or
//! bad entry is read again at the next message). Bounded: when full, it starts over.

use std::collections::BTreeMap;

use super::super::iotlb::CacheCounts;
use super::super::regs::*;
use super::irte::Irte;

/// Entries the cache holds at most.
const CAPACITY: usize = 256;

/// What an interrupt entry cache invalidation covers (§6.5.2.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IecScope {
    /// Every entry.
    Global,
    /// 2^mask entries from `index` (aligned down to them).
    Indexed {
        /// IIDX.
        index: u16,
        /// IM: the log2 of the entries covered.
        mask: u8,
    },
}

impl IecScope {
    /// The scope of a type-4 descriptor's low qword: G (4), IM (31:27), IIDX (47:32).
    pub fn decode(low: u64) -> IecScope {
        if low & VTD_QI_IEC_INDEXED == 0 {
            return IecScope::Global;
        }
        IecScope::Indexed {
            index: (low >> VTD_QI_IEC_IIDX_SHIFT) as u16,
            mask: ((low >> VTD_QI_IEC_IM_SHIFT) & 0x1f) as u8,
        }
    }

    /// Whether interrupt index `index` is covered.
    pub fn covers(self, index: u32) -> bool {
        match self {
            IecScope::Global => true,
            IecScope::Indexed { index: first, mask } => {
                // IM can name up to 2^31 entries; indices are 16 bits wide.
                let span = 1u64 << mask;
                let first = u64::from(first) & !(span - 1);
                (first..first + span).contains(&u64::from(index))
            }
        }
    }
}

/// The cache and its counts.
#[derive(Debug, Default)]
pub struct EntryCache {
    entries: BTreeMap<u32, Irte>,
    counts: CacheCounts,
}

impl EntryCache {
    /// The cached entry for `index`, counted as a hit or a miss.
    pub fn get(&mut self, index: u32) -> Option<Irte> {
        let found = self.entries.get(&index).copied();
        match found {
            Some(_) => self.counts.hits += 1,
            None => self.counts.misses += 1,
        }
        found
    }

    /// Cache a usable entry read from the table.
    pub fn insert(&mut self, index: u32, entry: Irte) {
        if self.entries.len() == CAPACITY {
            self.counts.evictions += self.entries.len() as u64;
            self.entries.clear();
        }
        self.entries.insert(index, entry);
    }

    /// Drop what `scope` covers; returns how many entries went.
    pub fn invalidate(&mut self, scope: IecScope) -> usize {
        let before = self.entries.len();
        self.entries.retain(|&index, _| !scope.covers(index));
        before - self.entries.len()
    }

    /// Hits, misses and evictions so far.
    pub fn counts(&self) -> CacheCounts {
        self.counts
    }
}
