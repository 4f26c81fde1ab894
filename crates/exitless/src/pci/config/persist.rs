//! A function's configuration space in a snapshot (`crate::persist`): its 4 KiB as the guest
//! and the device left them. At restore only what the guest or the device could have changed
//! is taken (the bits of the write and RW1C masks); the rest is the freshly built function's,
//! and identity registers that differ mean the snapshot is of another function.

use super::{ConfigSpace, FUNCTION_SIZE};
use crate::pci::regs::{
    PCI_CLASS_REVISION, PCI_DEVICE_ID, PCI_HEADER_TYPE, PCI_SUBSYSTEM_ID, PCI_SUBSYSTEM_VENDOR_ID,
    PCI_VENDOR_ID,
};
use crate::persist::StateError;

/// Registers that say which function this is (PCI 3.0 §6.2.1, §6.2.4): (name, offset, size).
const IDENTITY: [(&str, u16, usize); 6] = [
    ("vendor_id", PCI_VENDOR_ID, 2),
    ("device_id", PCI_DEVICE_ID, 2),
    ("class_revision", PCI_CLASS_REVISION, 4),
    ("header_type", PCI_HEADER_TYPE, 1),
    ("subsystem_vendor_id", PCI_SUBSYSTEM_VENDOR_ID, 2),
    ("subsystem_id", PCI_SUBSYSTEM_ID, 2),
];

impl ConfigSpace {
    /// The 4 KiB, for a snapshot.
    pub fn save(&self) -> Vec<u8> {
        let mut bytes = vec![0; FUNCTION_SIZE];
        self.read(0, &mut bytes);
        bytes
    }

    /// Take the writable bits of `saved` (written by [`ConfigSpace::save`] for a function
    /// built from the same layout). A wrong length or identity is an error naming `what`'s
    /// field, and changes nothing.
    pub fn restore(&self, what: &str, saved: &[u8]) -> Result<(), StateError> {
        if saved.len() != FUNCTION_SIZE {
            return Err(StateError::new(
                format!("{what}.config"),
                format_args!("{} bytes, not {FUNCTION_SIZE}", saved.len()),
            ));
        }
        for (name, offset, size) in IDENTITY {
            let at = usize::from(offset);
            let mut now = [0u8; 4];
            self.read(offset, &mut now[..size]);
            if saved[at..at + size] != now[..size] {
                return Err(StateError::new(
                    format!("{what}.config.{name}"),
                    format_args!(
                        "{:02x?} in the snapshot, {:02x?} here: another function",
                        &saved[at..at + size],
                        &now[..size]
                    ),
                ));
            }
        }
        self.update(0, saved, |off, old, new| {
            let m = self.wmask[off] | self.w1cmask[off];
            (old & !m) | (new & m)
        });
        Ok(())
    }
}
