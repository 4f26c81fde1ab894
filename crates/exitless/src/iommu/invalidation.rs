//! Invalidations (VT-d §6.5): register-based through CCMD and the IOTLB register, queued
//! through the invalidation queue, run inside the IQT write. Cache entries go at once; the
//! completion (the busy bit clear, a wait descriptor's status) waits out every device round
//! that began before it (see the module comment of `crate::iommu`: strict is strict).

use std::sync::atomic::Ordering;

use vm_memory::{Bytes, GuestAddress};

use super::Iommu;
use super::iotlb::{ContextScope, IotlbScope};
use super::queue::{self, Descriptor, QueueError};
use super::register_file::Registers;
use super::regs::*;
use super::tables::{self, PAGE_SHIFT};
use crate::dma::Access;
use crate::guest_error;

impl Iommu {
    /// CCMD with ICC set: a register-based context-cache invalidation (§6.5.1.1).
    pub(super) fn context_command(&self, regs: &mut Registers) {
        let command = regs.context_command;
        let granularity = (command >> VTD_CCMD_CIRG_SHIFT) & 3;
        let scope = match granularity {
            VTD_GRAN_GLOBAL => Some(ContextScope::Global),
            VTD_GRAN_DOMAIN => Some(ContextScope::Domain(command as u16)),
            VTD_GRAN_DEVICE => Some(ContextScope::device(
                (command >> VTD_CCMD_SID_SHIFT) as u16,
                command >> VTD_CCMD_FM_SHIFT,
            )),
            _ => None,
        };
        // CAIG reports the granularity performed, 0 for a request not carried out.
        let mut performed = 0;
        match scope {
            Some(scope) => {
                self.invalidate_contexts(regs, scope);
                self.drain();
                performed = granularity;
            }
            None => guest_error!(self.log, "CCMD with reserved granularity 0; ignored"),
        }
        regs.context_command = command & !VTD_CCMD_ICC & !(3 << VTD_CCMD_CAIG_SHIFT)
            | performed << VTD_CCMD_CAIG_SHIFT;
    }

    /// The IOTLB register with IVT set: a register-based IOTLB invalidation (§6.5.1.2), of
    /// the pages IVA names for page-selective requests.
    pub(super) fn iotlb_command(&self, regs: &mut Registers) {
        let command = regs.iotlb_command;
        let granularity = (command >> VTD_IOTLB_IIRG_SHIFT) & 3;
        let domain = (command >> VTD_IOTLB_DID_SHIFT) as u16;
        let mut performed = 0;
        match queue::iotlb_scope(granularity, domain, regs.invalidate_address) {
            Ok(scope) => {
                self.invalidate_iotlb(regs, scope);
                self.drain();
                performed = granularity;
            }
            Err(e) => guest_error!(self.log, "IOTLB register: {e}; ignored"),
        }
        regs.iotlb_command = command & !VTD_IOTLB_IVT & !(3 << VTD_IOTLB_IAIG_SHIFT)
            | performed << VTD_IOTLB_IAIG_SHIFT;
    }

    /// Drop the cached contexts `scope` covers and mark stale the rings they translated.
    fn invalidate_contexts(&self, regs: &mut Registers, scope: ContextScope) {
        let mut remap = self.remap.lock().unwrap();
        remap.caches.invalidate_contexts(scope);
        remap.mark_stale(|w| scope.covers(w.source, w.domain));
        regs.stats.context_invalidations += 1;
    }

    /// Drop the IOTLB entries `scope` covers, mark stale the rings on their pages, and count
    /// them for [`super::IommuStats`].
    fn invalidate_iotlb(&self, regs: &mut Registers, scope: IotlbScope) {
        let mut remap = self.remap.lock().unwrap();
        let dropped = remap.caches.invalidate_iotlb(scope);
        remap.mark_stale(|w| w.pages.iter().any(|&page| scope.covers(w.domain, page)));
        drop(remap);
        let stats = &mut regs.stats;
        *match scope {
            IotlbScope::Global => &mut stats.iotlb_global,
            IotlbScope::Domain(_) => &mut stats.iotlb_domain,
            IotlbScope::Pages { .. } => &mut stats.iotlb_page,
        } += 1;
        stats.iotlb_dropped += dropped.len() as u64;
        // Walk again, uncached and uncounted, to tell whether the guest had unmapped it.
        stats.iotlb_dropped_stale += dropped
            .iter()
            .filter(|(domain, page, cached)| {
                let context = tables::Context {
                    domain: *domain,
                    page_table: cached.page_table,
                };
                tables::walk(&self.mem, &context, page << PAGE_SHIFT, Access::Read)
                    != Ok(cached.leaf)
            })
            .count() as u64;
    }

    /// Run the queue from IQH to IQT, if queued invalidation is on and no error stopped it.
    pub(super) fn run_queue(&self, regs: &mut Registers) {
        if regs.status & VTD_GCMD_QIE == 0 || self.faults.lock().unwrap().queue_stopped() {
            return;
        }
        loop {
            let done = match regs.queue.next(&self.mem) {
                Ok(None) => return,
                Ok(Some(descriptor)) => self.carry_out(regs, descriptor),
                Err(e) => Err(e),
            };
            if let Err(e) = done {
                guest_error!(
                    self.log,
                    "{e}; the queue stops at IQH {:#x}",
                    regs.queue.head()
                );
                let due = self.faults.lock().unwrap().queue_error();
                self.send("fault", due);
                return;
            }
            regs.queue.advance();
            regs.stats.descriptors += 1;
        }
    }

    /// Carry out one queued descriptor (§6.5.2).
    fn carry_out(&self, regs: &mut Registers, descriptor: Descriptor) -> Result<(), QueueError> {
        match descriptor {
            Descriptor::Context(scope) => self.invalidate_contexts(regs, scope),
            Descriptor::Iotlb(scope) => self.invalidate_iotlb(regs, scope),
            Descriptor::InterruptEntries(scope) => self.invalidate_interrupt_entries(regs, scope),
            Descriptor::Wait { status, interrupt } => {
                // Strict: see the module comment.
                self.drain();
                if let Some((address, data)) = status {
                    self.mem
                        .store(data, GuestAddress(address), Ordering::Release)
                        .map_err(|_| QueueError::Status(address))?;
                }
                if interrupt {
                    let due = regs.queue.wait_completed();
                    self.send("invalidation", due);
                }
                regs.stats.waits += 1;
            }
        }
        Ok(())
    }
}
