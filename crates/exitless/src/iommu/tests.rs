//! The unit through its register page, as a driver programs it, on in-memory guest memory and
//! the routing fakes.

use std::sync::Arc;
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress};

use super::regs::*;
use super::tables::build::Tables;
use super::testing::*;
use super::*;
use crate::bus::BusDevice;
use crate::dma::{Access, DmaContext, DmaError, RingArea, RingWatch};

#[test]
fn the_register_page_reads_by_dword_or_qword_and_undefined_offsets_read_zero() {
    let u = unit();
    assert_eq!(u.r32(VTD_VER_REG), VTD_VER_VALUE);
    assert_eq!(u.r64(VTD_CAP_REG), CAP);
    assert_eq!(
        u64::from(u.r32(VTD_CAP_REG)) | u64::from(u.r32(VTD_CAP_REG + 4)) << 32,
        CAP
    );
    // What a driver reads out of CAP and ECAP.
    assert_eq!((CAP >> VTD_CAP_FRO_SHIFT & 0x3ff) * 16, VTD_FRCD_REG);
    assert_eq!((ECAP >> VTD_ECAP_IRO_SHIFT & 0x3ff) * 16, VTD_IVA_REG);
    assert_eq!(CAP >> VTD_CAP_MGAW_SHIFT & 0x3f, 47);
    assert_eq!(CAP & (1 << 7), 0, "CM = 0: maps need no invalidation");
    assert_eq!(u.r32(VTD_FECTL_REG), VTD_EVENT_IM, "masked at reset");
    assert_eq!(u.r32(VTD_IECTL_REG), VTD_EVENT_IM);
    for undefined in [0x48, 0x60, 0x100, 0x218, 0x230, 0xff8] {
        assert_eq!(u.r64(undefined), 0, "{undefined:#x}");
        u.w64(undefined, u64::MAX);
        assert_eq!(u.r64(undefined), 0);
    }
    // Other widths and misaligned accesses are ignored.
    let mut b = [0xffu8; 2];
    u.iommu.read(VTD_VER_REG, &mut b);
    assert_eq!(b, [0, 0]);
    u.iommu.write(VTD_RTADDR_REG + 2, &[0xff; 4]);
    u.iommu.write(VTD_RTADDR_REG, &[0xff; 2]);
    assert_eq!(u.r64(VTD_RTADDR_REG), 0);
    // A 64-bit register takes either half.
    u.w32(VTD_RTADDR_REG + 4, 0x1);
    u.w32(VTD_RTADDR_REG, 0x0002_3456);
    assert_eq!(u.r64(VTD_RTADDR_REG), 0x1_0002_3000, "63:12 kept");
    assert!(u.iommu.log().guest_errors() > 0);
}

#[test]
fn global_commands_act_on_the_difference_from_the_status() {
    let u = unit();
    assert_eq!(u.r32(VTD_GSTS_REG), 0);
    u.w64(VTD_RTADDR_REG, ROOT);
    u.command(VTD_GCMD_SRTP);
    assert_eq!(u.r32(VTD_GSTS_REG), VTD_GCMD_SRTP, "RTPS");
    u.command(VTD_GCMD_TE);
    assert_eq!(u.r32(VTD_GSTS_REG), VTD_GCMD_SRTP | VTD_GCMD_TE);
    // WBF completes at once; SRTP again with TE kept on does not turn it off.
    u.command(VTD_GCMD_WBF);
    u.command(VTD_GCMD_SRTP);
    assert_eq!(u.r32(VTD_GSTS_REG), VTD_GCMD_SRTP | VTD_GCMD_TE);
    u.w32(VTD_GCMD_REG, 0);
    assert_eq!(u.r32(VTD_GSTS_REG), VTD_GCMD_SRTP, "TE off");
    assert_eq!(u.r32(VTD_GCMD_REG), 0, "GCMD reads 0");
}

#[test]
fn translation_goes_through_four_levels_with_permissions_and_is_off_until_enabled() {
    let u = unit();
    let mut t = Tables::new(&u.mem, ROOT);
    let pt = t.attach(SID, 1);
    t.map(pt, 0x1234_5000, 0x8_0000, RW);
    t.map(pt, 0x1234_6000, 0x9_0000, VTD_PTE_R);
    assert_eq!(
        u.translate(0x1234_5008, Access::Read),
        Ok(0x1234_5008),
        "off"
    );
    u.enable();
    assert_eq!(u.translate(0x1234_5008, Access::Write), Ok(0x8_0008));
    assert_eq!(u.translate(0x1234_6ff0, Access::Read), Ok(0x9_0ff0));
    assert_eq!(
        u.translate(0x1234_6ff0, Access::Write),
        Err(TranslationError::Fault {
            addr: 0x1234_6ff0,
            reason: VTD_FR_WRITE
        })
    );
    let s = u.iommu.stats();
    assert_eq!((s.walks, s.iotlb.misses, s.iotlb.hits), (2, 2, 1));
    assert_eq!((s.context_cache.misses, s.context_cache.hits), (1, 2));
    assert_eq!(s.faults, 1);
}

/// Provoke a fault of `reason` for `SID`.
fn provoke(u: &Unit, t: &mut Tables, reason: u8) -> Result<u64, TranslationError> {
    let pt = match reason {
        VTD_FR_ROOT_NOT_PRESENT => return u.translate(0x1000, Access::Read),
        VTD_FR_ROOT_TABLE => {
            u.w64(VTD_RTADDR_REG, RAM + 0x1000);
            u.command(VTD_GCMD_SRTP);
            return u.translate(0x1000, Access::Read);
        }
        _ => t.attach(SID, 1),
    };
    let ctx = t.read(ROOT) & !0xfff;
    match reason {
        VTD_FR_CONTEXT_NOT_PRESENT => t.write(ctx + 16 * u64::from(SID), 0),
        VTD_FR_CONTEXT_TABLE => t.write(ROOT, (RAM + 0x2000) | VTD_ROOT_P),
        VTD_FR_CONTEXT_INVALID => t.write(ctx + 16 * u64::from(SID) + 8, 1),
        VTD_FR_ADDRESS_WIDTH => return u.translate(1 << 48, Access::Read),
        VTD_FR_READ => t.map(pt, 0x1000, 0x8000, VTD_PTE_W),
        VTD_FR_WRITE => {
            t.map(pt, 0x1000, 0x8000, VTD_PTE_R);
            return u.translate(0x1000, Access::Write);
        }
        VTD_FR_PTE => t.map(pt, 0x1000, RAM, RW),
        VTD_FR_PTE_RESERVED => {
            t.map(pt, 0x1000, 0x8000, RW);
            t.write(pt, t.read(pt) | VTD_PTE_PS);
        }
        _ => unreachable!("not a reason the unit raises"),
    }
    u.translate(0x1000, Access::Read)
}

const REASONS: [u8; 10] = [
    VTD_FR_ROOT_NOT_PRESENT,
    VTD_FR_CONTEXT_NOT_PRESENT,
    VTD_FR_CONTEXT_INVALID,
    VTD_FR_ADDRESS_WIDTH,
    VTD_FR_WRITE,
    VTD_FR_READ,
    VTD_FR_PTE,
    VTD_FR_ROOT_TABLE,
    VTD_FR_CONTEXT_TABLE,
    VTD_FR_PTE_RESERVED,
];

#[test]
fn every_fault_reason_reaches_frcd0_and_the_unmasked_fault_event() {
    for reason in REASONS {
        let u = unit();
        let mut t = Tables::new(&u.mem, ROOT);
        u.enable();
        let got = provoke(&u, &mut t, reason);
        assert!(
            matches!(got, Err(TranslationError::Fault { reason: r, .. }) if r == reason),
            "reason {reason}: {got:?}"
        );
        assert_eq!(u.fault_reason(), Some(reason));
        assert_eq!(u.r32(VTD_FSTS_REG), VTD_FSTS_PPF, "reason {reason}");
        assert_eq!(u.routes.injected(), vec![FAULT_MSI], "reason {reason}");
        assert_eq!(u.r64(VTD_FRCD_REG + 8) & 0xffff, u64::from(SID));
        assert_eq!(u.r64(VTD_FRCD_REG) & 0xfff, 0, "the faulting page");
    }
}

#[test]
fn a_masked_fault_event_is_pending_and_sent_at_unmask_and_a_full_record_overflows() {
    let u = unit();
    let mut t = Tables::new(&u.mem, ROOT);
    u.enable();
    u.w32(VTD_FECTL_REG, VTD_EVENT_IM);
    provoke(&u, &mut t, VTD_FR_ADDRESS_WIDTH).unwrap_err();
    assert!(u.routes.injected().is_empty());
    assert_eq!(u.r32(VTD_FECTL_REG), VTD_EVENT_IM | VTD_EVENT_IP);
    u.w32(VTD_FECTL_REG, 0);
    assert_eq!(u.routes.injected(), vec![FAULT_MSI], "sent at unmask");
    assert_eq!(u.r32(VTD_FECTL_REG), 0);
    // Another fault while FRCD0 is full: PFO, and the record keeps the first.
    u.translate(0x5000, Access::Read).unwrap_err();
    assert_eq!(u.r32(VTD_FSTS_REG), VTD_FSTS_PPF | VTD_FSTS_PFO);
    assert_eq!(u.fault_reason(), Some(VTD_FR_ADDRESS_WIDTH));
    u.clear_faults();
    assert_eq!((u.r32(VTD_FSTS_REG), u.fault_reason()), (0, None));
    assert_eq!(u.iommu.stats().faults, 2);
}

/// Two domains, pages 0..8 of each mapped and cached, then remapped behind the caches'
/// back: a translation shows whether its entry survived.
fn cached_pages(u: &Unit, t: &mut Tables) -> [u64; 2] {
    let pts = [t.attach(SID, 1), t.attach(SID + 1, 2)];
    for (d, &pt) in pts.iter().enumerate() {
        for page in 0..8u64 {
            t.map(
                pt,
                page << 12,
                0x4_0000 + (d as u64) * 0x1_0000 + (page << 12),
                RW,
            );
        }
    }
    for (d, source) in [SID, SID + 1].into_iter().enumerate() {
        for page in 0..8u64 {
            let gpa = u.iommu.translate(source, page << 12, Access::Read).unwrap();
            assert_eq!(gpa, 0x4_0000 + (d as u64) * 0x1_0000 + (page << 12));
        }
    }
    for (d, &pt) in pts.iter().enumerate() {
        for page in 0..8u64 {
            t.map(
                pt,
                page << 12,
                0x6_0000 + (d as u64) * 0x1_0000 + (page << 12),
                RW,
            );
        }
    }
    pts
}

/// (domain, page number) pairs.
type Pages = Vec<(u16, u64)>;

/// Which pages of each domain translate to the new mapping (their entry was dropped).
fn dropped(u: &Unit) -> Pages {
    let mut out = Vec::new();
    for (d, source) in [SID, SID + 1].into_iter().enumerate() {
        for page in 0..8u64 {
            let gpa = u.iommu.translate(source, page << 12, Access::Read).unwrap();
            if gpa >= 0x6_0000 {
                out.push((d as u16 + 1, page));
            }
        }
    }
    out
}

#[test]
fn invalidation_granularities_drop_exactly_what_they_name() {
    let cases: [([u64; 2], Pages); 4] = [
        (
            iotlb_global(),
            (1..=2).flat_map(|d| (0..8).map(move |p| (d, p))).collect(),
        ),
        (iotlb_domain(2), (0..8).map(|p| (2, p)).collect()),
        (iotlb_pages(1, 0x5000, 2), (4..8).map(|p| (1, p)).collect()),
        (iotlb_pages(2, 0x3000, 0), vec![(2, 3)]),
    ];
    for (descriptor, expected) in cases {
        let mut u = unit();
        let mut t = Tables::new(&u.mem, ROOT);
        u.enable();
        u.enable_queue();
        cached_pages(&u, &mut t);
        assert!(dropped(&u).is_empty(), "cached entries still in use");
        u.submit(&[descriptor]);
        assert_eq!(dropped(&u), expected, "{descriptor:x?}");
        let s = u.iommu.stats();
        assert_eq!(s.iotlb_dropped, expected.len() as u64);
        assert_eq!(s.iotlb_dropped_stale, expected.len() as u64, "all remapped");
    }
}

#[test]
fn register_based_invalidation_reports_what_it_did() {
    let u = unit();
    let mut t = Tables::new(&u.mem, ROOT);
    u.enable();
    cached_pages(&u, &mut t);
    u.w64(VTD_IVA_REG, 0x2000);
    u.w64(
        VTD_IOTLB_REG,
        VTD_IOTLB_IVT | VTD_GRAN_PAGE << VTD_IOTLB_IIRG_SHIFT | 1 << VTD_IOTLB_DID_SHIFT,
    );
    let iotlb = u.r64(VTD_IOTLB_REG);
    assert_eq!(iotlb & VTD_IOTLB_IVT, 0, "done");
    assert_eq!(iotlb >> VTD_IOTLB_IAIG_SHIFT & 3, VTD_GRAN_PAGE);
    assert_eq!(dropped(&u), vec![(1, 2)]);
    // CCMD as two dwords, the busy bit in the high one; a reserved granularity is refused.
    u.w32(VTD_CCMD_REG, 0);
    u.w32(VTD_CCMD_REG + 4, (VTD_CCMD_ICC >> 32) as u32);
    assert_eq!(u.r64(VTD_CCMD_REG), 0, "ICC clear, CAIG 0: not done");
    u.w64(
        VTD_CCMD_REG,
        VTD_CCMD_ICC | VTD_GRAN_GLOBAL << VTD_CCMD_CIRG_SHIFT,
    );
    assert_eq!(
        u.r64(VTD_CCMD_REG) >> VTD_CCMD_CAIG_SHIFT & 3,
        VTD_GRAN_GLOBAL
    );
    let s = u.iommu.stats();
    assert_eq!((s.iotlb_page, s.context_invalidations), (1, 1));
}

#[test]
fn context_cache_invalidation_makes_a_changed_context_entry_seen() {
    let (mut u, mut t, pt) = translating();
    t.map(pt, 0x1000, 0x8000, RW);
    assert_eq!(u.translate(0x1000, Access::Read), Ok(0x8000));
    // The driver moves the device to domain 2 with another table.
    let other = t.attach(SID, 2);
    t.map(other, 0x1000, 0x9000, RW);
    assert_eq!(
        u.translate(0x1000, Access::Read),
        Ok(0x8000),
        "cached context"
    );
    u.submit(&[context_device(SID + 1)]);
    assert_eq!(
        u.translate(0x1000, Access::Read),
        Ok(0x8000),
        "another device"
    );
    u.submit(&[context_device(SID), wait(Some(1), false)]);
    assert_eq!(u.translate(0x1000, Access::Read), Ok(0x9000));
    assert_eq!(u.iommu.stats().context_invalidations, 2);
}

#[test]
fn wait_descriptors_write_their_status_and_interrupt_when_asked() {
    let mut u = unit();
    u.enable_queue();
    u.submit(&[wait(Some(0x11), false)]);
    assert_eq!(u.mem.read_obj::<u32>(GuestAddress(STATUS)).unwrap(), 0x11);
    assert!(u.routes.injected().is_empty(), "no IF: no interrupt");
    assert_eq!(u.r32(VTD_ICS_REG), 0);
    u.submit(&[wait(None, true)]);
    assert_eq!(
        u.mem.read_obj::<u32>(GuestAddress(STATUS)).unwrap(),
        0x11,
        "no SW"
    );
    assert_eq!(u.r32(VTD_ICS_REG), VTD_ICS_IWC);
    assert_eq!(u.routes.injected(), vec![INVALIDATION_MSI]);
    // Masked: IP until unmasked; IWC still set sends nothing new until cleared.
    u.w32(VTD_ICS_REG, VTD_ICS_IWC);
    u.w32(VTD_IECTL_REG, VTD_EVENT_IM);
    u.submit(&[wait(Some(0x22), true)]);
    assert_eq!(u.mem.read_obj::<u32>(GuestAddress(STATUS)).unwrap(), 0x22);
    assert_eq!(u.r32(VTD_IECTL_REG), VTD_EVENT_IM | VTD_EVENT_IP);
    u.w32(VTD_IECTL_REG, 0);
    assert_eq!(u.routes.injected().len(), 2, "sent at unmask");
    let s = u.iommu.stats();
    assert_eq!(
        (s.tail_writes, s.descriptors, s.waits),
        (4, 3, 3),
        "with enable's IQT write"
    );
    assert_eq!(
        u.r64(VTD_IQH_REG),
        3 * 16,
        "the head caught up with the tail"
    );
}

#[test]
fn an_unknown_descriptor_sets_iqe_and_stops_the_queue_at_it() {
    let mut u = unit();
    u.w32(VTD_FEDATA_REG, FAULT_MSI.1);
    u.w32(VTD_FEADDR_REG, FAULT_MSI.0 as u32);
    u.w32(VTD_FECTL_REG, 0);
    u.enable_queue();
    // A device-TLB invalidation (type 3): device-TLBs are not offered.
    u.submit(&[wait(Some(1), false), [3, 0], wait(Some(2), false)]);
    assert_eq!(u.r32(VTD_FSTS_REG), VTD_FSTS_IQE);
    assert_eq!(u.r64(VTD_IQH_REG), 16, "IQH at the bad descriptor");
    assert_eq!(u.mem.read_obj::<u32>(GuestAddress(STATUS)).unwrap(), 1);
    assert_eq!(u.routes.injected(), vec![FAULT_MSI]);
    // As Linux does: replace it with a wait and clear IQE; the queue runs on.
    let replacement = wait(Some(3), false);
    u.mem
        .write_obj(replacement[0], GuestAddress(QUEUE + 16))
        .unwrap();
    u.mem
        .write_obj(replacement[1], GuestAddress(QUEUE + 24))
        .unwrap();
    u.w32(VTD_FSTS_REG, VTD_FSTS_IQE);
    assert_eq!(u.r32(VTD_FSTS_REG), 0);
    assert_eq!(u.r64(VTD_IQH_REG), 48);
    assert_eq!(u.mem.read_obj::<u32>(GuestAddress(STATUS)).unwrap(), 2);
}

#[test]
fn queues_and_tables_outside_ram_or_tails_past_the_queue_are_errors_not_panics() {
    // A queue outside RAM.
    let u = unit();
    u.w64(VTD_IQA_REG, RAM + 0x10_0000);
    u.command(VTD_GCMD_QIE);
    u.w64(VTD_IQT_REG, 16);
    assert_eq!(u.r32(VTD_FSTS_REG), VTD_FSTS_IQE);
    assert_eq!(u.r64(VTD_IQH_REG), 0);
    // A tail past a one-page queue.
    let u = unit();
    u.enable_queue();
    u.w64(VTD_IQT_REG, 0x1000);
    assert_eq!(u.r32(VTD_FSTS_REG), VTD_FSTS_IQE);
    // A wait whose status address is outside RAM.
    let mut u = unit();
    u.enable_queue();
    let mut bad = wait(Some(1), false);
    bad[1] = u64::MAX;
    u.submit(&[bad]);
    assert_eq!(u.r32(VTD_FSTS_REG), VTD_FSTS_IQE);
    // 256-bit descriptors, and the largest queue at the top of the address space.
    let u = unit();
    u.w64(VTD_IQA_REG, QUEUE | VTD_IQA_DW);
    u.command(VTD_GCMD_QIE);
    u.w64(VTD_IQT_REG, 32);
    assert_eq!(u.r32(VTD_FSTS_REG), VTD_FSTS_IQE);
    let u = unit();
    u.w64(VTD_IQA_REG, !0xfff | VTD_IQA_QS_MASK);
    u.command(VTD_GCMD_QIE);
    u.w64(VTD_IQT_REG, u64::MAX);
    assert_eq!(u.r32(VTD_FSTS_REG), VTD_FSTS_IQE);
}

#[test]
fn the_iotlb_is_bounded_and_counts_its_evictions() {
    let u = unit();
    let mut t = Tables::new(&u.mem, ROOT);
    u.enable();
    let pt = t.attach(SID, 1);
    let pages = iotlb::IOTLB_ENTRIES as u64 + 20;
    for page in 0..pages {
        t.map(pt, page << 12, 0x8000, RW);
        u.translate(page << 12, Access::Read).unwrap();
    }
    let s = u.iommu.stats();
    assert_eq!(s.iotlb.evictions, 20);
    assert_eq!(s.walks, pages);
    u.translate(0, Access::Read).unwrap();
    assert_eq!(u.iommu.stats().walks, pages + 1, "the oldest was evicted");
}

#[test]
fn a_buffer_spans_pages_that_are_not_contiguous_and_needs_each_pages_permission() {
    let u = unit();
    let mut t = Tables::new(&u.mem, ROOT);
    u.enable();
    let pt = t.attach(SID, 1);
    t.map(pt, 0x10_0000, 0x9_0000, RW);
    t.map(pt, 0x10_1000, 0x7_0000, VTD_PTE_R);
    let dma = u.device();
    u.mem.write_slice(&[1, 2], GuestAddress(0x9_0ffe)).unwrap();
    u.mem.write_slice(&[3, 4], GuestAddress(0x7_0000)).unwrap();
    let mut b = [0u8; 4];
    dma.read(GuestAddress(0x10_0ffe), &mut b).unwrap();
    assert_eq!(b, [1, 2, 3, 4]);
    assert_eq!(
        dma.write(GuestAddress(0x10_0ffe), &[9; 4]),
        Err(DmaError::Fault {
            addr: 0x10_1000,
            reason: VTD_FR_WRITE
        })
    );
    assert_eq!(
        u.mem.read_obj::<u8>(GuestAddress(0x9_0ffe)).unwrap(),
        9,
        "the first page was written before the fault"
    );
    assert_eq!(u.mem.read_obj::<u8>(GuestAddress(0x7_0000)).unwrap(), 3);
    // Untranslated (no ACCESS_PLATFORM), the same address is guest-physical.
    assert!(matches!(
        dma.untranslated().read(GuestAddress(0x10_0ffe), &mut b),
        Err(DmaError::OutsideMemory { .. })
    ));
}

#[test]
fn a_platform_device_has_no_source_id_and_stays_untranslated() {
    let u = unit();
    u.enable();
    let dma = DmaContext::platform(u.mem.clone()).behind(u.iommu.clone());
    assert!(!dma.translated());
    dma.write(GuestAddress(0x9000), &[1]).unwrap();
    assert!(u.device().translated());
}

/// The exposure a deferred invalidation admits, and what strict closes: after the guest clears
/// a PTE, the cached translation is still used until the invalidation and its wait; right
/// after them, the same DMA faults.
#[test]
fn a_dma_right_after_unmap_and_invalidation_faults_and_without_it_uses_the_cached_entry() {
    let (mut u, mut t, pt) = translating();
    t.map(pt, 0x20_0000, 0x9_0000, RW);
    let dma = u.device();
    dma.write(GuestAddress(0x20_0000), &[1]).unwrap();
    t.unmap(pt, 0x20_0000);
    dma.write(GuestAddress(0x20_0000), &[2]).unwrap();
    assert_eq!(
        u.mem.read_obj::<u8>(GuestAddress(0x9_0000)).unwrap(),
        2,
        "deferred: the dropped mapping still works"
    );
    u.submit(&[iotlb_pages(1, 0x20_0000, 0), wait(Some(1), false)]);
    assert_eq!(
        dma.write(GuestAddress(0x20_0000), &[3]),
        Err(DmaError::Fault {
            addr: 0x20_0000,
            reason: VTD_FR_WRITE
        })
    );
    assert_eq!(u.mem.read_obj::<u8>(GuestAddress(0x9_0000)).unwrap(), 2);
    assert_eq!(u.iommu.stats().iotlb_dropped_stale, 1);
}

/// Strict: the wait's status is written only once no device round that began before it is
/// still in flight (it may hold a translation the invalidation dropped).
#[test]
fn the_wait_status_waits_for_device_rounds_in_flight() {
    let mut u = unit();
    u.enable_queue();
    let iommu = u.iommu.clone();
    let (entered, in_round) = std::sync::mpsc::channel();
    let (release, done) = std::sync::mpsc::channel::<()>();
    let device = std::thread::spawn(move || {
        let _round = iommu.dma_round();
        entered.send(()).unwrap();
        done.recv().unwrap();
    });
    in_round.recv().unwrap();
    let mem = u.mem.clone();
    let submitter = std::thread::spawn(move || {
        u.submit(&[iotlb_global(), wait(Some(7), false)]);
        u
    });
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        mem.read_obj::<u32>(GuestAddress(STATUS)).unwrap(),
        0,
        "not while a round is in flight"
    );
    release.send(()).unwrap();
    device.join().unwrap();
    let u = submitter.join().unwrap();
    assert_eq!(mem.read_obj::<u32>(GuestAddress(STATUS)).unwrap(), 7);
    assert_eq!(u.iommu.stats().waits, 1);
}

#[test]
fn rings_map_to_one_physical_range_and_go_stale_when_an_invalidation_covers_them() {
    let (mut u, mut t, pt) = translating();
    t.map(pt, 0x30_0000, 0x8_0000, RW);
    t.map(pt, 0x30_1000, 0x8_1000, RW);
    t.map(pt, 0x40_0000, 0x5_0000, RW);
    t.map(pt, 0x41_0000, 0x5_2000, RW);
    let ring = |address, len| RingArea {
        address,
        len,
        access: Access::Write,
    };
    let watch = Arc::new(RingWatch::default());
    assert!(watch.is_stale(), "nothing mapped yet");
    let found = u
        .iommu
        .map_rings(
            SID,
            &watch,
            &[ring(0x30_0800, 0x1000), ring(0x40_0010, 0x10)],
        )
        .unwrap();
    assert_eq!(found, vec![0x8_0800, 0x5_0010]);
    assert!(!watch.is_stale());
    // An invalidation of pages it does not use leaves it; one of a page it uses does not.
    u.submit(&[iotlb_pages(1, 0x41_0000, 0), iotlb_pages(2, 0x30_0000, 4)]);
    assert!(!watch.is_stale());
    u.submit(&[iotlb_pages(1, 0x30_1000, 0)]);
    assert!(watch.is_stale());
    // A ring over two pages that are not contiguous in guest memory cannot be used.
    t.map(pt, 0x30_1000, 0x8_3000, RW);
    assert_eq!(
        u.iommu.map_rings(SID, &watch, &[ring(0x30_0800, 0x1000)]),
        Err(TranslationError::Discontiguous {
            addr: 0x30_0800,
            len: 0x1000
        })
    );
    // Unmapped: a fault, recorded.
    assert!(matches!(
        u.iommu.map_rings(SID, &watch, &[ring(0x50_0000, 0x10)]),
        Err(TranslationError::Fault { .. })
    ));
    assert_eq!(u.fault_reason(), Some(VTD_FR_WRITE));
    // Translation turned off marks every watch stale.
    u.iommu
        .map_rings(SID, &watch, &[ring(0x40_0000, 0x10)])
        .unwrap();
    u.w32(VTD_GCMD_REG, VTD_GCMD_QIE);
    assert!(watch.is_stale());
}

#[test]
fn invalid_event_messages_are_dropped() {
    let u = unit();
    u.enable();
    u.w32(VTD_FEADDR_REG, 0x1000);
    u.translate(0, Access::Read).unwrap_err();
    assert!(u.routes.injected().is_empty());
    assert!(u.iommu.log().guest_errors() > 0);
}
