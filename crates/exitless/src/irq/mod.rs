//! Interrupt delivery: the KVM GSI routing table (IOAPIC pins and MSI routes), and MSI vector
//! tables with per-vector mask and pending bits, delivered through routed irqfds or injected
//! directly (`KVM_SIGNAL_MSI`).

pub mod ioapic;
pub mod msi;
pub mod remap;
pub mod routing;

pub use exitless_contract::irq as regs;

pub use msi::{MsiChange, MsiVectors, Signaller, VectorWatcher};
pub use remap::{MessageRemapper, RemappedRoutes};
pub use routing::{CommitRecord, CommitStats, CommitStrategy, GsiRouting, MsiGsi};

use vmm_sys_util::eventfd::EventFd;

/// What interrupt sources need from the platform's interrupt routing: IOAPIC pins for lines;
/// for MSI vectors, GSIs with irqfds whose routes are staged and then committed, or direct
/// injection without a route, as its [`CommitStrategy`] says. One owner
/// implements it for a VM ([`GsiRouting`], on KVM); [`crate::fakes::FakeRoutes`] records the
/// same calls in memory, so devices can be tested and fuzzed without /dev/kvm.
pub trait InterruptRoutes: Send + Sync {
    /// How MSI messages reach the guest.
    fn strategy(&self) -> CommitStrategy;
    /// Whether a vector table may send (`address`, `data`): a valid MSI, or a message a
    /// remapping unit in front of the routes decodes ([`RemappedRoutes`]).
    fn accepts(&self, address: u64, data: u32) -> bool {
        msi::is_valid_message(address, data)
    }
    /// Whether `gsi`'s route delivers: false where a remapping unit blocked the message it was
    /// set to ([`RemappedRoutes`]), so its owner does not write an irqfd that nothing is bound
    /// to (KVM would deliver the count left there once the route comes back).
    fn delivers(&self, gsi: u32) -> bool {
        let _ = gsi;
        true
    }
    /// Inject one MSI message now, without a route (`KVM_SIGNAL_MSI`).
    fn signal_msi(&self, address: u64, data: u32) -> Result<(), IrqError>;
    /// Bind `irqfd` to IOAPIC pin `gsi` (a level-triggered line when `resample` is given: the
    /// IOAPIC, KVM's or under a split irqchip the VMM's [`ioapic`], signals it at the EOI that
    /// de-asserts the line).
    fn bind_pin(
        &self,
        gsi: u32,
        irqfd: &EventFd,
        resample: Option<&EventFd>,
    ) -> Result<(), IrqError>;
    /// A GSI and an irqfd for an MSI vector, not yet routed.
    fn allocate_msi(&self) -> Result<MsiGsi, IrqError>;
    /// Give an MSI GSI back: its irqfd is unbound now, its route removal is staged.
    fn release(&self, gsi: u32) -> Result<(), IrqError>;
    /// Route `gsi` to the MSI message (`address`, `data`).
    fn set_msi(&self, gsi: u32, address: u64, data: u32) -> Result<(), IrqError>;
    /// Remove `gsi`'s route (its irqfd is then unbound and delivers nothing).
    fn clear(&self, gsi: u32) -> Result<(), IrqError>;
    /// Route each GSI to its message, or remove its route (`None`): what [`set_msi`] and
    /// [`clear`] do one at a time, which an owner may do in one go (one access's changes, such
    /// as an MSI-X Enable's, all staged at once). The first error is returned, the others are
    /// still tried.
    ///
    /// [`set_msi`]: InterruptRoutes::set_msi
    /// [`clear`]: InterruptRoutes::clear
    fn set_msis(&self, routes: &[(u32, Option<(u64, u32)>)]) -> Result<(), IrqError> {
        set_msis_one_by_one(self, routes)
    }
    /// Install the staged changes, if any, in one go.
    fn commit(&self) -> Result<(), IrqError>;
}

/// [`InterruptRoutes::set_msis`] as calls to `set_msi` and `clear`, one per route.
pub(crate) fn set_msis_one_by_one<R: InterruptRoutes + ?Sized>(
    routing: &R,
    routes: &[(u32, Option<(u64, u32)>)],
) -> Result<(), IrqError> {
    let mut first_error = None;
    for &(gsi, message) in routes {
        let result = match message {
            Some((address, data)) => routing.set_msi(gsi, address, data),
            None => routing.clear(gsi),
        };
        if let Err(e) = result {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Errors setting up interrupt delivery.
#[derive(Debug, thiserror::Error)]
pub enum IrqError {
    /// Every GSI KVM can route is taken.
    #[error(
        "too many MSI vectors: KVM routes at most {0} of them per VM; configure fewer devices or vectors"
    )]
    GsisExhausted(u32),
    /// A KVM call failed.
    #[error("cannot {what}: {source}")]
    Kvm {
        /// What was being done.
        what: &'static str,
        /// The errno KVM returned.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// An eventfd could not be created (usually: out of file descriptors).
    #[error("cannot create an eventfd for an interrupt ({0}){hint}", hint = crate::resource_hint(.0))]
    EventFd(#[source] std::io::Error),
}
