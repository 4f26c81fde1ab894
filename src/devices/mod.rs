//! Platform devices that are not PCI functions.

pub mod serial;
