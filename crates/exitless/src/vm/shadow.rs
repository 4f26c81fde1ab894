//! A read-only shadow: host memory mapped read-only into the guest, so the guest reads it
//! without an exit while its writes still exit (KVM_MEM_READONLY, api.rst §4.35), with pages
//! that can be taken out of the mapping at run time so that reads of just those pages exit too
//! (a register whose read has a side effect the VMM must perform).
//!
//! KVM cannot shrink or split a memslot in place, so a change deletes the slots and maps what
//! remains again, one slot per run of mapped pages, from a block of slot numbers reserved up
//! front. While that happens a guest read of the region exits and is served by the trapping
//! path, which shows the same bytes: nothing the guest can observe.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use kvm_bindings::{KVM_MEM_READONLY, kvm_userspace_memory_region};
use kvm_ioctls::VmFd;

use super::{SlotOwner, VmError, kvm_err};

/// Page size of the holes.
pub const PAGE: u64 = 0x1000;

/// A read-only mapping of `owner`'s memory at a guest-physical range, with holes.
pub struct ShadowRegion {
    fd: Arc<VmFd>,
    gpa: u64,
    host: u64,
    len: u64,
    slots: Range<u32>,
    mapped: Mutex<Mapped>,
    /// Dropped after `Drop::drop` has deleted every slot that maps it.
    _owner: SlotOwner,
}

struct Mapped {
    holes: BTreeSet<u64>,
    slots: Vec<kvm_userspace_memory_region>,
}

impl ShadowRegion {
    /// Map `len` bytes of `owner`'s memory at host address `host` read-only at `gpa`, using
    /// slot numbers from `slots` (one more than the most holes it maps around).
    pub(super) fn new(
        fd: Arc<VmFd>,
        gpa: u64,
        host: u64,
        len: u64,
        slots: Range<u32>,
        owner: SlotOwner,
    ) -> Result<Self, VmError> {
        let shadow = ShadowRegion {
            fd,
            gpa,
            host,
            len,
            slots,
            mapped: Mutex::new(Mapped {
                holes: BTreeSet::new(),
                slots: Vec::new(),
            }),
            _owner: owner,
        };
        {
            let mut m = shadow.lock();
            shadow.remap(&mut m, &BTreeSet::new())?;
        }
        Ok(shadow)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Mapped> {
        self.mapped.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Take page `page` (an index from the region's start) out of the mapping, or put it back.
    /// With more holes than the reserved slots can map around, nothing is mapped: every read
    /// exits, which always shows the right bytes, just not for free. On a KVM failure fewer
    /// pages may stay mapped than asked for (never more): reads of those exit too.
    pub fn set_hole(&self, page: u64, hole: bool) -> Result<(), VmError> {
        if page >= self.len / PAGE {
            return Err(VmError::ShadowPage(page));
        }
        let mut m = self.lock();
        let mut holes = m.holes.clone();
        let changed = if hole {
            holes.insert(page)
        } else {
            holes.remove(&page)
        };
        if !changed {
            return Ok(());
        }
        let result = self.remap(&mut m, &holes);
        if result.is_ok() || hole {
            // A hole asked for is recorded even if mapping around it failed: the page is
            // unmapped unless deleting the old slots failed, which the error reports.
            m.holes = holes;
        }
        result
    }

    /// The pages taken out now.
    pub fn holes(&self) -> Vec<u64> {
        self.lock().holes.iter().copied().collect()
    }

    /// Byte ranges (from the region's start) that stay mapped around `holes`.
    fn runs(&self, holes: &BTreeSet<u64>) -> Vec<Range<u64>> {
        let mut runs = Vec::new();
        let mut start = 0;
        for &page in holes {
            if page * PAGE > start {
                runs.push(start..page * PAGE);
            }
            start = (page + 1) * PAGE;
        }
        if start < self.len {
            runs.push(start..self.len);
        }
        runs
    }

    /// Delete every slot, then map the runs around `holes` (none if they need more slots than
    /// were reserved).
    fn remap(&self, m: &mut Mapped, holes: &BTreeSet<u64>) -> Result<(), VmError> {
        self.delete_all(m)?;
        let runs = self.runs(holes);
        if runs.len() > self.slots.len() {
            return Ok(());
        }
        for (slot, run) in self.slots.clone().zip(runs) {
            let region = kvm_userspace_memory_region {
                slot,
                flags: KVM_MEM_READONLY,
                guest_phys_addr: self.gpa + run.start,
                memory_size: run.end - run.start,
                userspace_addr: self.host + run.start,
            };
            // SAFETY: `host..host+len` is owned by `self._owner`, which lives until `Drop`
            // has deleted this slot; KVM checks overlaps with other slots.
            unsafe { self.fd.set_user_memory_region(region) }
                .map_err(kvm_err("map a read-only shadow"))?;
            m.slots.push(region);
        }
        Ok(())
    }

    fn delete_all(&self, m: &mut Mapped) -> Result<(), VmError> {
        while let Some(region) = m.slots.pop() {
            let delete = kvm_userspace_memory_region {
                memory_size: 0,
                ..region
            };
            // SAFETY: a zero `memory_size` deletes the slot (api.rst §4.35); nothing is mapped.
            if let Err(e) = unsafe { self.fd.set_user_memory_region(delete) } {
                m.slots.push(region);
                return Err(kvm_err("delete a read-only shadow slot")(e));
            }
        }
        Ok(())
    }
}

impl Drop for ShadowRegion {
    fn drop(&mut self) {
        let mut m = self.lock();
        if self.delete_all(&mut m).is_err() {
            // KVM may still map the memory: leaking it is the only safe outcome.
            std::mem::forget(self._owner.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::Vm;
    use vm_memory::MmapRegion;

    #[test]
    fn holes_split_the_mapping_and_come_back() {
        const GPA: u64 = 0x1000_0000;
        let mut vm = Vm::new(&[(0, 1 << 20)], false).unwrap();
        let region = Arc::new(MmapRegion::<()>::new(0x4000).unwrap());
        let shadow = vm.add_readonly_region(GPA, region, |r| r).unwrap();
        let fd = vm.shared_fd();
        // A slot over a mapped page is refused (overlap); over a hole it is accepted.
        let scratch = MmapRegion::<()>::new(0x1000).unwrap();
        let probe = |page: u64| kvm_userspace_memory_region {
            slot: 200,
            flags: KVM_MEM_READONLY,
            guest_phys_addr: GPA + page * PAGE,
            memory_size: PAGE,
            userspace_addr: scratch.as_ptr() as u64,
        };
        let fits = |page: u64| {
            // SAFETY: `scratch` outlives the slot, deleted right after.
            let ok = unsafe { fd.set_user_memory_region(probe(page)) }.is_ok();
            if ok {
                let delete = kvm_userspace_memory_region {
                    memory_size: 0,
                    ..probe(page)
                };
                // SAFETY: deleting maps nothing.
                unsafe { fd.set_user_memory_region(delete) }.unwrap();
            }
            ok
        };
        assert!(!fits(2));
        shadow.set_hole(2, true).unwrap();
        assert_eq!(shadow.holes(), vec![2]);
        assert!(fits(2), "page 2 is a hole");
        assert!(!fits(1) && !fits(3), "its neighbours stay mapped");
        shadow.set_hole(2, false).unwrap();
        assert!(!fits(2), "mapped again");
        assert!(shadow.set_hole(4, true).is_err(), "outside the region");
        // More holes than slots: nothing is mapped, every page reads by exiting.
        let many = 2 * u64::from(crate::vm::SHADOW_SLOTS) + 2;
        let pages = usize::try_from(many).unwrap() + 1;
        let region = Arc::new(MmapRegion::<()>::new(0x1000 * pages).unwrap());
        let wide = vm.add_readonly_region(0x2000_0000, region, |r| r).unwrap();
        for page in (0..many).step_by(2) {
            wide.set_hole(page, true).unwrap();
        }
        let at = |page: u64| kvm_userspace_memory_region {
            guest_phys_addr: 0x2000_0000 + page * PAGE,
            ..probe(0)
        };
        // SAFETY: `scratch` outlives the slot, deleted right after.
        let mapped = unsafe { fd.set_user_memory_region(at(1)) };
        assert!(mapped.is_ok(), "nothing mapped");
        let delete = kvm_userspace_memory_region {
            memory_size: 0,
            ..at(1)
        };
        // SAFETY: deleting maps nothing.
        unsafe { fd.set_user_memory_region(delete) }.unwrap();
        wide.set_hole(0, false).unwrap();
        assert_eq!(wide.holes().len(), pages / 2 - 1);
    }
}
