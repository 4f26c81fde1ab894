//! A table of MSI vectors with per-vector mask and pending bits, as MSI-X has them (PCI 3.0
//! §6.8.2) and as exitless's virtio-mmio MSI extension has them (docs/virtio-mmio-msi.md).
//!
//! A message is sent by signalling the vector's irqfd, whose GSI is routed to the message
//! (committed per vector, per guest access or at the vector's first message), or, under
//! [`CommitStrategy::Direct`], injected with `KVM_SIGNAL_MSI` without a route. A message due
//! while the vector (or the whole function) is masked, while the table is disabled, or while
//! the function may not master the bus, sets the vector's pending bit instead and is sent when
//! it becomes deliverable. Transports turn each guest access into one [`MsiVectors::update`]
//! with complete address/data pairs, so no message can use a half-written pair, and a burst that
//! makes many vectors live at once (MSI-X Enable) costs at most one routing commit when batched,
//! none at all when deferred to first use or direct.
//!
//! **Routes for a signaller outside exitless** (a vhost-user backend writes a vector's irqfd
//! itself, without exitless): such a table is built with [`Signaller::Outside`], and
//! - under [`CommitStrategy::Direct`] it has GSIs and routes anyway, committed batched (once
//!   per guest access), since a direct message can only be injected by exitless;
//! - under every strategy, [`MsiVectors::deliverable_irqfd`] hands out a vector's irqfd only
//!   while its route is committed (not staged) and the vector may send; otherwise the outside
//!   signaller must signal exitless instead, which calls [`MsiVectors::trigger`]: that sets the
//!   pending bit, or under first use commits the staged route and sends (`send`);
//! - a [`VectorWatcher`] hears every change of those answers, before the guest access that made
//!   it completes, so the signaller can be moved between the irqfd and exitless in time.

use std::sync::{Arc, Mutex, Weak};

use vmm_sys_util::eventfd::EventFd;

use super::regs::{
    MSI_ADDRESS_BASE, MSI_ADDRESS_MASK, MSI_DATA_DELIVERY_MODE_SHIFT, MSI_DELIVERY_FIXED,
    MSI_DELIVERY_INIT, MSI_DELIVERY_LOWEST, MSI_DELIVERY_NMI, MSI_DELIVERY_SMI,
};
use super::routing::MsiGsi;
use super::{CommitStrategy, InterruptRoutes, IrqError};
use crate::guest_error;
use crate::logging::DeviceLog;

#[derive(Clone, Copy, Default)]
struct Vector {
    address: u64,
    data: u32,
    /// The message this vector's GSI is routed to, if any: in KVM once committed.
    routed: Option<(u64, u32)>,
    /// Its route changed and may not be committed yet: the next message commits first.
    staged: bool,
    masked: bool,
    pending: bool,
}

struct State {
    vectors: Vec<Vector>,
    enabled: bool,
    function_masked: bool,
    /// A PCI function may only send messages while its Bus Master Enable is set (PCI 3.0
    /// §6.2.2); messages due meanwhile are held pending. Always set for platform devices.
    bus_master: bool,
}

impl State {
    /// Whether no vector may send now, whatever its own mask.
    fn blocked(&self) -> bool {
        !self.enabled || self.function_masked || !self.bus_master
    }
}

/// One change a guest access makes to a vector table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsiChange {
    /// Vector `index` now has this complete message.
    Program {
        /// The vector's index in the table.
        index: usize,
        /// Message address: where the message is written (the APIC's 0xFEEx_xxxx window).
        address: u64,
        /// Message data: vector and delivery mode.
        data: u32,
    },
    /// Mask or unmask vector `index`.
    Mask {
        /// The vector's index in the table.
        index: usize,
        /// Whether the vector is now masked (its messages held as pending).
        masked: bool,
    },
    /// Enable or disable the table (MSI-X Enable).
    Enable(bool),
    /// Mask or unmask every vector at once (MSI-X Function Mask).
    FunctionMask(bool),
    /// The function may (or may no longer) master the bus (PCI command register bit 2).
    BusMaster(bool),
}

/// Who writes a table's irqfds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signaller {
    /// Only exitless sends the table's messages (its own device threads).
    Vmm,
    /// Something outside exitless (a vhost-user backend) writes the irqfds that
    /// [`MsiVectors::deliverable_irqfd`] hands out: routes are needed whatever the strategy.
    Outside,
}

/// Who must hear when [`MsiVectors::deliverable_irqfd`]'s answers may have changed.
pub trait VectorWatcher: Send + Sync {
    /// Called after the table's lock is released, on the thread that made the change (a vCPU's
    /// guest access, `reset`, or a `trigger` whose send committed a staged route), before that
    /// guest access completes.
    fn vectors_changed(&self);
}

/// A device's MSI vectors.
pub struct MsiVectors {
    routing: Arc<dyn InterruptRoutes>,
    /// The strategy these vectors follow: the routing table's, but batched where an outside
    /// signaller needs routes that direct injection would not make (the module's rule).
    strategy: CommitStrategy,
    watcher: Mutex<Option<Weak<dyn VectorWatcher>>>,
    log: Arc<DeviceLog>,
    count: usize,
    /// A GSI and irqfd per vector; none when messages are injected directly.
    gsis: Vec<MsiGsi>,
    state: Mutex<State>,
}

/// Whether `address`/`data` is a message the x86 interrupt controller accepts: an address in
/// the 0xFEExxxxx window and a delivery mode that exists (Intel SDM vol. 3 §11.11.2). Fixed
/// and lowest-priority messages need a vector ≥ 16 (0..15 are reserved); SMI, NMI and INIT
/// ignore the vector field, so it does not decide them; ExtINT and the reserved modes are not
/// messages a device can send.
pub fn is_valid_message(address: u64, data: u32) -> bool {
    let mode = (data >> MSI_DATA_DELIVERY_MODE_SHIFT) & 0x7;
    let delivery_ok = match mode {
        MSI_DELIVERY_FIXED | MSI_DELIVERY_LOWEST => data & 0xff >= 16,
        MSI_DELIVERY_SMI | MSI_DELIVERY_NMI | MSI_DELIVERY_INIT => true,
        _ => false,
    };
    address & MSI_ADDRESS_MASK == MSI_ADDRESS_BASE && address >> 32 == 0 && delivery_ok
}

impl MsiVectors {
    /// `count` vectors, all masked and disabled, each with a GSI and an irqfd unless messages
    /// are injected directly (never for an outside `signaller`: the module's rule); guest
    /// errors are counted on `log`, the owning device's.
    pub fn new(
        routing: Arc<dyn InterruptRoutes>,
        count: usize,
        log: Arc<DeviceLog>,
        signaller: Signaller,
    ) -> Result<Self, IrqError> {
        let strategy = match (routing.strategy(), signaller) {
            (CommitStrategy::Direct, Signaller::Outside) => CommitStrategy::Batched,
            (strategy, _) => strategy,
        };
        let mut table = MsiVectors {
            routing,
            strategy,
            watcher: Mutex::new(None),
            log,
            count,
            gsis: Vec::with_capacity(count),
            state: Mutex::new(State {
                vectors: vec![
                    Vector {
                        masked: true,
                        ..Default::default()
                    };
                    count
                ],
                enabled: false,
                function_masked: false,
                bus_master: true,
            }),
        };
        // On an error, Drop gives back what was taken so far.
        if strategy != CommitStrategy::Direct {
            for _ in 0..count {
                table.gsis.push(table.routing.allocate_msi()?);
            }
        }
        Ok(table)
    }

    /// The owning device's log.
    pub fn log(&self) -> &Arc<DeviceLog> {
        &self.log
    }

    /// Number of vectors.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are no vectors.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Apply what one guest access did, then bring KVM's routes up to date as the strategy
    /// says (one commit batched, one per change per-vector, none yet at first use or direct),
    /// then send the messages that became deliverable. A vector is routed while the table is
    /// enabled and its message is valid; masks only decide whether a message is sent or left
    /// pending, so they cost a commit only by releasing a pending message whose route is staged
    /// (first use). An invalid message is never routed or injected: its interrupts are dropped,
    /// as a real bus would send them nowhere.
    pub fn update(&self, changes: &[MsiChange]) {
        self.changing(|st| self.apply(st, changes));
    }

    fn apply(&self, st: &mut State, changes: &[MsiChange]) {
        for &change in changes {
            match change {
                MsiChange::Program {
                    index,
                    address,
                    data,
                } => match st.vectors.get_mut(index) {
                    Some(v) => {
                        (v.address, v.data) = (address, data);
                        if !self.routing.accepts(address, data) {
                            guest_error!(
                                self.log,
                                "MSI vector {index}: address {address:#x} data {data:#x} is not a \
                                 valid message; its interrupts are dropped"
                            );
                        }
                    }
                    None => guest_error!(
                        self.log,
                        "MSI vector {index} does not exist; update ignored"
                    ),
                },
                MsiChange::Mask { index, masked } => match st.vectors.get_mut(index) {
                    Some(v) => v.masked = masked,
                    None => {
                        guest_error!(
                            self.log,
                            "MSI vector {index} does not exist; mask change ignored"
                        );
                    }
                },
                MsiChange::Enable(enabled) => st.enabled = enabled,
                MsiChange::FunctionMask(masked) => st.function_masked = masked,
                MsiChange::BusMaster(on) => st.bus_master = on,
            }
        }
        self.sync_routes(st);
        self.flush_pending(st);
    }

    /// Vector `index`'s irqfd when someone outside exitless may signal it now and the message
    /// reaches the guest: the table enabled, the function and the vector unmasked, Bus Master
    /// set, the message valid, its route committed in KVM (not staged) and delivering. None
    /// otherwise, and always under direct injection for [`Signaller::Vmm`] (no irqfds). A
    /// remapping unit that blocks or allows a route later (`InterruptRoutes::delivers`) is not
    /// watched: devices with an outside signaller are not put behind one.
    pub fn deliverable_irqfd(&self, index: usize) -> Option<Arc<EventFd>> {
        let st = self.state.lock().unwrap();
        self.deliverable(&st, index)
            .then(|| self.gsis[index].irqfd.clone())
    }

    /// Register who must hear when [`MsiVectors::deliverable_irqfd`]'s answers change (one
    /// watcher; a later call replaces it).
    pub fn set_watcher(&self, watcher: Weak<dyn VectorWatcher>) {
        *self.watcher.lock().unwrap() = Some(watcher);
    }

    fn deliverable(&self, st: &State, index: usize) -> bool {
        let Some(v) = st.vectors.get(index) else {
            return false;
        };
        index < self.gsis.len()
            && !st.blocked()
            && !v.masked
            && !v.staged
            && self.routing.accepts(v.address, v.data)
            && v.routed == Some((v.address, v.data))
            && self.routing.delivers(self.gsis[index].gsi)
    }

    /// Run `change` on the locked state; then, with the lock released, tell the watcher if
    /// any vector's deliverability changed (compared only when there is a watcher).
    fn changing<R>(&self, change: impl FnOnce(&mut State) -> R) -> R {
        let watcher = self
            .watcher
            .lock()
            .unwrap()
            .as_ref()
            .and_then(Weak::upgrade);
        let mut st = self.state.lock().unwrap();
        let answers = |st: &State| -> Vec<bool> {
            (0..self.count).map(|i| self.deliverable(st, i)).collect()
        };
        let before = watcher.as_ref().map(|_| answers(&st));
        let result = change(&mut st);
        let changed = before.is_some_and(|before| before != answers(&st));
        drop(st);
        if let (true, Some(w)) = (changed, watcher) {
            w.vectors_changed();
        }
        result
    }

    /// The message of vector `index`: (address, data).
    pub fn message(&self, index: usize) -> Option<(u64, u32)> {
        let st = self.state.lock().unwrap();
        st.vectors.get(index).map(|v| (v.address, v.data))
    }

    /// Whether vector `index` is masked (absent vectors read as masked).
    pub fn is_masked(&self, index: usize) -> bool {
        let st = self.state.lock().unwrap();
        st.vectors.get(index).is_none_or(|v| v.masked)
    }

    /// Whether every vector is masked at once (MSI-X Function Mask).
    pub fn is_function_masked(&self) -> bool {
        self.state.lock().unwrap().function_masked
    }

    /// Whether vector `index` has a pending message.
    pub fn is_pending(&self, index: usize) -> bool {
        let st = self.state.lock().unwrap();
        st.vectors.get(index).is_some_and(|v| v.pending)
    }

    /// Back to the reset state: disabled, every vector masked, no message, nothing pending.
    pub fn reset(&self) {
        self.changing(|st| {
            st.enabled = false;
            st.function_masked = false;
            for v in &mut st.vectors {
                *v = Vector {
                    masked: true,
                    routed: v.routed,
                    ..Default::default()
                };
            }
            self.sync_routes(st);
        });
    }

    /// Drop every pending message (the device behind the vectors was reset); the table,
    /// masks and enable stay.
    pub fn clear_pending(&self) {
        for v in &mut self.state.lock().unwrap().vectors {
            v.pending = false;
        }
    }

    /// Send vector `index`'s message, or make it pending if it cannot be sent now.
    pub fn trigger(&self, index: usize) {
        self.changing(|st| {
            let blocked = st.blocked();
            let Some(v) = st.vectors.get_mut(index) else {
                self.log.warn(format_args!(
                    "MSI vector {index} does not exist; interrupt dropped"
                ));
                return;
            };
            if blocked || v.masked {
                v.pending = true;
            } else {
                self.send(&mut st.vectors, index);
            }
        });
    }

    /// Send every vector (see [`MsiVectors::trigger`]).
    pub fn trigger_all(&self) {
        for i in 0..self.len() {
            self.trigger(i);
        }
    }

    /// Stage the route each vector should have: one while the table is enabled and its
    /// message valid. Under per-vector and batched commits, commit now; under first-use, the
    /// vector's next signal does; direct messages have no routes. Called with the state
    /// locked, as [`MsiVectors::send`] is (the rule in `routing/`).
    fn sync_routes(&self, st: &mut State) {
        if self.strategy == CommitStrategy::Direct {
            return;
        }
        let mut changes = Vec::new();
        for (i, v) in st.vectors.iter_mut().enumerate() {
            let want = (st.enabled && self.routing.accepts(v.address, v.data))
                .then_some((v.address, v.data));
            if want == v.routed {
                continue;
            }
            if changes.is_empty() {
                // One allocation for the rest of the table (an Enable changes all of it).
                changes.reserve(self.count - i);
            }
            changes.push((self.gsis[i].gsi, want));
            v.routed = want;
            v.staged = true;
        }
        // One call for the access's changes: an Enable stages the whole table at once.
        if !changes.is_empty()
            && let Err(e) = self.routing.set_msis(&changes)
        {
            self.log.warn(format_args!("MSI vectors: {e}"));
        }
        if self.strategy.commits_per_access() {
            self.commit(&mut st.vectors);
        }
    }

    /// Commit what is staged, so no vector's route is staged any more; false (and a warning)
    /// if KVM refused.
    fn commit(&self, vectors: &mut [Vector]) -> bool {
        match self.routing.commit() {
            Ok(()) => {
                for v in vectors {
                    v.staged = false;
                }
                true
            }
            Err(e) => {
                self.log.warn(format_args!("MSI vectors: {e}"));
                false
            }
        }
    }

    fn flush_pending(&self, st: &mut State) {
        if st.blocked() {
            return;
        }
        for i in 0..st.vectors.len() {
            let v = &mut st.vectors[i];
            if v.pending && !v.masked {
                v.pending = false;
                self.send(&mut st.vectors, i);
            }
        }
    }

    /// Send vector `index`'s message now, if it is one (an invalid message goes nowhere, as on
    /// a real bus); the caller checked that the table is enabled, the function and the vector
    /// unmasked and the bus mastered. **The rule that keeps delivery correct, for every
    /// strategy**: called only with the state locked, and never through a route that is not in
    /// KVM. A direct message carries its own address and data; a route staged since the last
    /// commit (first use, or a batched commit KVM refused) is committed here, before its irqfd
    /// is written, and if KVM refuses again the message is injected directly instead. For an
    /// outside signaller the same holds: it gets an irqfd only once its route is committed
    /// (`deliverable_irqfd`), and under direct injection its table routes, batched (the
    /// module's rule), so it never signals into a route KVM does not have.
    fn send(&self, vectors: &mut [Vector], index: usize) {
        let v = vectors[index];
        if !self.routing.accepts(v.address, v.data) {
            return;
        }
        let direct = self.strategy == CommitStrategy::Direct;
        if direct || (v.staged && !self.commit(vectors)) {
            if let Err(e) = self.routing.signal_msi(v.address, v.data) {
                self.log.warn(format_args!("MSI vector {index}: {e}"));
            }
            return;
        }
        if v.routed.is_none() || !self.routing.delivers(self.gsis[index].gsi) {
            return;
        }
        if let Err(e) = self.gsis[index].irqfd.write(1) {
            self.log
                .warn(format_args!("MSI vector {index}: irqfd write failed: {e}"));
        }
    }
}

impl Drop for MsiVectors {
    fn drop(&mut self) {
        for g in &self.gsis {
            let _ = self.routing.release(g.gsi);
        }
        let _ = self.routing.commit();
    }
}

mod persist;
#[cfg(test)]
mod tests;

pub use persist::VectorState;
