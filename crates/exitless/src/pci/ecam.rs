//! The ECAM window (PCIe 4.0 §7.2.2): configuration space as memory, 4 KiB per function.
//!
//! Two ways to serve it:
//! - **trapped**: the window has no memslot, so every access exits to this device;
//! - **shadow**: the [`ConfigWindow`](crate::pci::config::ConfigWindow) is mapped as a
//!   read-only memslot, so reads are plain memory reads in the guest; writes still fault, exit
//!   here, are emulated, and land in the same bytes before the vCPU resumes.
//!
//! An access is handled byte by byte, split at function boundaries, so that a trapped access
//! sees exactly what a read of the shadow memory would.

use std::sync::Arc;

use crate::bus::BusDevice;
use crate::pci::PciAddress;
use crate::pci::regs::PCI_CFG_SPACE_EXP_SIZE;
use crate::pci::root::PciRoot;

/// How the ECAM window is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EcamMode {
    /// Every access exits to the VMM.
    Trap,
    /// Reads come from a read-only memslot holding config space; writes exit.
    Shadow,
}

/// The ECAM window in front of `root`.
pub struct PciConfigMmio {
    root: Arc<PciRoot>,
}

impl PciConfigMmio {
    /// Window for bus 0 of `root`.
    pub fn new(root: Arc<PciRoot>) -> Self {
        PciConfigMmio { root }
    }

    /// Split an access into per-function chunks: (function, register, range in `len`).
    fn chunks(
        offset: u64,
        len: usize,
    ) -> impl Iterator<Item = (PciAddress, u16, std::ops::Range<usize>)> {
        let mut done = 0;
        std::iter::from_fn(move || {
            if done >= len {
                return None;
            }
            let (address, reg) = PciAddress::from_ecam_offset(offset + done as u64);
            let n = (len - done).min(PCI_CFG_SPACE_EXP_SIZE as usize - usize::from(reg));
            let range = done..done + n;
            done += n;
            Some((address, reg, range))
        })
    }
}

impl BusDevice for PciConfigMmio {
    fn read(&self, offset: u64, data: &mut [u8]) {
        for (address, reg, range) in Self::chunks(offset, data.len()) {
            self.root.config_read(address, reg, &mut data[range]);
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        for (address, reg, range) in Self::chunks(offset, data.len()) {
            self.root.config_write(address, reg, &data[range]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_split_at_function_boundaries() {
        let chunks: Vec<_> = PciConfigMmio::chunks(0x8ffe, 4).collect();
        assert_eq!(chunks.len(), 2);
        assert_eq!(
            (chunks[0].0, chunks[0].1, chunks[0].2.clone()),
            (PciAddress::new(0, 1, 0).unwrap(), 0xffe, 0..2)
        );
        assert_eq!(
            (chunks[1].0, chunks[1].1, chunks[1].2.clone()),
            (PciAddress::new(0, 1, 1).unwrap(), 0, 2..4)
        );
        assert_eq!(PciConfigMmio::chunks(0x10, 8).count(), 1);
    }
}
