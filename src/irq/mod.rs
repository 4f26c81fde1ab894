//! Interrupt delivery: the KVM GSI routing table (IOAPIC pins and MSI routes), and MSI vector
//! tables with per-vector mask and pending bits, delivered through irqfds.

pub mod msi;
pub mod routing;

#[allow(missing_docs)] // each constant is documented in the shared file
pub mod regs {
    //! x86 interrupt-controller facts shared with the probe guest (see the file's header).
    include!("regs.rs");
}

pub use msi::{MsiChange, MsiVectors};
pub use routing::{CommitStats, CommitStrategy, GsiRouting};

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
        /// The error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// An eventfd could not be created (usually: out of file descriptors).
    #[error("cannot create an eventfd for an interrupt ({0}){hint}", hint = crate::resource_hint(.0))]
    EventFd(#[source] std::io::Error),
}
