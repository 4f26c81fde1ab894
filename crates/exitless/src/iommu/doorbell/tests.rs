//! The IQT doorbells against a recording registrar that plays KVM's part: a write that matches
//! a registered doorbell signals its eventfd (no exit); one that matches none is an exit.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use super::{DOORBELL_TAILS, TailRegistrar, TailWrite};
use crate::iommu::regs::*;
use crate::iommu::testing::*;

/// The doorbells registered now, as KVM would hold them.
#[derive(Default)]
struct FakeKvm {
    registered: Mutex<Vec<(EventFd, u64, TailWrite)>>,
}

impl TailRegistrar for FakeKvm {
    fn register(
        &self,
        fd: &EventFd,
        address: u64,
        write: TailWrite,
    ) -> Result<(), kvm_ioctls::Error> {
        let fd = fd.try_clone().unwrap();
        self.registered.lock().unwrap().push((fd, address, write));
        Ok(())
    }

    fn unregister(
        &self,
        _: &EventFd,
        address: u64,
        write: TailWrite,
    ) -> Result<(), kvm_ioctls::Error> {
        let mut registered = self.registered.lock().unwrap();
        registered.retain(|&(_, a, w)| (a, w) != (address, write));
        Ok(())
    }
}

impl FakeKvm {
    fn count(&self) -> usize {
        self.registered.lock().unwrap().len()
    }

    /// A guest's write of IQT: true if a doorbell caught it (no exit).
    fn write(&self, write: TailWrite) -> bool {
        let registered = self.registered.lock().unwrap();
        let hit = registered
            .iter()
            .find(|&&(_, a, w)| (a, w) == (VTD_IQT_REG, write));
        hit.map(|(fd, _, _)| fd.write(1).unwrap()).is_some()
    }
}

/// A unit at reset with doorbells on IQT (the register page at 0).
fn unit_with_doorbells() -> (Unit, Arc<FakeKvm>) {
    let u = unit();
    let kvm = Arc::new(FakeKvm::default());
    u.iommu.attach_doorbells(kvm.clone(), VTD_IQT_REG).unwrap();
    (u, kvm)
}

/// Spin as the guest does until `done` (the unit's thread runs the queue), at most 10 s.
fn spin_until(u: &Unit, done: impl Fn(&Unit) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(u) {
        assert!(
            Instant::now() < deadline,
            "the unit's thread never got there"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn status(u: &Unit) -> u32 {
    u.mem.read_obj::<u32>(GuestAddress(STATUS)).unwrap()
}

#[test]
fn a_tail_write_on_a_doorbell_does_not_exit_and_still_completes_the_wait() {
    let (mut u, kvm) = unit_with_doorbells();
    assert_eq!(kvm.count(), 0, "not before queued invalidation is on");
    u.enable_queue();
    assert_eq!(
        kvm.count(),
        2 * DOORBELL_TAILS,
        "each tail, as a dword and a qword"
    );
    let tail = u.place(&[iotlb_global(), wait(Some(7), true)]);
    assert!(
        kvm.write(TailWrite::Qword(tail)),
        "the probe's write: no exit"
    );
    spin_until(&u, |u| status(u) == 7);
    assert_eq!(u.r64(VTD_IQT_REG), tail, "IQT reads the tail the unit took");
    assert_eq!(u.r64(VTD_IQH_REG), tail);
    assert_eq!(u.routes.injected(), vec![INVALIDATION_MSI]);
    let tail = u.place(&[wait(Some(8), false)]);
    assert!(
        kvm.write(TailWrite::Dword(tail as u32)),
        "Linux's write: no exit"
    );
    spin_until(&u, |u| status(u) == 8);
    let s = u.iommu.stats();
    assert_eq!(
        (s.tail_writes, s.descriptors, s.waits, s.iotlb_global),
        (3, 3, 2, 1),
        "counted as IQT writes are, with enable's"
    );
}

#[test]
fn qie_off_or_a_queue_the_doorbells_do_not_fit_removes_them_and_the_tail_write_exits() {
    let (mut u, kvm) = unit_with_doorbells();
    u.enable_queue();
    // Junk in the upper dword matches no doorbell: it exits, and the exit path judges it.
    assert!(!kvm.write(TailWrite::Qword(1 << 32 | 16)));
    u.w32(VTD_GCMD_REG, 0);
    assert_eq!(kvm.count(), 0, "QIE off");
    let tail = u.place(&[wait(Some(1), false)]);
    assert!(!kvm.write(TailWrite::Qword(tail)), "an exit");
    // Two pages (QS = 1): a larger queue keeps the exit path.
    u.w64(VTD_IQA_REG, QUEUE | 1);
    u.command(VTD_GCMD_QIE);
    assert_eq!(kvm.count(), 0, "QS 1");
    u.w64(VTD_IQT_REG, tail);
    assert_eq!(status(&u), 1, "the exit ran the queue");
    // Back to one page with the queue on: the doorbells return.
    u.w64(VTD_IQA_REG, QUEUE);
    assert_eq!(kvm.count(), 2 * DOORBELL_TAILS);
}

#[test]
fn tails_written_at_once_run_nearest_the_head_first_unwarned_and_garbage_sets_iqe() {
    let (mut u, kvm) = unit_with_doorbells();
    u.enable_queue();
    let first = u.place(&[wait(Some(1), false)]);
    u.place(&[wait(Some(2), false), [3, 0]]);
    let last = u.place(&[wait(Some(3), false)]);
    {
        // The unit's thread cannot take either before both are signalled.
        let _regs = u.iommu.regs.lock().unwrap();
        assert!(kvm.write(TailWrite::Qword(last)));
        assert!(kvm.write(TailWrite::Qword(first)));
    }
    spin_until(&u, |u| u.r32(VTD_FSTS_REG) == VTD_FSTS_IQE);
    assert_eq!(
        status(&u),
        2,
        "the first tail's wait, then up to the bad descriptor"
    );
    assert_eq!(u.r64(VTD_IQH_REG), 2 * 16, "IQH at the bad descriptor");
    assert_eq!(u.iommu.stats().tail_writes, 3, "both writes, with enable's");
    assert_eq!(
        u.iommu.log().guest_errors(),
        1,
        "the bad descriptor; tails written together are no error (Linux's 2 vCPUs do so)"
    );
}

#[test]
fn a_tail_taken_after_its_doorbell_was_removed_is_dropped_not_run() {
    let (mut u, kvm) = unit_with_doorbells();
    u.enable_queue();
    let tail = u.place(&[wait(Some(5), false)]);
    {
        // The write lands, then QIE goes off before the unit's thread takes it.
        let mut regs = u.iommu.regs.lock().unwrap();
        assert!(kvm.write(TailWrite::Qword(tail)));
        regs.status &= !VTD_GCMD_QIE;
        regs.queue.disable();
        u.iommu.rearm_doorbells(&regs);
    }
    assert_eq!(kvm.count(), 0);
    spin_until(&u, |u| u.iommu.log().guest_errors() == 1);
    assert_eq!(status(&u), 0, "not run");
    assert_eq!((u.r64(VTD_IQT_REG), u.iommu.stats().tail_writes), (0, 1));
}
