//! The one owner of the VM's KVM GSI routing table and of the irqfds bound to its GSIs.
//!
//! `KVM_SET_GSI_ROUTING` replaces the whole table, and KVM then revisits every irqfd bound to
//! the VM, so a commit costs in proportion to the routes and irqfds already there: committing
//! once per vector makes enabling N vectors cost O(N²). Every route (the IOAPIC and PIC pins,
//! each MSI/MSI-X vector) is kept here; changes are *staged* and [`GsiRouting::commit`]
//! writes them in one call. With [`CommitStrategy::PerVector`] (the baseline most VMMs use)
//! each change commits at once instead.
//!
//! An MSI vector's irqfd is bound to its GSI only while the vector has a route: a commit first
//! installs the table, then binds the irqfds of new routes and unbinds those of removed ones
//! (the order of the QEMU patch this batching comes from: docs/benchmarks.md, scenario `msix`).
//!
//! Routes are needed only for irqfds something other than the VMM signals; the owner of the
//! vectors ([`super::MsiVectors`]) can also commit at a vector's first message, or use no
//! routes and inject each message ([`CommitStrategy`]). The rule that keeps delivery correct
//! under every strategy is stated once, at `MsiVectors::send`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvm_bindings::{
    KVM_IRQ_ROUTING_IRQCHIP, KVM_IRQ_ROUTING_MSI, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE, KvmIrqRouting, kvm_irq_routing_entry, kvm_msi,
};
use kvm_ioctls::VmFd;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::InterruptRoutes;
use super::IrqError;
use super::ioapic::pins::PinInputs;

/// IOAPIC pins (GSIs 0..24); MSI routes get GSIs from here up.
pub const IOAPIC_PINS: u32 = 24;
/// The IOAPIC pin of ISA IRQ 0, the PIT's (the MADT's interrupt source override).
const PIT_IOAPIC_PIN: u32 = 2;
/// Pins of the two 8259 PICs, routed beside IOAPIC pins 0..16.
const PIC_PINS: u32 = 16;
/// Entries KVM accepts in one table, and the bound on GSI numbers (`KVM_MAX_IRQ_ROUTES`).
pub const MAX_ROUTES: u32 = 4096;
/// MSI vectors one VM can route: the table's entries less the IOAPIC and PIC pins.
pub const MAX_MSI_ROUTES: u32 = MAX_ROUTES - IOAPIC_PINS - PIC_PINS;

/// How MSI messages reach the guest: through routes in KVM's table, committed when, or
/// without routes at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CommitStrategy {
    /// Every change commits at once: enabling N vectors makes N commits.
    PerVector,
    /// Changes wait for [`GsiRouting::commit`], which their owner calls once per guest access.
    Batched,
    /// Guest accesses only stage changes; the first message the VMM sends on a vector whose
    /// route is staged commits everything staged so far, before its irqfd is written. An
    /// outside signaller (a vhost-user backend) writes its irqfd without the VMM, so it is
    /// handed the irqfd only once the route is committed, and signals the VMM until then
    /// (the rule is stated in `irq/msi/mod.rs`).
    FirstUse,
    /// No routes and no irqfds: vectors only the VMM signals are injected with
    /// `KVM_SIGNAL_MSI` (api.rst §4.71), as QEMU's userspace devices do. The default: every
    /// exitless device signals its own vectors, and `exitless bench` measures it cheapest at
    /// enable, in the unmask burst and on request/response traffic. Vectors an outside
    /// signaller writes are routed anyway, batched (`irq/msi/mod.rs`).
    #[default]
    Direct,
}

impl CommitStrategy {
    /// Every strategy, in report order.
    pub const ALL: [CommitStrategy; 4] = [
        CommitStrategy::PerVector,
        CommitStrategy::Batched,
        CommitStrategy::FirstUse,
        CommitStrategy::Direct,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            CommitStrategy::PerVector => "per-vector",
            CommitStrategy::Batched => "batched",
            CommitStrategy::FirstUse => "first-use",
            CommitStrategy::Direct => "direct",
        }
    }

    /// Whether the owner of the vectors commits at the end of each guest access.
    pub fn commits_per_access(self) -> bool {
        matches!(self, CommitStrategy::PerVector | CommitStrategy::Batched)
    }
}

/// How many commits were made and how long KVM took for them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// How many `KVM_SET_GSI_ROUTING` calls were made.
    pub commits: u64,
    /// Time inside those calls.
    pub time: Duration,
}

impl CommitStats {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &CommitStats) -> CommitStats {
        CommitStats {
            commits: self.commits - earlier.commits,
            time: self.time.saturating_sub(earlier.time),
        }
    }
}

/// A GSI for an MSI vector and the irqfd that sends it.
pub struct MsiGsi {
    /// The GSI the vector's route is installed under.
    pub gsi: u32,
    /// Writing 1 sends the vector's message once the GSI is routed.
    pub irqfd: Arc<EventFd>,
}

/// Routes by GSI, in a vector indexed by GSI: staging one is a store, not a map insertion
/// that allocates (an MSI-X Enable stages every vector of its table while the guest waits),
/// and a commit reads them in GSI order as KVM lists them. GSIs are dense: pins first, then
/// MSI GSIs handed out from the next one up.
#[derive(Default)]
struct RouteTable {
    by_gsi: Vec<Option<kvm_irq_routing_entry>>,
    len: usize,
}

impl RouteTable {
    /// Make room for a route of `gsi`, so staging it later does not allocate.
    fn reserve(&mut self, gsi: u32) {
        let at = gsi as usize;
        if at >= self.by_gsi.len() {
            self.by_gsi.resize(at + 1, None);
        }
    }

    fn insert(&mut self, e: kvm_irq_routing_entry) {
        self.reserve(e.gsi);
        if self.by_gsi[e.gsi as usize].replace(e).is_none() {
            self.len += 1;
        }
    }

    /// Whether `gsi` had a route.
    fn remove(&mut self, gsi: u32) -> bool {
        let removed = self
            .by_gsi
            .get_mut(gsi as usize)
            .and_then(Option::take)
            .is_some();
        self.len -= usize::from(removed);
        removed
    }

    fn contains(&self, gsi: u32) -> bool {
        self.by_gsi.get(gsi as usize).is_some_and(Option::is_some)
    }

    fn values(&self) -> impl Iterator<Item = &kvm_irq_routing_entry> {
        self.by_gsi.iter().flatten()
    }

    /// The GSIs with a route, in order.
    fn gsis(&self) -> impl Iterator<Item = u32> + '_ {
        self.values().map(|e| e.gsi)
    }
}

struct Table {
    /// The routes as staged: what the next commit installs.
    routes: RouteTable,
    /// Whether `routes` differs from what KVM has.
    staged: bool,
    /// The irqfd of each allocated MSI GSI.
    irqfds: BTreeMap<u32, Arc<EventFd>>,
    /// MSI GSIs whose irqfd KVM has bound.
    bound: BTreeSet<u32>,
    next_gsi: u32,
    free: Vec<u32>,
    stats: CommitStats,
    /// Each commit, once [`GsiRouting::keep_commit_log`] asked for it (benchmarks only).
    log: Option<CommitLog>,
    /// Inside [`GsiRouting::commit_once`]: a table's commit only stages; whether one did.
    held: Option<bool>,
}

/// One `KVM_SET_GSI_ROUTING` call, as the commit log keeps it.
#[derive(Clone, Debug)]
pub struct CommitRecord {
    /// When the call returned.
    pub at: Instant,
    /// Time inside the call.
    pub time: Duration,
    /// Time binding and unbinding irqfds after it (`KVM_IRQFD`).
    pub bind: Duration,
    /// MSI GSIs the call routed that the previous one did not.
    pub added: Vec<u32>,
}

/// The commits since the log was asked for, and the MSI GSIs the last one left routed.
#[derive(Default)]
struct CommitLog {
    records: Vec<CommitRecord>,
    routed: BTreeSet<u32>,
}

/// Most commits the log keeps: a table's worth of vectors, each committed once.
const MAX_LOGGED_COMMITS: usize = MAX_ROUTES as usize;

/// The routing table, shared by every device that routes interrupts.
pub struct GsiRouting {
    vm: Arc<VmFd>,
    strategy: CommitStrategy,
    table: Mutex<Table>,
    /// Under a split irqchip, the userspace IOAPIC's inputs, which pins are bound to.
    split: Option<Arc<PinInputs>>,
}

fn irqchip_route(gsi: u32, chip: u32, pin: u32) -> kvm_irq_routing_entry {
    let mut e = kvm_irq_routing_entry {
        gsi,
        type_: KVM_IRQ_ROUTING_IRQCHIP,
        ..Default::default()
    };
    e.u.irqchip.irqchip = chip;
    e.u.irqchip.pin = pin;
    e
}

fn msi_route(gsi: u32, address: u64, data: u32) -> kvm_irq_routing_entry {
    let mut e = kvm_irq_routing_entry {
        gsi,
        type_: KVM_IRQ_ROUTING_MSI,
        ..Default::default()
    };
    e.u.msi.address_lo = (address & 0xffff_ffff) as u32;
    e.u.msi.address_hi = (address >> 32) as u32;
    e.u.msi.data = data;
    e
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> IrqError {
    move |source| IrqError::Kvm { what, source }
}

impl GsiRouting {
    /// The table for an in-kernel irqchip (GSI n → IOAPIC pin n, and for n < 16 also the PIC
    /// pin), but GSI 0 (where KVM's PIT raises IRQ 0) → IOAPIC pin 2, as the MADT's interrupt
    /// source override says (ACPI 6.5 §5.2.12.5) and as QEMU routes it; committed at once;
    /// later changes follow `strategy`.
    pub fn new(vm: Arc<VmFd>, strategy: CommitStrategy) -> Result<Self, IrqError> {
        let mut routes = RouteTable::default();
        for gsi in 0..IOAPIC_PINS {
            let pin = if gsi == 0 { PIT_IOAPIC_PIN } else { gsi };
            routes.insert(irqchip_route(gsi, KVM_IRQCHIP_IOAPIC, pin));
        }
        Self::with_routes(vm, strategy, routes, None)
    }

    /// The table of a split irqchip (KVM_CAP_SPLIT_IRQCHIP with [`IOAPIC_PINS`] pins): no
    /// irqchip routes (KVM has no IOAPIC or PIC to route to); pins are bound to `pins`, the
    /// userspace IOAPIC's inputs, which routes GSIs below [`IOAPIC_PINS`] itself.
    pub fn split(
        vm: Arc<VmFd>,
        strategy: CommitStrategy,
        pins: Arc<PinInputs>,
    ) -> Result<Self, IrqError> {
        Self::with_routes(vm, strategy, RouteTable::default(), Some(pins))
    }

    fn with_routes(
        vm: Arc<VmFd>,
        strategy: CommitStrategy,
        routes: RouteTable,
        split: Option<Arc<PinInputs>>,
    ) -> Result<Self, IrqError> {
        let routing = GsiRouting {
            split,
            vm,
            strategy,
            table: Mutex::new(Table {
                routes,
                staged: true,
                irqfds: BTreeMap::new(),
                bound: BTreeSet::new(),
                next_gsi: IOAPIC_PINS,
                free: Vec::new(),
                stats: CommitStats::default(),
                log: None,
                held: None,
            }),
        };
        routing.commit()?;
        Ok(routing)
    }

    /// When changes are committed.
    pub fn strategy(&self) -> CommitStrategy {
        self.strategy
    }

    /// Commits made so far and the time KVM took for them.
    pub fn stats(&self) -> CommitStats {
        self.table.lock().unwrap().stats
    }

    /// Routes KVM has or will have after the next commit (pins included).
    pub fn route_count(&self) -> usize {
        self.table.lock().unwrap().routes.len
    }

    fn after_change(&self, t: &mut Table) -> Result<(), IrqError> {
        match self.strategy {
            CommitStrategy::PerVector => self.commit_locked(t),
            _ => Ok(()),
        }
    }

    fn commit_locked(&self, t: &mut Table) -> Result<(), IrqError> {
        if !t.staged {
            return Ok(());
        }
        let pic = |gsi: u32| match gsi {
            0..8 => Some(irqchip_route(gsi, KVM_IRQCHIP_PIC_MASTER, gsi)),
            8..PIC_PINS => Some(irqchip_route(gsi, KVM_IRQCHIP_PIC_SLAVE, gsi - 8)),
            _ => None,
        };
        let entries: Vec<kvm_irq_routing_entry> = t
            .routes
            .values()
            .flat_map(|e| {
                let legacy = (e.type_ == KVM_IRQ_ROUTING_IRQCHIP)
                    .then(|| pic(e.gsi))
                    .flatten();
                std::iter::once(*e).chain(legacy)
            })
            .collect();
        // Allocation keeps the table within KVM's limit; from_entries checks it again.
        let table = KvmIrqRouting::from_entries(&entries)
            .map_err(|_| IrqError::GsisExhausted(MAX_MSI_ROUTES))?;
        let start = Instant::now();
        let result = self.vm.set_gsi_routing(&table);
        let time = start.elapsed();
        t.stats.time += time;
        t.stats.commits += 1;
        result.map_err(kvm_err("set the GSI routing table"))?;
        t.staged = false;
        let bound = Instant::now();
        let result = self.bind_irqfds(t);
        Self::log_commit(t, time, bound);
        result
    }

    /// Run `restore` with the vector tables' commits held, then make one commit: a restore
    /// puts back every device's live vectors before any vCPU runs, so the whole machine's
    /// routes can reach KVM in one `KVM_SET_GSI_ROUTING` rather than one per table, each of
    /// which rebuilds KVM's whole table (its cost grows with the routes already in: 32 to 107
    /// µs from the first of 8 tables of 65 routes to the last, here). Per-vector changes still
    /// commit one by one (that strategy is the per-change baseline); first use commits nothing
    /// at restore unless a message is sent, as ever.
    ///
    /// While held, a table that commits sees success and counts its routes as in KVM. That is
    /// safe only while no MSI irqfd is bound, which is when this holds at all (a restore
    /// builds a fresh machine): an irqfd is bound only by the one commit, after its route is in
    /// KVM, and a message written to it before that waits in the eventfd and is injected when
    /// it is bound (`KVM_IRQFD` looks for an event already pending: virt/kvm/eventfd.c), so no
    /// message ever travels a route KVM does not have. A failed commit fails the restore.
    pub fn commit_once<R>(&self, restore: impl FnOnce() -> R) -> Result<R, IrqError> {
        {
            let mut t = self.table.lock().unwrap();
            t.held = t.bound.is_empty().then_some(false);
        }
        let out = restore();
        let mut t = self.table.lock().unwrap();
        if t.held.take() == Some(true) {
            self.commit_locked(&mut t)?;
        }
        Ok(out)
    }

    /// Keep a record of every commit from now on ([`GsiRouting::commit_log`]): what a
    /// benchmark reads to tell which device's routes each commit carried.
    pub fn keep_commit_log(&self) {
        let mut t = self.table.lock().unwrap();
        let routed = if t.staged {
            BTreeSet::new()
        } else {
            t.routes.gsis().filter(|&g| g >= IOAPIC_PINS).collect()
        };
        t.log.get_or_insert(CommitLog {
            records: Vec::new(),
            routed,
        });
    }

    /// The commits recorded since [`GsiRouting::keep_commit_log`] (none if it was not called).
    pub fn commit_log(&self) -> Vec<CommitRecord> {
        let t = self.table.lock().unwrap();
        t.log.as_ref().map_or_else(Vec::new, |l| l.records.clone())
    }

    /// Add the commit that took `time` in KVM, its irqfds bound from `bound` on, to the log.
    fn log_commit(t: &mut Table, time: Duration, bound: Instant) {
        let at = Instant::now();
        let Some(log) = t.log.as_mut() else {
            return;
        };
        let routed: BTreeSet<u32> = t.routes.gsis().filter(|&g| g >= IOAPIC_PINS).collect();
        let added = routed.difference(&log.routed).copied().collect();
        log.routed = routed;
        if log.records.len() < MAX_LOGGED_COMMITS {
            log.records.push(CommitRecord {
                at,
                time,
                bind: at - bound,
                added,
            });
        }
    }

    /// Bind the irqfds of routed MSI GSIs and unbind the others.
    fn bind_irqfds(&self, t: &mut Table) -> Result<(), IrqError> {
        let mut first_error = None;
        for (&gsi, irqfd) in &t.irqfds {
            let (routed, bound) = (t.routes.contains(gsi), t.bound.contains(&gsi));
            let result = match (routed, bound) {
                (true, false) => self
                    .vm
                    .register_irqfd(irqfd, gsi)
                    .map(|()| t.bound.insert(gsi))
                    .map_err(kvm_err("bind an MSI irqfd")),
                (false, true) => self
                    .vm
                    .unregister_irqfd(irqfd, gsi)
                    .map(|()| t.bound.remove(&gsi))
                    .map_err(kvm_err("unbind an MSI irqfd")),
                _ => Ok(true),
            };
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl InterruptRoutes for GsiRouting {
    fn strategy(&self) -> CommitStrategy {
        self.strategy
    }

    fn signal_msi(&self, address: u64, data: u32) -> Result<(), IrqError> {
        let msi = kvm_msi {
            address_lo: (address & 0xffff_ffff) as u32,
            address_hi: (address >> 32) as u32,
            data,
            ..Default::default()
        };
        // 0 means the guest blocked it (api.rst §4.71): as a masked line would, not an error.
        self.vm
            .signal_msi(msi)
            .map(|_| ())
            .map_err(kvm_err("inject an MSI"))
    }

    fn bind_pin(
        &self,
        gsi: u32,
        irqfd: &EventFd,
        resample: Option<&EventFd>,
    ) -> Result<(), IrqError> {
        assert!(gsi < IOAPIC_PINS, "GSI {gsi} is not an IOAPIC pin");
        if let Some(pins) = &self.split {
            return pins.bind(gsi, irqfd, resample).map_err(IrqError::EventFd);
        }
        match resample {
            Some(r) => self.vm.register_irqfd_with_resample(irqfd, r, gsi),
            None => self.vm.register_irqfd(irqfd, gsi),
        }
        .map_err(kvm_err("bind an irqfd to an IOAPIC pin"))
    }

    fn allocate_msi(&self) -> Result<MsiGsi, IrqError> {
        let irqfd = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(IrqError::EventFd)?);
        let mut t = self.table.lock().unwrap();
        let gsi = match t.free.pop() {
            Some(gsi) => gsi,
            None if t.next_gsi < IOAPIC_PINS + MAX_MSI_ROUTES => {
                t.next_gsi += 1;
                t.next_gsi - 1
            }
            None => return Err(IrqError::GsisExhausted(MAX_MSI_ROUTES)),
        };
        t.irqfds.insert(gsi, irqfd.clone());
        t.routes.reserve(gsi);
        Ok(MsiGsi { gsi, irqfd })
    }

    fn release(&self, gsi: u32) -> Result<(), IrqError> {
        let mut t = self.table.lock().unwrap();
        let Some(irqfd) = t.irqfds.remove(&gsi) else {
            return Ok(());
        };
        // The route goes whatever happens to the irqfd, so a reused GSI never inherits it.
        t.staged |= t.routes.remove(gsi);
        t.free.push(gsi);
        if t.bound.remove(&gsi) {
            self.vm
                .unregister_irqfd(&irqfd, gsi)
                .map_err(kvm_err("unbind an MSI irqfd"))?;
        }
        self.after_change(&mut t)
    }

    fn set_msi(&self, gsi: u32, address: u64, data: u32) -> Result<(), IrqError> {
        let mut t = self.table.lock().unwrap();
        t.routes.insert(msi_route(gsi, address, data));
        t.staged = true;
        self.after_change(&mut t)
    }

    fn clear(&self, gsi: u32) -> Result<(), IrqError> {
        let mut t = self.table.lock().unwrap();
        t.staged |= t.routes.remove(gsi);
        self.after_change(&mut t)
    }

    /// Under one lock, staged together; per-vector still commits each change on its own (the
    /// strategy the seed measures).
    fn set_msis(&self, routes: &[(u32, Option<(u64, u32)>)]) -> Result<(), IrqError> {
        if self.strategy == CommitStrategy::PerVector {
            return super::set_msis_one_by_one(self, routes);
        }
        let mut t = self.table.lock().unwrap();
        for &(gsi, message) in routes {
            t.staged |= match message {
                Some((address, data)) => {
                    t.routes.insert(msi_route(gsi, address, data));
                    true
                }
                None => t.routes.remove(gsi),
            };
        }
        self.after_change(&mut t)
    }

    /// Write every staged change in one `KVM_SET_GSI_ROUTING` (inside
    /// [`GsiRouting::commit_once`]: at its end).
    fn commit(&self) -> Result<(), IrqError> {
        let mut t = self.table.lock().unwrap();
        if let Some(asked) = t.held.as_mut() {
            *asked = true;
            return Ok(());
        }
        self.commit_locked(&mut t)
    }
}

#[cfg(test)]
mod tests;
