//! The unit's translation caches (VT-d §6.2): a context cache keyed by source-id, an IOTLB
//! keyed by (domain, IOVA page) and a paging-structure cache keyed by (domain, 2 MiB region of
//! IOVAs), each of a fixed capacity, set-associative (see `sets`).
//!
//! Only present entries are cached. CAP.CM = 0 promises the guest that a not-present entry is
//! never cached (§6.1), so it may map a page without invalidating anything: a cached
//! not-present entry would fault on a page it just mapped. Entries stay until evicted or
//! invalidated, whatever the guest writes to its tables meanwhile: that is what makes a
//! deferred invalidation an exposure, and the reason the VMM keeps a cache at all (a walker
//! without one would make deferral look free and safe).
//!
//! The paging-structure cache holds the upper three levels of a walk (a PDE-cache entry,
//! §6.2.4: the last-level table and the permissions above it), so an IOTLB miss in a region
//! walked before reads one entry of guest memory, not four. It goes exactly when the spec
//! lets hardware's go (§6.5.1.2, §6.5.2.3): with global and domain-selective IOTLB
//! invalidations, page-selective ones with the invalidation hint (IH) clear for the regions
//! they touch, and context-cache invalidations for the domains they name (§6.5.2.1: software
//! follows them with an IOTLB invalidation, but the entries hang off the context).

mod sets;
#[cfg(test)]
mod tests;

use super::regs::VTD_IVA_IH;
use super::tables::{
    Context, DIRECTORY_SHIFT, Directory, LARGE_PAGE_SIZE, Leaf, PAGE_SHIFT, PAGE_SIZE,
};
use sets::SetAssociative;

/// IOTLB entries; real IOTLBs hold tens to a few hundred.
pub const IOTLB_ENTRIES: usize = 512;
/// Context-cache entries.
pub const CONTEXT_ENTRIES: usize = 64;
/// Paging-structure-cache entries, each for 2 MiB of one domain's IOVAs.
pub const DIRECTORY_ENTRIES: usize = 64;
/// Page-selective invalidations of at most this many pages look their pages up; larger ones
/// search the whole IOTLB, which is as quick.
const PAGES_LOOKED_UP: u64 = 64;

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
        /// IH: only last-level entries changed; the paging-structure caches stay.
        hint: bool,
    },
}

impl IotlbScope {
    /// A page-selective scope: the 2^`mask` pages around `address` (whose low bits below
    /// the mask are ignored, §6.5.1.2), with the hint IH from bit 6 of `address`.
    pub fn pages(domain: u16, address: u64, mask: u32) -> Self {
        let count = 1u64 << mask;
        IotlbScope::Pages {
            domain,
            first: (address >> PAGE_SHIFT) & !(count - 1),
            count,
            hint: address & VTD_IVA_IH != 0,
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
                ..
            } => domain == Some(d) && page.wrapping_sub(first) < count,
        }
    }

    /// Whether an IOTLB entry of `domain` for `count` pages from page number `page` (a 4 KiB
    /// or a 2 MiB page) goes: page-selective invalidations name entries that overlap them.
    fn overlaps(&self, domain: u16, page: u64, count: u64) -> bool {
        match *self {
            IotlbScope::Pages {
                domain: d,
                first,
                count: n,
                ..
            } => domain == d && page < first.saturating_add(n) && first < page + count,
            _ => self.covers(Some(domain), page),
        }
    }

    /// Whether the paging-structure-cache entry of `region` (IOVA >> 21) in `domain` goes:
    /// not with the hint, which says only last-level entries changed.
    fn covers_region(&self, domain: u16, region: u64) -> bool {
        !matches!(self, IotlbScope::Pages { hint: true, .. })
            && self.overlaps(domain, region << LARGE_PAGES_SHIFT, 1 << LARGE_PAGES_SHIFT)
    }
}

/// 4 KiB pages in a 2 MiB page (or a region), as a shift.
const LARGE_PAGES_SHIFT: u32 = DIRECTORY_SHIFT - PAGE_SHIFT;
/// IOTLB keys of 2 MiB pages: this bit (never set in a page number) and the region number.
const LARGE_KEY: u64 = 1 << 63;

/// The IOTLB key of page number `page` in an entry for a page of `size` bytes.
fn iotlb_key(domain: u16, page: u64, size: u64) -> (u16, u64) {
    if size == PAGE_SIZE {
        (domain, page)
    } else {
        (domain, LARGE_KEY | page >> LARGE_PAGES_SHIFT)
    }
}

/// The first page number and the number of pages an IOTLB key stands for.
fn key_pages(key: u64) -> (u64, u64) {
    if key & LARGE_KEY == 0 {
        (key, 1)
    } else {
        (
            (key & !LARGE_KEY) << LARGE_PAGES_SHIFT,
            1 << LARGE_PAGES_SHIFT,
        )
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

/// One set-associative cache and its counts.
#[derive(Debug)]
struct Counted<K, V, const WAYS: usize> {
    entries: SetAssociative<K, V, WAYS>,
    counts: CacheCounts,
}

impl<K: sets::SetIndex + Copy + Eq, V: Copy, const WAYS: usize> Counted<K, V, WAYS> {
    fn new(entries: usize) -> Self {
        Counted {
            entries: SetAssociative::new(entries),
            counts: CacheCounts::default(),
        }
    }

    /// The entry of `key` if `valid` accepts it, counted as a hit or a miss.
    fn get(&mut self, key: &K, valid: impl Fn(&V) -> bool) -> Option<V> {
        let found = self.entries.get(key).filter(valid);
        self.count(found)
    }

    /// Count a lookup.
    fn count(&mut self, found: Option<V>) -> Option<V> {
        if found.is_some() {
            self.counts.hits += 1;
        } else {
            self.counts.misses += 1;
        }
        found
    }

    fn counts(&self) -> CacheCounts {
        CacheCounts {
            evictions: self.entries.evictions(),
            ..self.counts
        }
    }
}

/// The context cache, the IOTLB and the paging-structure cache.
#[derive(Debug)]
pub struct Caches {
    contexts: Counted<u16, Context, 4>,
    iotlb: Counted<(u16, u64), Cached, 8>,
    directories: Counted<(u16, u64), Directory, 4>,
}

impl Default for Caches {
    fn default() -> Self {
        Caches {
            contexts: Counted::new(CONTEXT_ENTRIES),
            iotlb: Counted::new(IOTLB_ENTRIES),
            directories: Counted::new(DIRECTORY_ENTRIES),
        }
    }
}

impl Caches {
    /// The cached context of `source`, counted as a hit or a miss.
    pub fn context(&mut self, source: u16) -> Option<Context> {
        self.contexts.get(&source, |_| true)
    }

    /// Cache the (present, valid) context of `source`.
    pub fn insert_context(&mut self, source: u16, context: Context) {
        self.contexts.entries.insert(source, context);
    }

    /// The cached translation of page number `page` in `domain`, counted: a 4 KiB page's
    /// entry, else the entry of the 2 MiB page around it.
    pub fn translation(&mut self, domain: u16, page: u64) -> Option<Cached> {
        let entries = &mut self.iotlb.entries;
        let found = entries
            .get(&(domain, page))
            .or_else(|| entries.get(&iotlb_key(domain, page, LARGE_PAGE_SIZE)));
        self.iotlb.count(found)
    }

    /// Cache the (present) translation of page number `page` in `domain`: one entry for the
    /// whole page, 4 KiB or 2 MiB.
    pub fn insert_translation(&mut self, domain: u16, page: u64, cached: Cached) {
        let key = iotlb_key(domain, page, cached.leaf.size);
        self.iotlb.entries.insert(key, cached);
    }

    /// The cached upper levels for `iova` under `context`, counted: only those walked from
    /// the context's own page table.
    pub fn directory(&mut self, context: &Context, iova: u64) -> Option<Directory> {
        let key = (context.domain, iova >> DIRECTORY_SHIFT);
        self.directories
            .get(&key, |d| d.page_table == context.page_table)
    }

    /// Cache the upper levels walked for `iova` in `domain`.
    pub fn insert_directory(&mut self, domain: u16, iova: u64, directory: Directory) {
        let key = (domain, iova >> DIRECTORY_SHIFT);
        self.directories.entries.insert(key, directory);
    }

    /// Drop the context-cache entries `scope` names, and the paging-structure-cache entries
    /// of their domains (of the domain named, or all); returns how many contexts went.
    pub fn invalidate_contexts(&mut self, scope: ContextScope) -> usize {
        let mut domains = Vec::new();
        self.contexts.entries.remove_where(
            |&source, c| scope.covers(source, Some(c.domain)),
            |_, c| domains.push(c.domain),
        );
        let dropped = domains.len();
        if let ContextScope::Domain(d) = scope {
            domains.push(d);
        }
        let all = scope == ContextScope::Global;
        self.directories
            .entries
            .remove_where(|(d, _), _| all || domains.contains(d), |_, _| ());
        dropped
    }

    /// Drop the IOTLB entries `scope` names, and the paging-structure-cache entries it
    /// covers; returns the IOTLB entries, as (domain, page number, entry).
    pub fn invalidate_iotlb(&mut self, scope: IotlbScope) -> Vec<(u16, u64, Cached)> {
        let mut dropped = Vec::new();
        let iotlb = &mut self.iotlb.entries;
        match scope {
            IotlbScope::Pages {
                domain,
                first,
                count,
                ..
            } if count <= PAGES_LOOKED_UP => {
                let last = first + count - 1;
                let large = |page| iotlb_key(domain, page, LARGE_PAGE_SIZE);
                let keys = (first..=last).map(|page| (domain, page));
                let regions = (first..=last).step_by(1 << LARGE_PAGES_SHIFT).chain([last]);
                for key in keys.chain(regions.map(large)) {
                    if let Some(c) = iotlb.remove(&key) {
                        dropped.push((domain, key_pages(key.1).0, c));
                    }
                }
            }
            _ => iotlb.remove_where(
                |&(d, key), _| {
                    let (page, count) = key_pages(key);
                    scope.overlaps(d, page, count)
                },
                |(d, key), c| dropped.push((d, key_pages(key).0, c)),
            ),
        }
        self.directories
            .entries
            .remove_where(|&(d, region), _| scope.covers_region(d, region), |_, _| ());
        dropped
    }

    /// Entries in the IOTLB now.
    pub fn iotlb_len(&self) -> usize {
        self.iotlb.entries.len()
    }

    /// The context cache's counts.
    pub fn context_counts(&self) -> CacheCounts {
        self.contexts.counts()
    }

    /// The IOTLB's counts.
    pub fn iotlb_counts(&self) -> CacheCounts {
        self.iotlb.counts()
    }

    /// The paging-structure cache's counts.
    pub fn directory_counts(&self) -> CacheCounts {
        self.directories.counts()
    }
}
