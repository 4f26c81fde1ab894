use serde_json::json;

use super::*;
use crate::dma::Access;
use crate::iommu::TranslationError;
use crate::iommu::tables::build::Tables;
use crate::iommu::testing::*;

/// Every qword of the register page, as the guest reads it.
fn page(u: &Unit) -> Vec<u64> {
    (0..VTD_REG_SIZE).step_by(8).map(|at| u.r64(at)).collect()
}

/// A unit a driver has set up: translation, queued invalidation and interrupt remapping on,
/// a page mapped and cached, a fault recorded, the invalidation event pending while masked.
fn programmed() -> (Unit, Tables, u64) {
    let (mut u, mut t, pt) = translating();
    t.map(pt, 0x20_0000, 0x9_0000, RW);
    assert_eq!(u.translate(0x20_0010, Access::Write), Ok(0x9_0010));
    assert!(u.translate(0x30_0000, Access::Read).is_err());
    u.w64(VTD_IRTA_REG, 0x8_0000 | 3);
    u.command(VTD_GCMD_SIRTP);
    u.w64(VTD_IRTA_REG, 0x7_0000);
    u.w32(VTD_IECTL_REG, VTD_EVENT_IM);
    u.submit(&[wait(Some(7), true)]);
    u.w64(VTD_IVA_REG, 0x20_0000);
    (u, t, pt)
}

#[test]
fn every_register_comes_back_and_no_cache_outlives_the_restore() {
    let (u, mut t, pt) = programmed();
    let state = u.iommu.save().unwrap();
    let v = u.successor();
    v.iommu.restore(state.clone()).unwrap();
    assert_eq!(page(&v), page(&u));
    assert_ne!(v.r32(VTD_IECTL_REG) & VTD_EVENT_IP, 0, "IP kept");
    assert_eq!(v.fault_reason(), Some(VTD_FR_READ), "FRCD0 kept");

    // Unmapped without an invalidation: the old unit still uses its cached entry, the
    // restored one walks the tables again and sees the unmap.
    t.unmap(pt, 0x20_0000);
    assert_eq!(u.translate(0x20_0010, Access::Read), Ok(0x9_0010));
    assert_eq!(
        v.translate(0x20_0010, Access::Read),
        Err(TranslationError::Fault {
            addr: 0x20_0010,
            reason: VTD_FR_READ
        })
    );
    assert_eq!(v.iommu.stats().iotlb.hits, 0, "nothing cached came back");
    // Restored in place, the old unit drops what it cached too.
    u.iommu.restore(state).unwrap();
    assert!(u.translate(0x20_0010, Access::Read).is_err());

    // The masked event's IP is sent at unmask, as it would have been (the fault above went
    // to PFO, FRCD0 being full, and sent the fault event).
    v.w32(VTD_IECTL_REG, 0);
    let sent = v.routes.injected();
    assert_eq!(
        sent.iter().filter(|&&m| m == INVALIDATION_MSI).count(),
        1,
        "{sent:x?}"
    );
}

#[test]
fn the_queue_goes_on_from_its_head_after_a_restore() {
    let (u, ..) = programmed();
    let state = u.iommu.save().unwrap();
    let mut v = u.successor();
    v.iommu.restore(state).unwrap();
    // Carry on where the driver was: its next descriptor goes after the one submitted.
    let _ = v.place(&[wait(None, false)]);
    v.clear_faults();
    v.submit(&[wait(Some(9), false)]);
    assert_eq!(v.r64(VTD_IQH_REG), v.r64(VTD_IQT_REG));
    assert_eq!(
        v.r64(VTD_IQH_REG),
        3 * VTD_QI_DESC_SIZE,
        "two more from where it was"
    );
}

#[test]
fn a_corrupted_state_is_refused_naming_the_field() {
    let (u, ..) = programmed();
    let good = u.iommu.save().unwrap();
    let v = u.successor();
    let corrupt = |field: &str, value: serde_json::Value| {
        let mut state = good.clone();
        state[field] = value;
        v.iommu.restore(state).unwrap_err().what
    };
    assert_eq!(corrupt("status", json!(1)), "iommu.status");
    assert_eq!(corrupt("root_table", json!(ROOT | 8)), "iommu.root_table");
    assert_eq!(
        corrupt("context_command", json!(VTD_CCMD_ICC)),
        "iommu.context_command"
    );
    assert_eq!(
        corrupt("iotlb_command", json!(VTD_IOTLB_IVT)),
        "iommu.iotlb_command"
    );
    assert_eq!(corrupt("queue_head", json!(8)), "iommu.queue_head");
    assert_eq!(corrupt("queue_tail", json!(1 << 19)), "iommu.queue_tail");
    assert_eq!(corrupt("irta", json!(0x10)), "iommu.irta");
    assert_eq!(corrupt("latched_irta", json!(null)), "iommu.latched_irta");
    let unmasked_pending = json!({"masked": false, "pending": true, "data": 0, "address": 0,
        "upper_address": 0});
    assert_eq!(
        corrupt("fault_event", unmasked_pending),
        "iommu.fault_event"
    );
    assert_eq!(corrupt("queue_address", json!("x")), "iommu");
    assert_eq!(page(&v), page(&unit()), "a refused state changes nothing");
}
