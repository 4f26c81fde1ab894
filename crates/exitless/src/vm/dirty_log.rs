//! Which guest pages the vCPUs wrote: KVM's dirty log on guest RAM's memslots
//! (`KVM_MEM_LOG_DIRTY_PAGES`, `KVM_GET_DIRTY_LOG`; api.rst §4.8 and §4.35), for a live
//! migration's passes. KVM sees only the guest's own writes: what the VMM's threads, the
//! kernel's vhost workers or a backend write into guest memory is not in it
//! (`machine::migration` finds those another way).

use kvm_bindings::{KVM_MEM_LOG_DIRTY_PAGES, kvm_userspace_memory_region};

use crate::vm::{Vm, VmError, kvm_err};

/// The page size the dirty log counts in: the x86 base page (Intel SDM Vol. 3A §4.3).
const PAGE: u64 = 4096;

impl Vm {
    /// Start (`on`) or stop logging the vCPUs' writes to guest RAM. Starting clears the log:
    /// the first [`Vm::dirty_pages`] after it holds the writes since. Shadows are read-only and
    /// never logged.
    pub fn log_dirty_pages(&self, on: bool) -> Result<(), VmError> {
        for slot in &self.slots {
            let flags = if on {
                slot.flags | KVM_MEM_LOG_DIRTY_PAGES
            } else {
                slot.flags & !KVM_MEM_LOG_DIRTY_PAGES
            };
            let region = kvm_userspace_memory_region { flags, ..*slot };
            // SAFETY: the same slot over the same live mapping (`Vm::add_ram_slot`'s), only
            // its flags changed; KVM keeps mapping it as before.
            unsafe { self.fd.set_user_memory_region(region) }
                .map_err(kvm_err("log dirty pages"))?;
        }
        Ok(())
    }

    /// The guest-physical addresses of the pages the vCPUs wrote since logging started or the
    /// last call, in address order; each slot's log is cleared as it is read.
    pub fn dirty_pages(&self) -> Result<Vec<u64>, VmError> {
        let mut pages = Vec::new();
        for slot in &self.slots {
            let size = usize::try_from(slot.memory_size).expect("a mapped slot fits usize");
            let bitmap = self
                .fd
                .get_dirty_log(slot.slot, size)
                .map_err(kvm_err("read the dirty log"))?;
            pages.extend(set_bits(&bitmap).map(|page| slot.guest_phys_addr + page * PAGE));
        }
        Ok(pages)
    }
}

/// The numbers of the bits set in `bitmap`, bit 0 of word 0 first.
fn set_bits(bitmap: &[u64]) -> impl Iterator<Item = u64> + '_ {
    (0_u64..).zip(bitmap).flat_map(|(word, &bits)| {
        (0..64)
            .filter(move |bit| bits & (1 << bit) != 0)
            .map(move |bit| word * 64 + bit)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_bits_are_counted_from_the_first_word_up() {
        let found: Vec<u64> = set_bits(&[0b101, 0, 1 << 63]).collect();
        assert_eq!(found, [0, 2, 191]);
    }

    #[test]
    fn logging_starts_clean_and_stops() {
        let vm = Vm::new(&[(0, 1 << 20)], false).unwrap();
        vm.log_dirty_pages(true).unwrap();
        // No vCPU ran: nothing is dirty, and the VMM's own writes are not KVM's to see.
        vm_memory::Bytes::write_slice(vm.memory(), &[1; 8], vm_memory::GuestAddress(0x2000))
            .unwrap();
        assert!(vm.dirty_pages().unwrap().is_empty());
        vm.log_dirty_pages(false).unwrap();
        // A slot that is not logged has no log to read.
        assert!(vm.dirty_pages().is_err());
    }
}
