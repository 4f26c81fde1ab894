//! PCI: configuration space and the three ways a guest reaches it (measured by the `pci`
//! scenario, docs/benchmarks.md).
//!
//! - [`cf8`]: configuration mechanism #1 by port I/O;
//! - [`ecam`]: the ECAM window, trapped or backed by a read-only shadow;
//! - [`root`]: bus 0, its functions and BAR decoding; [`config`]: the register model.

pub use exitless_contract::pci as regs;

pub mod address;
pub mod cf8;
pub mod config;
pub mod ecam;
pub mod function;
pub mod msix;
pub mod root;

pub use address::PciAddress;
pub use ecam::EcamMode;
pub use root::PciRoot;
