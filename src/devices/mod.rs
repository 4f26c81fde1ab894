//! Platform devices that are not PCI functions.

pub mod probe_ports;
pub mod serial;
