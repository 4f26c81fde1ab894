//! Configuration mechanism #1 (PCI 3.0 §3.2.2.3.2): CONFIG_ADDRESS at 0xCF8, CONFIG_DATA at
//! 0xCFC..=0xCFF. Only the first 256 bytes of a function are reachable, as on hardware.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::bus::BusDevice;
use crate::pci::PciAddress;
use crate::pci::root::PciRoot;

/// Length of the port range this device claims (0xCF8..=0xCFF).
pub const PCI_CONFIG_IO_LEN: u16 = 8;
/// Offset of CONFIG_DATA from 0xCF8.
const DATA_OFFSET: u64 = 4;
/// CONFIG_ADDRESS bits that hold state: enable (31), bus/device/function (23:8), register
/// (7:2). Reserved bits 30:24 and 1:0 read as zero.
const ADDRESS_MASK: u32 = 0x80ff_fffc;

/// The 0xCF8/0xCFC port pair.
pub struct PciConfigIo {
    root: Arc<PciRoot>,
    config_address: AtomicU32,
}

impl PciConfigIo {
    /// Ports in front of `root`.
    pub fn new(root: Arc<PciRoot>) -> Self {
        PciConfigIo { root, config_address: AtomicU32::new(0) }
    }

    /// The function, register and data-lane range a CONFIG_DATA access at `offset` (from 0xCFC)
    /// of `len` bytes reaches: lanes past 0xCFF are not configuration data.
    fn target(&self, offset: u64, len: usize) -> Option<(PciAddress, u16, usize)> {
        let (address, reg) = PciAddress::from_config_address(self.config_address.load(Ordering::Acquire))?;
        let lane = offset as usize;
        let lanes = len.min(4 - lane);
        Some((address, reg + lane as u16, lanes))
    }
}

impl BusDevice for PciConfigIo {
    fn read(&self, offset: u64, data: &mut [u8]) {
        if offset < DATA_OFFSET {
            // Only a dword access to 0xCF8 is CONFIG_ADDRESS; anything else there is not ours.
            if offset == 0 && data.len() == 4 {
                data.copy_from_slice(&self.config_address.load(Ordering::Acquire).to_le_bytes());
            } else {
                data.fill(0xff);
            }
            return;
        }
        data.fill(0xff);
        if let Some((address, reg, lanes)) = self.target(offset - DATA_OFFSET, data.len()) {
            self.root.config_read(address, reg, &mut data[..lanes]);
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        if offset < DATA_OFFSET {
            if let (0, Ok(bytes)) = (offset, <[u8; 4]>::try_from(data)) {
                self.config_address.store(u32::from_le_bytes(bytes) & ADDRESS_MASK, Ordering::Release);
            }
            return;
        }
        if let Some((address, reg, lanes)) = self.target(offset - DATA_OFFSET, data.len()) {
            self.root.config_write(address, reg, &data[..lanes]);
        }
    }
}
