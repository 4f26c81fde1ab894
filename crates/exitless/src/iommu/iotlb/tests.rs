//! The caches alone (scopes, capacity, set-associative replacement), and the
//! paging-structure cache through the unit's register page, as a driver programs it.

use super::*;
use crate::dma::Access;
use crate::iommu::TranslationError;
use crate::iommu::regs::*;
use crate::iommu::tables::build::Tables;
use crate::iommu::testing::*;
use vm_memory::{Bytes, GuestAddress};

fn cached(page: u64) -> Cached {
    Cached {
        leaf: Leaf {
            page: page << 12,
            size: PAGE_SIZE,
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
    let gone: Vec<u64> = (0..n + 10)
        .filter(|&page| c.translation(1, page).is_none())
        .collect();
    assert_eq!(gone.len(), 10);
    assert!(gone.iter().all(|&p| p < 64), "among the oldest: {gone:?}");
    // Replacing an entry is not an eviction, and invalidated entries leave room.
    c.insert_translation(1, 100, cached(99));
    assert_eq!(c.iotlb_counts().evictions, 10);
    c.invalidate_iotlb(IotlbScope::Domain(1));
    for page in 0..n {
        c.insert_translation(2, page, cached(page));
    }
    // As many pages 8 apart (the probe's slots) fit too.
    c.invalidate_iotlb(IotlbScope::Domain(2));
    for page in 0..n {
        c.insert_translation(2, page * 8, cached(page));
    }
    assert_eq!(
        c.iotlb_counts(),
        CacheCounts {
            hits: n,
            misses: 10,
            evictions: 10
        }
    );
}

#[test]
fn within_a_set_the_least_recently_used_entry_goes_first() {
    let mut c = Caches::default();
    // Pages 65 apart share a set of domain 0 (64 * i + i folds to i ^ i): eight ways.
    for way in 0..8u64 {
        c.insert_translation(0, way * 65, cached(way));
    }
    assert!(c.translation(0, 0).is_some(), "page 0 used last");
    c.insert_translation(0, 8 * 65, cached(8));
    assert!(c.translation(0, 0).is_some());
    assert!(
        c.translation(0, 65).is_none(),
        "the least recently used went"
    );
    assert_eq!(c.iotlb_counts().evictions, 1);
    assert_eq!(c.iotlb_len(), 8);
}

/// Where the last-level table of `iova`'s 2 MiB region is named (its PDE), under `pt`.
fn pde(t: &Tables, pt: u64, iova: u64) -> u64 {
    let mut table = pt;
    for level in [3u32, 2] {
        let index = (iova >> (12 + 9 * level)) & 0x1ff;
        table = t.read(table + 8 * index) & VTD_PTE_ADDR_MASK;
    }
    table + 8 * ((iova >> 21) & 0x1ff)
}

/// IOVAs A and B in one 2 MiB region of domain 1 (00:03.0), and 00:03.1 in domain 2.
const A: u64 = 0x20_0000;
const B: u64 = 0x20_1000;
const OLD: u64 = 0x8_0000;
const NEW: u64 = 0x9_0000;

/// A unit that translated A (caching the region's upper levels), whose region's PDE then
/// moved, behind the caches' back, to a table that maps B to `NEW` where the old one maps it
/// to `OLD`; `invalidate` then runs. Returns where B translates and the paging-structure
/// cache's counts.
fn after(invalidate: &[[u64; 2]]) -> (u64, CacheCounts) {
    let mut u = unit();
    let mut t = Tables::new(&u.mem, ROOT);
    u.enable();
    u.enable_queue();
    let pt = t.attach(SID, 1);
    let other = t.attach(SID + 1, 2);
    t.map(pt, A, 0x7_0000, RW);
    t.map(pt, B, OLD, RW);
    t.map(other, B, NEW, RW);
    assert_eq!(u.translate(A, Access::Read), Ok(0x7_0000));
    u.translate(0, Access::Read).unwrap_err();
    u.clear_faults();
    // Domain 2's context cached too, so that naming it drops something.
    u.iommu.translate(SID + 1, B, Access::Read).unwrap();
    t.write(pde(&t, pt, A), t.read(pde(&t, other, B)));
    u.submit(invalidate);
    let b = u.translate(B, Access::Read).unwrap();
    (b, u.iommu.stats().paging_cache)
}

#[test]
fn a_stale_upper_level_entry_is_used_until_an_invalidation_covers_it() {
    let page = |iova: u64, hint: u64| iotlb_pages(1, iova, hint);
    let context_domain = |d: u64| {
        [
            VTD_QI_CC_TYPE | VTD_GRAN_DOMAIN << VTD_QI_GRAN_SHIFT | d << VTD_QI_DID_SHIFT,
            0,
        ]
    };
    let context_global = [VTD_QI_CC_TYPE | VTD_GRAN_GLOBAL << VTD_QI_GRAN_SHIFT, 0];
    let kept: [&[[u64; 2]]; 7] = [
        &[],
        &[page(B, VTD_IVA_IH)],
        &[page(0x40_0000, 0)],
        &[iotlb_pages(2, B, 0)],
        &[iotlb_domain(2)],
        &[context_device(SID + 1)],
        &[context_domain(2)],
    ];
    for invalidate in kept {
        let (b, counts) = after(invalidate);
        assert_eq!(
            b, OLD,
            "{invalidate:x?}: the cached upper levels are still in use"
        );
        assert_eq!((counts.hits, counts.misses), (1, 3), "{invalidate:x?}");
    }
    let dropped: [&[[u64; 2]]; 6] = [
        &[page(B, 0)],
        &[page(0x20_0000, 9)],
        &[iotlb_domain(1)],
        &[iotlb_global()],
        &[context_device(SID)],
        &[context_global, wait(Some(1), false)],
    ];
    for invalidate in dropped {
        let (b, counts) = after(invalidate);
        assert_eq!(
            b, NEW,
            "{invalidate:x?}: the stale upper levels were not used"
        );
        assert_eq!((counts.hits, counts.misses), (0, 4), "{invalidate:x?}");
    }
}

#[test]
fn an_iotlb_miss_in_a_region_walked_before_reads_only_its_last_level() {
    let u = unit();
    let mut t = Tables::new(&u.mem, ROOT);
    u.enable();
    let pt = t.attach(SID, 1);
    for page in 0..8u64 {
        t.map(pt, A + (page << 12), 0x8_0000 + (page << 12), RW);
    }
    for page in 0..8u64 {
        u.translate(A + (page << 12), Access::Read).unwrap();
    }
    let s = u.iommu.stats();
    assert_eq!((s.walks, s.iotlb.misses), (8, 8));
    assert_eq!((s.paging_cache.hits, s.paging_cache.misses), (7, 1));
    // A last-level entry unmapped behind the cache's back still faults: only the upper
    // levels are cached.
    t.unmap(pt, A + 0x8000);
    assert!(u.translate(A + 0x8000, Access::Read).is_err());
}

#[test]
fn a_buffer_is_translated_once_per_contiguous_run() {
    let u = unit();
    let mut t = Tables::new(&u.mem, ROOT);
    u.enable();
    let pt = t.attach(SID, 1);
    // Pages 0..4 contiguous from 0x8_0000, page 4 elsewhere, page 5 not mapped.
    for page in 0..4u64 {
        t.map(pt, A + (page << 12), 0x8_0000 + (page << 12), RW);
    }
    t.map(pt, A + 0x4000, 0x6_0000, RW);
    let run = |iova, want| {
        u.iommu
            .translate_run(SID, iova, want, Access::Read)
            .unwrap()
    };
    let whole = run(A + 0x10, 0x6000);
    assert_eq!((whole.address, whole.len), (0x8_0010, 0x4000 - 0x10));
    assert_eq!(
        run(A + 0x10, 0x1000).len,
        0x2000 - 0x10,
        "to the page where it ends"
    );
    assert_eq!(run(A + 0x10, 1).len, 0x1000 - 0x10, "at least its own page");
    assert_eq!(
        run(A + 0x4000, 0x2000).len,
        0x1000,
        "an unmapped page ends it"
    );
    assert_eq!(
        u.fault_reason(),
        None,
        "quietly: the device faults when it gets there"
    );
    // Through a device: one run, then the next page, then the fault.
    let dma = u.device();
    for (page, gpa) in [0x8_0000u64, 0x8_1000, 0x8_2000, 0x8_3000, 0x6_0000]
        .into_iter()
        .enumerate()
    {
        u.mem.write_obj(page as u8 + 1, GuestAddress(gpa)).unwrap();
    }
    let mut buf = [0u8; 0x5000];
    assert_eq!(
        dma.read(GuestAddress(A), &mut buf),
        Ok(()),
        "five pages in two runs"
    );
    let firsts: Vec<u8> = buf.chunks(0x1000).map(|page| page[0]).collect();
    assert_eq!(firsts, [1, 2, 3, 4, 5]);
    assert!(
        dma.read(GuestAddress(A + 0x4ff0), &mut [0u8; 0x20])
            .is_err()
    );
    assert_eq!(u.fault_reason(), Some(VTD_FR_READ));
}

#[test]
fn a_2mib_page_is_one_translation_one_iotlb_entry_and_one_run() {
    assert_ne!(crate::iommu::CAP & VTD_CAP_SLLPS_2M, 0, "offered");
    let mut u = unit_of(0x80_0000);
    let mut t = Tables::new(&u.mem, ROOT);
    u.enable();
    u.enable_queue();
    let pt = t.attach(SID, 1);
    t.map_large(pt, 0x40_0000, 0x20_0000, RW);
    t.map_large(pt, 0x60_0000, 0x40_0000, VTD_PTE_R);
    let run = |iova, want| {
        u.iommu
            .translate_run(SID, iova, want, Access::Read)
            .unwrap()
    };
    let one = run(0x40_1000, 0x1000);
    assert_eq!(
        (one.address, one.len),
        (0x20_1000, 0x1f_f000),
        "to the end of the page"
    );
    assert_eq!(
        run(0x40_0000, 0x40_0000).len,
        0x40_0000,
        "two pages that follow on"
    );
    let s = u.iommu.stats();
    assert_eq!((s.walks, s.iotlb.misses, s.iotlb.hits), (2, 2, 1));
    assert_eq!(
        u.iommu.translate_run(SID, 0x60_0000, 1, Access::Write),
        Err(TranslationError::Fault {
            addr: 0x60_0000,
            reason: VTD_FR_WRITE
        })
    );
    // One entry stands for the whole page: a page-selective invalidation of another 4 KiB
    // page in it drops it, hint or not (it is a leaf).
    t.map_large(pt, 0x40_0000, 0x60_0000, RW);
    assert_eq!(
        u.translate(0x40_8000, Access::Read),
        Ok(0x20_8000),
        "cached"
    );
    u.submit(&[iotlb_pages(1, 0x41_f000, VTD_IVA_IH)]);
    assert_eq!(u.translate(0x40_8000, Access::Read), Ok(0x60_8000));
    assert_eq!(u.iommu.stats().iotlb_dropped_stale, 1);
    // Address bits 20:12 of a 2 MiB page are reserved; PS in a PDPTE is too (no 1 GiB).
    t.map_large(pt, 0x40_0000, 0x20_1000, RW);
    u.submit(&[iotlb_domain(1)]);
    assert_eq!(
        u.translate(0x40_0000, Access::Read),
        Err(reserved(0x40_0000))
    );
    let pdpte = t.read(pt) & VTD_PTE_ADDR_MASK;
    t.write(pdpte, t.read(pdpte) | VTD_PTE_PS);
    u.submit(&[iotlb_domain(1)]);
    assert_eq!(u.translate(0x80, Access::Read), Err(reserved(0x80)));
}

fn reserved(addr: u64) -> TranslationError {
    TranslationError::Fault {
        addr,
        reason: VTD_FR_PTE_RESERVED,
    }
}
