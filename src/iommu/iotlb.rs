//! The unit's translation caches (VT-d §6.2): a context cache keyed by source-id and an IOTLB
//! keyed by (domain, IOVA page), each of a fixed capacity, the oldest entry evicted first.
//!
//! Only present entries are cached. CAP.CM = 0 promises the guest that a not-present entry is
//! never cached (§6.1), so it may map a page without invalidating anything: a cached
//! not-present entry would fault on a page it just mapped. Entries stay until evicted or
//! invalidated, whatever the guest writes to its tables meanwhile: that is what makes a
//! deferred invalidation an exposure, and the reason the VMM keeps a cache at all (a walker
//! without one would make deferral look free and safe).

use std::collections::BTreeMap;
use std::ops::RangeBounds;

use super::tables::{Context, Leaf};

/// IOTLB entries; real IOTLBs hold tens to a few hundred.
pub const IOTLB_ENTRIES: usize = 512;
/// Context-cache entries.
pub const CONTEXT_ENTRIES: usize = 64;

/// A map of at most `capacity` entries that evicts the oldest one to make room.
#[derive(Debug)]
struct Bounded<K, V> {
    capacity: usize,
    entries: BTreeMap<K, (V, u64)>,
    /// Keys by insertion stamp, oldest first.
    order: BTreeMap<u64, K>,
    next_stamp: u64,
    evictions: u64,
}

impl<K: Ord + Copy, V: Copy> Bounded<K, V> {
    fn new(capacity: usize) -> Self {
        Bounded {
            capacity,
            entries: BTreeMap::new(),
            order: BTreeMap::new(),
            next_stamp: 0,
            evictions: 0,
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        self.entries.get(key).map(|(v, _)| *v)
    }

    fn insert(&mut self, key: K, value: V) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        if let Some((_, old)) = self.entries.insert(key, (value, stamp)) {
            self.order.remove(&old);
        } else if self.entries.len() > self.capacity
            && let Some((_, oldest)) = self.order.pop_first()
        {
            self.entries.remove(&oldest);
            self.evictions += 1;
        }
        self.order.insert(stamp, key);
    }

    /// Remove the entries in `keys` that `pred` picks; returns them.
    fn remove(&mut self, keys: impl RangeBounds<K>, pred: impl Fn(&K, &V) -> bool) -> Vec<(K, V)> {
        let picked: Vec<(K, V, u64)> = self
            .entries
            .range(keys)
            .filter(|(k, (v, _))| pred(k, v))
            .map(|(k, (v, stamp))| (*k, *v, *stamp))
            .collect();
        for (k, _, stamp) in &picked {
            self.entries.remove(k);
            self.order.remove(stamp);
        }
        picked.into_iter().map(|(k, v, _)| (k, v)).collect()
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// What a context-cache invalidation names (§6.5.1.1, CCMD.CIRG or descriptor G).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextScope {
    /// Every entry.
    Global,
    /// The entries of one domain.
    Domain(u16),
    /// The entries of the source-ids equal to `source` outside `ignored` (the function mask
    /// FM: 1 ignores bit 2, 2 bits 2:1, 3 bits 2:0 of the source-id).
    Device {
        /// The source-id.
        source: u16,
        /// Source-id bits that do not matter.
        ignored: u16,
    },
}

impl ContextScope {
    /// A device-selective scope from a source-id and a function mask (0..=3).
    pub fn device(source: u16, function_mask: u64) -> Self {
        let ignored = match function_mask & 3 {
            0 => 0,
            1 => 0b100,
            2 => 0b110,
            _ => 0b111,
        };
        ContextScope::Device { source, ignored }
    }

    /// Whether the context of `source` in `domain` is named.
    pub fn covers(&self, source: u16, domain: Option<u16>) -> bool {
        match *self {
            ContextScope::Global => true,
            ContextScope::Domain(d) => domain == Some(d),
            ContextScope::Device { source: s, ignored } => (source ^ s) & !ignored == 0,
        }
    }
}

/// What an IOTLB invalidation names (§6.5.1.2, IOTLB.IIRG or descriptor G).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IotlbScope {
    /// Every entry.
    Global,
    /// The entries of one domain.
    Domain(u16),
    /// `count` pages of one domain from page number `first` (address >> 12): the address
    /// mask AM names 2^AM pages, aligned to their number.
    Pages {
        /// The domain whose entries are named.
        domain: u16,
        /// First page number.
        first: u64,
        /// Number of pages.
        count: u64,
    },
}

impl IotlbScope {
    /// A page-selective scope: the 2^`mask` pages around `address` (whose low bits below
    /// the mask are ignored, §6.5.1.2).
    pub fn pages(domain: u16, address: u64, mask: u32) -> Self {
        let count = 1u64 << mask;
        IotlbScope::Pages {
            domain,
            first: (address >> super::tables::PAGE_SHIFT) & !(count - 1),
            count,
        }
    }

    /// Whether the entry of `page` (a page number) in `domain` is named.
    pub fn covers(&self, domain: Option<u16>, page: u64) -> bool {
        match *self {
            IotlbScope::Global => true,
            IotlbScope::Domain(d) => domain == Some(d),
            IotlbScope::Pages {
                domain: d,
                first,
                count,
            } => domain == Some(d) && page.wrapping_sub(first) < count,
        }
    }
}

/// A cached translation: the page and, to tell later whether the guest had already
/// unmapped it when the entry was dropped, the table it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cached {
    /// The translated page and what it allows.
    pub leaf: Leaf,
    /// The page table it was walked from.
    pub page_table: u64,
}

/// Hits, misses and evictions of one cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheCounts {
    /// Lookups answered by the cache.
    pub hits: u64,
    /// Lookups that had to read guest memory.
    pub misses: u64,
    /// Entries dropped to make room (not by an invalidation).
    pub evictions: u64,
}

/// The context cache and the IOTLB.
#[derive(Debug)]
pub struct Caches {
    contexts: Bounded<u16, Context>,
    iotlb: Bounded<(u16, u64), Cached>,
    context_counts: CacheCounts,
    iotlb_counts: CacheCounts,
}

impl Default for Caches {
    fn default() -> Self {
        Caches {
            contexts: Bounded::new(CONTEXT_ENTRIES),
            iotlb: Bounded::new(IOTLB_ENTRIES),
            context_counts: CacheCounts::default(),
            iotlb_counts: CacheCounts::default(),
        }
    }
}

impl Caches {
    /// The cached context of `source`, counted as a hit or a miss.
    pub fn context(&mut self, source: u16) -> Option<Context> {
        count(&mut self.context_counts, self.contexts.get(&source))
    }

    /// Cache the (present, valid) context of `source`.
    pub fn insert_context(&mut self, source: u16, context: Context) {
        self.contexts.insert(source, context);
    }

    /// The cached translation of page number `page` in `domain`, counted.
    pub fn translation(&mut self, domain: u16, page: u64) -> Option<Cached> {
        count(&mut self.iotlb_counts, self.iotlb.get(&(domain, page)))
    }

    /// Cache the (present) translation of page number `page` in `domain`.
    pub fn insert_translation(&mut self, domain: u16, page: u64, cached: Cached) {
        self.iotlb.insert((domain, page), cached);
    }

    /// Drop the context-cache entries `scope` names; returns how many.
    pub fn invalidate_contexts(&mut self, scope: ContextScope) -> usize {
        self.contexts
            .remove(.., |&source, c| scope.covers(source, Some(c.domain)))
            .len()
    }

    /// Drop the IOTLB entries `scope` names; returns them, as (domain, page number, entry).
    pub fn invalidate_iotlb(&mut self, scope: IotlbScope) -> Vec<(u16, u64, Cached)> {
        let keys = match scope {
            IotlbScope::Global => (0, 0)..=(u16::MAX, u64::MAX),
            IotlbScope::Domain(d) => (d, 0)..=(d, u64::MAX),
            IotlbScope::Pages {
                domain,
                first,
                count,
            } => (domain, first)..=(domain, first.saturating_add(count - 1)),
        };
        self.iotlb
            .remove(keys, |_, _| true)
            .into_iter()
            .map(|((d, p), c)| (d, p, c))
            .collect()
    }

    /// Entries in the IOTLB now.
    pub fn iotlb_len(&self) -> usize {
        self.iotlb.len()
    }

    /// The context cache's counts.
    pub fn context_counts(&self) -> CacheCounts {
        CacheCounts {
            evictions: self.contexts.evictions,
            ..self.context_counts
        }
    }

    /// The IOTLB's counts.
    pub fn iotlb_counts(&self) -> CacheCounts {
        CacheCounts {
            evictions: self.iotlb.evictions,
            ..self.iotlb_counts
        }
    }
}

fn count<T>(counts: &mut CacheCounts, found: Option<T>) -> Option<T> {
    if found.is_some() {
        counts.hits += 1;
    } else {
        counts.misses += 1;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iommu::regs::{VTD_PTE_R, VTD_PTE_W};

    fn cached(page: u64) -> Cached {
        Cached {
            leaf: Leaf {
                page: page << 12,
                permissions: VTD_PTE_R | VTD_PTE_W,
            },
            page_table: 0x1000,
        }
    }

    fn filled() -> Caches {
        let mut c = Caches::default();
        for domain in [1u16, 2] {
            for page in 0..16 {
                c.insert_translation(domain, page, cached(page));
            }
        }
        c
    }

    fn present(c: &mut Caches) -> Vec<(u16, u64)> {
        let mut out = Vec::new();
        for domain in [1u16, 2] {
            for page in 0..16 {
                if c.translation(domain, page).is_some() {
                    out.push((domain, page));
                }
            }
        }
        out
    }

    #[test]
    fn each_granularity_drops_exactly_what_it_names() {
        let mut c = filled();
        assert_eq!(c.invalidate_iotlb(IotlbScope::Domain(1)).len(), 16);
        assert!(present(&mut c).iter().all(|&(d, _)| d == 2));
        let mut c = filled();
        // AM = 2 around page 5: pages 4..=7 of domain 2 only.
        let dropped = c.invalidate_iotlb(IotlbScope::pages(2, 5 << 12, 2));
        let mut pages: Vec<u64> = dropped.iter().map(|&(_, p, _)| p).collect();
        pages.sort();
        assert_eq!(pages, vec![4, 5, 6, 7]);
        assert!(dropped.iter().all(|&(d, _, _)| d == 2));
        assert_eq!(present(&mut c).len(), 28);
        assert!(c.translation(1, 5).is_some(), "another domain's page stays");
        // AM = 0: one page.
        assert_eq!(
            c.invalidate_iotlb(IotlbScope::pages(1, 9 << 12, 0)).len(),
            1
        );
        assert_eq!(c.invalidate_iotlb(IotlbScope::Global).len(), 27);
        assert_eq!(c.iotlb_len(), 0);
        // The largest mask from the last page does not overflow.
        c.insert_translation(1, u64::MAX >> 12, cached(1));
        let top = c.invalidate_iotlb(IotlbScope::pages(1, u64::MAX, 18));
        assert_eq!(top.len(), 1);
    }

    #[test]
    fn context_scopes_name_devices_under_the_function_mask_or_domains() {
        let mut c = Caches::default();
        let ctx = |domain| Context {
            domain,
            page_table: 0x1000,
        };
        for (source, domain) in [(0x10u16, 1u16), (0x11, 1), (0x15, 2), (0x18, 3)] {
            c.insert_context(source, ctx(domain));
        }
        assert_eq!(c.invalidate_contexts(ContextScope::device(0x10, 0)), 1);
        // FM = 1 ignores bit 2: 0x11 and 0x15 both match 0x11.
        assert_eq!(c.invalidate_contexts(ContextScope::device(0x11, 1)), 2);
        assert_eq!(c.context(0x18), Some(ctx(3)));
        assert_eq!(c.invalidate_contexts(ContextScope::Domain(3)), 1);
        assert_eq!(c.context(0x18), None);
        assert_eq!(
            c.context_counts(),
            CacheCounts {
                hits: 1,
                misses: 1,
                evictions: 0
            }
        );
    }

    #[test]
    fn the_iotlb_is_bounded_and_evicts_the_oldest_entries() {
        let mut c = Caches::default();
        let n = IOTLB_ENTRIES as u64;
        for page in 0..n + 10 {
            c.insert_translation(1, page, cached(page));
        }
        assert_eq!(c.iotlb_len(), IOTLB_ENTRIES);
        assert_eq!(c.iotlb_counts().evictions, 10);
        assert!(c.translation(1, 9).is_none(), "the oldest went first");
        assert!(c.translation(1, 10).is_some());
        // Replacing an entry is not an eviction, and invalidated entries leave room.
        c.insert_translation(1, 10, cached(99));
        assert_eq!(c.iotlb_counts().evictions, 10);
        c.invalidate_iotlb(IotlbScope::Domain(1));
        for page in 0..n {
            c.insert_translation(2, page, cached(page));
        }
        assert_eq!(c.iotlb_counts().evictions, 10);
        assert_eq!(
            c.iotlb_counts(),
            CacheCounts {
                hits: 1,
                misses: 1,
                evictions: 10
            }
        );
    }
}
