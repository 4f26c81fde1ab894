//! Interrupt remapping through the register page and the queue, as a driver programs it, with
//! a device's messages sent through its remapped routes.

use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress};

use super::super::ECAP;
use super::super::regs::*;
use super::super::testing::*;
use crate::irq::{CommitStrategy, InterruptRoutes};

/// The table: 16 entries (S = 3).
const IRT: u64 = 0x2_0000;
const IRT_S: u64 = 3;

/// A present entry: fixed delivery of `vector` to APIC ID 1 (xAPIC: DST 15:8), edge, only from
/// `SID`.
fn entry(vector: u8) -> [u64; 2] {
    let low =
        VTD_IRTE_P | u64::from(vector) << VTD_IRTE_VECTOR_SHIFT | 1 << (VTD_IRTE_DST_SHIFT + 8);
    let high = VTD_IRTE_SVT_SID << VTD_IRTE_SVT_SHIFT | u64::from(SID);
    [low, high]
}

/// Where the entry's message goes: APIC ID 1, `vector`.
fn delivered(vector: u32) -> (u64, u32) {
    (0xfee0_1000, vector)
}

/// The remappable-format address naming `handle` (SHV clear).
fn remappable(handle: u64) -> u64 {
    0xfee0_0000 | VTD_MSI_REMAPPABLE | (handle & 0x7fff) << VTD_MSI_HANDLE_SHIFT
}

fn iec_global() -> [u64; 2] {
    [VTD_QI_IEC_TYPE, 0]
}

fn iec_index(index: u64) -> [u64; 2] {
    [
        VTD_QI_IEC_TYPE | VTD_QI_IEC_INDEXED | index << VTD_QI_IEC_IIDX_SHIFT,
        0,
    ]
}

impl Unit {
    fn write_entry(&self, index: u64, e: [u64; 2]) {
        let at = IRT + 16 * index;
        self.mem.write_obj(e[0], GuestAddress(at)).unwrap();
        self.mem.write_obj(e[1], GuestAddress(at + 8)).unwrap();
    }

    /// The table latched, the queue on, remapping on (CFI clear), as Linux brings it up.
    fn remap_interrupts(&mut self) {
        self.enable_queue();
        self.w32(VTD_FEDATA_REG, FAULT_MSI.1);
        self.w32(VTD_FEADDR_REG, FAULT_MSI.0 as u32);
        self.w32(VTD_FECTL_REG, 0);
        self.w64(VTD_IRTA_REG, IRT | IRT_S);
        self.w32(VTD_GCMD_REG, VTD_GCMD_QIE | VTD_GCMD_SIRTP);
        self.submit(&[iec_global(), wait(Some(1), false)]);
        self.w32(VTD_GCMD_REG, VTD_GCMD_QIE | VTD_GCMD_IRE);
    }

    /// What the fake routes injected, but the unit's fault events.
    fn messages(&self) -> Vec<(u64, u32)> {
        let mut sent = self.routes.injected();
        sent.retain(|&m| m != FAULT_MSI);
        sent
    }

    /// FRCD0's low qword's interrupt index, with the reason, if a fault is recorded.
    fn interrupt_fault(&self) -> Option<(u8, u64)> {
        let index = self.r64(VTD_FRCD_REG) >> VTD_FRCD_IR_INDEX_SHIFT;
        self.fault_reason().map(|reason| (reason, index))
    }
}

#[test]
fn gsts_reflects_sirtp_ire_and_cfi_and_ecap_offers_remapping() {
    let mut u = unit();
    assert_ne!(ECAP & VTD_ECAP_IR, 0);
    assert_ne!(ECAP & VTD_ECAP_EIM, 0);
    assert_eq!(u.r32(VTD_GSTS_REG), 0);
    // Reserved bits 10:4 of IRTA read 0.
    u.w64(VTD_IRTA_REG, IRT | 0x7f0 | VTD_IRTA_EIME | IRT_S);
    assert_eq!(u.r64(VTD_IRTA_REG), IRT | VTD_IRTA_EIME | IRT_S);
    u.remap_interrupts();
    let sts = u.r32(VTD_GSTS_REG);
    assert_eq!(
        sts & (VTD_GCMD_SIRTP | VTD_GCMD_IRE),
        VTD_GCMD_SIRTP | VTD_GCMD_IRE
    );
    assert_eq!(sts & VTD_GCMD_CFI, 0);
    u.w32(VTD_GCMD_REG, VTD_GCMD_QIE | VTD_GCMD_IRE | VTD_GCMD_CFI);
    assert_ne!(u.r32(VTD_GSTS_REG) & VTD_GCMD_CFI, 0);
    // Linux's writes mask the one-shot bits; IRE off, the rest stay.
    u.w32(VTD_GCMD_REG, VTD_GCMD_QIE | VTD_GCMD_CFI);
    let sts = u.r32(VTD_GSTS_REG);
    assert_eq!(sts & VTD_GCMD_IRE, 0);
    assert_ne!(sts & VTD_GCMD_QIE, 0);
}

#[test]
fn a_remappable_message_takes_its_entry_and_subhandles_add_to_the_handle() {
    let mut u = unit();
    u.remap_interrupts();
    u.write_entry(5, entry(0x55));
    let routes = u.iommu.interrupt_routes(SID);
    assert!(
        routes.accepts(remappable(5), 0),
        "the unit decides, not the APIC"
    );
    routes.signal_msi(remappable(5), 0).unwrap();
    routes.signal_msi(remappable(4) | VTD_MSI_SHV, 1).unwrap();
    assert_eq!(u.messages(), [delivered(0x55), delivered(0x55)]);
    assert_eq!(u.fault_reason(), None);
    let stats = u.iommu.stats().interrupts;
    assert_eq!((stats.remapped, stats.blocked), (2, 0));
    assert_eq!((stats.cache.misses, stats.cache.hits), (1, 1));
}

#[test]
fn bad_requests_and_entries_are_blocked_and_recorded_with_their_index() {
    let mut u = unit();
    u.remap_interrupts();
    u.write_entry(5, entry(0x55));
    let mut reserved = entry(0x56);
    reserved[1] |= 1 << 40;
    u.write_entry(6, reserved);
    let mut quiet = entry(0x57);
    quiet[0] = VTD_IRTE_FPD; // not present, faults not recorded
    u.write_entry(7, quiet);
    let routes = u.iommu.interrupt_routes(SID);
    let stranger = u.iommu.interrupt_routes(SID + 1);
    type Case<'a> = (&'a Arc<dyn InterruptRoutes>, (u64, u32), u8, u64);
    let cases: [Case; 6] = [
        (&routes, (remappable(9), 0), VTD_FR_IR_NOT_PRESENT, 9),
        (&routes, (remappable(16), 0), VTD_FR_IR_INDEX, 16),
        (&routes, (remappable(6), 0), VTD_FR_IR_ENTRY_RESERVED, 6),
        (&stranger, (remappable(5), 0), VTD_FR_IR_SOURCE, 5),
        (&routes, (0xfee0_0000, 0x31), VTD_FR_IR_COMPATIBILITY, 0),
        (
            &routes,
            (remappable(5) | 1 << 32, 0),
            VTD_FR_IR_REQUEST_RESERVED,
            0,
        ),
    ];
    for (from, (address, data), reason, index) in cases {
        from.signal_msi(address, data).unwrap();
        assert!(u.messages().is_empty(), "{reason:#x}: not delivered");
        assert_eq!(u.interrupt_fault(), Some((reason, index)));
        u.clear_faults();
    }
    // FPD: blocked, nothing recorded, whether absent or not admitting the requester.
    routes.signal_msi(remappable(7), 0).unwrap();
    let mut admits_sid_only = entry(0x58);
    admits_sid_only[0] |= VTD_IRTE_FPD;
    u.write_entry(8, admits_sid_only);
    stranger.signal_msi(remappable(8), 0).unwrap();
    assert_eq!(u.fault_reason(), None);
    assert!(u.messages().is_empty());
    assert_eq!(u.iommu.stats().interrupts.blocked, 8);
    // CFI lets compatibility format through, in xAPIC mode only.
    u.w32(VTD_GCMD_REG, VTD_GCMD_QIE | VTD_GCMD_IRE | VTD_GCMD_CFI);
    routes.signal_msi(0xfee0_0000, 0x31).unwrap();
    assert_eq!(u.messages(), [(0xfee0_0000, 0x31)]);
    u.w64(VTD_IRTA_REG, IRT | VTD_IRTA_EIME | IRT_S);
    u.w32(
        VTD_GCMD_REG,
        VTD_GCMD_QIE | VTD_GCMD_IRE | VTD_GCMD_CFI | VTD_GCMD_SIRTP,
    );
    routes.signal_msi(0xfee0_0000, 0x32).unwrap();
    assert_eq!(
        u.messages(),
        [(0xfee0_0000, 0x31)],
        "EIME: blocked all the same"
    );
    assert_eq!(u.interrupt_fault(), Some((VTD_FR_IR_COMPATIBILITY, 0)));
}

#[test]
fn a_table_outside_guest_memory_faults_and_ire_off_leaves_messages_as_they_are() {
    let mut u = unit();
    u.remap_interrupts();
    u.w64(VTD_IRTA_REG, (RAM - 0x1000) | 0xf);
    u.w32(VTD_GCMD_REG, VTD_GCMD_QIE | VTD_GCMD_IRE | VTD_GCMD_SIRTP);
    let routes = u.iommu.interrupt_routes(SID);
    routes.signal_msi(remappable(0x1000), 0).unwrap();
    assert_eq!(u.interrupt_fault(), Some((VTD_FR_IR_TABLE, 0x1000)));
    u.clear_faults();
    // A table at the top of the address space: its entries past the end are unreadable too.
    u.w64(VTD_IRTA_REG, 0xffff_ffff_ffff_f00f);
    u.w32(VTD_GCMD_REG, VTD_GCMD_QIE | VTD_GCMD_IRE | VTD_GCMD_SIRTP);
    routes.signal_msi(remappable(0x7fff), 0).unwrap();
    assert_eq!(u.interrupt_fault(), Some((VTD_FR_IR_TABLE, 0x7fff)));
    u.clear_faults();
    u.w32(VTD_GCMD_REG, VTD_GCMD_QIE);
    routes.signal_msi(0xfee0_0000, 0x31).unwrap();
    // A remappable message with remapping off is no message the APIC takes: dropped.
    routes.signal_msi(remappable(5), 0).unwrap();
    assert_eq!(u.messages(), [(0xfee0_0000, 0x31)]);
    assert_eq!(u.fault_reason(), None);
}

#[test]
fn a_rewritten_entry_is_used_only_once_its_cache_entry_is_invalidated() {
    let mut u = unit();
    u.remap_interrupts();
    u.write_entry(5, entry(0x55));
    u.write_entry(6, entry(0x56));
    let routes = u.iommu.interrupt_routes(SID);
    let send = |u: &Unit, handle| {
        routes.signal_msi(remappable(handle), 0).unwrap();
        u.messages().last().copied()
    };
    assert_eq!(send(&u, 5), Some(delivered(0x55)));
    assert_eq!(send(&u, 6), Some(delivered(0x56)));
    u.write_entry(5, entry(0x65));
    u.write_entry(6, entry(0x66));
    assert_eq!(send(&u, 5), Some(delivered(0x55)), "cached");
    u.submit(&[iec_index(5), wait(Some(2), false)]);
    assert_eq!(send(&u, 5), Some(delivered(0x65)), "index 5 invalidated");
    assert_eq!(send(&u, 6), Some(delivered(0x56)), "index 6 still cached");
    u.submit(&[iec_global(), wait(Some(3), false)]);
    assert_eq!(send(&u, 6), Some(delivered(0x66)));
    assert_eq!(
        u.iommu.stats().interrupts.invalidations,
        3,
        "bring-up's and two"
    );
    // An entry made not present is blocked once invalidated.
    u.write_entry(6, [0, 0]);
    u.submit(&[iec_index(6), wait(Some(4), false)]);
    let before = u.messages().len();
    routes.signal_msi(remappable(6), 0).unwrap();
    assert_eq!(u.messages().len(), before);
    assert_eq!(u.interrupt_fault(), Some((VTD_FR_IR_NOT_PRESENT, 6)));
}

#[test]
fn routes_hold_remapped_messages_and_an_invalidation_commits_every_change_once() {
    let mut u = unit_with(CommitStrategy::Batched);
    u.remap_interrupts();
    let routes = u.iommu.interrupt_routes(SID);
    let gsis: Vec<u32> = (0..4).map(|_| routes.allocate_msi().unwrap().gsi).collect();
    for (i, &gsi) in gsis.iter().enumerate() {
        u.write_entry(i as u64, entry(0x40 + i as u8));
        routes.set_msi(gsi, remappable(i as u64), 0).unwrap();
    }
    routes.commit().unwrap();
    for (i, &gsi) in gsis.iter().enumerate() {
        assert_eq!(u.routes.route(gsi), Some(delivered(0x40 + i as u32)));
    }
    // Three entries change (the fourth is rewritten the same): one commit for the three.
    for i in 0..3 {
        u.write_entry(i, entry(0x80 + i as u8));
    }
    u.write_entry(3, entry(0x43));
    let commits = u.routes.commits();
    u.submit(&[iec_global(), wait(Some(2), false)]);
    assert_eq!(u.routes.commits(), commits + 1);
    assert_eq!(u.iommu.stats().interrupts.route_updates, 3);
    for (i, &gsi) in gsis.iter().enumerate().take(3) {
        assert_eq!(u.routes.route(gsi), Some(delivered(0x80 + i as u32)));
    }
    assert_eq!(u.routes.route(gsis[3]), Some(delivered(0x43)));
    // Remapping off: the remappable messages are no valid MSIs, so their routes go.
    u.w32(VTD_GCMD_REG, VTD_GCMD_QIE);
    assert_eq!(u.routes.route(gsis[0]), None);
    assert_eq!(u.routes.commits(), commits + 2);
}
