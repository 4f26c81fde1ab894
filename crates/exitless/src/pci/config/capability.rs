//! Capability lists: the standard list chained from the capabilities pointer (PCI 3.0 §6.7)
//! and the extended list from offset 0x100 (PCIe 4.0 §7.6).

use super::{ConfigError, ConfigSpace};
use crate::pci::regs::{
    PCI_CAPABILITY_LIST, PCI_CFG_SPACE_EXP_SIZE, PCI_CFG_SPACE_SIZE, PCI_EXT_CAP_START, PCI_STATUS,
    PCI_STATUS_CAP_LIST,
};

/// Capabilities start here and must be dword-aligned (PCI 3.0 §6.7).
pub(super) const CAP_START: u16 = 0x40;

/// A standard capability (PCI 3.0 §6.7): its ID and the bytes after the 2-byte header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capability {
    /// Capability ID (`PCI_CAP_ID_*`).
    pub id: u8,
    /// Register contents after the ID and next-pointer bytes.
    pub body: Vec<u8>,
    /// Which body bits the guest may write.
    pub body_wmask: Vec<u8>,
}

/// An extended capability (PCIe 4.0 §7.6): ID, version and the bytes after the 4-byte header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtCapability {
    /// Extended capability ID (PCIe 4.0 §7.6.3, bits 15:0 of the header).
    pub id: u16,
    /// Capability version (4 bits).
    pub version: u8,
    /// Register contents after the header dword.
    pub body: Vec<u8>,
    /// Which body bits the guest may write.
    pub body_wmask: Vec<u8>,
}

impl ConfigSpace {
    /// Chain `caps` from [`CAP_START`], each dword-aligned, and set Status.CAP_LIST if any.
    pub(super) fn init_capabilities(&mut self, caps: &[Capability]) -> Result<(), ConfigError> {
        let mut offset = CAP_START;
        let mut link = PCI_CAPABILITY_LIST;
        for cap in caps {
            let len =
                u16::try_from(2 + cap.body.len()).map_err(|_| ConfigError::CapabilitiesOverflow)?;
            let len = len.next_multiple_of(4);
            if offset + len > PCI_CFG_SPACE_SIZE || cap.body_wmask.len() > cap.body.len() {
                return Err(ConfigError::CapabilitiesOverflow);
            }
            let [pointer, _] = offset.to_le_bytes(); // < 0x100: fits the 8-bit pointer
            self.set_u8(link, pointer);
            self.set_u8(offset, cap.id);
            self.write_raw(offset + 2, &cap.body, &cap.body_wmask);
            link = offset + 1;
            offset += len;
        }
        if !caps.is_empty() {
            self.set_u16(PCI_STATUS, PCI_STATUS_CAP_LIST);
        }
        Ok(())
    }

    /// Chain `caps` from [`PCI_EXT_CAP_START`], each dword-aligned.
    pub(super) fn init_ext_capabilities(
        &mut self,
        caps: &[ExtCapability],
    ) -> Result<(), ConfigError> {
        let mut offset = PCI_EXT_CAP_START;
        for (i, cap) in caps.iter().enumerate() {
            let len =
                u16::try_from(4 + cap.body.len()).map_err(|_| ConfigError::CapabilitiesOverflow)?;
            let len = len.next_multiple_of(4);
            if offset + len > PCI_CFG_SPACE_EXP_SIZE || cap.body_wmask.len() > cap.body.len() {
                return Err(ConfigError::CapabilitiesOverflow);
            }
            let next = if i + 1 < caps.len() { offset + len } else { 0 };
            // Header: ID 15:0, version 19:16, next offset 31:20 (PCIe 4.0 §7.6.3).
            let header =
                u32::from(cap.id) | (u32::from(cap.version & 0xf) << 16) | (u32::from(next) << 20);
            self.set_u32(offset, header);
            self.write_raw(offset + 4, &cap.body, &cap.body_wmask);
            offset += len;
        }
        Ok(())
    }

    /// Offset of the first capability with ID `id` in the standard list (PCI 3.0 §6.7). The
    /// walk is bounded, so a list the guest could not change anyway still cannot loop.
    pub fn find_capability(&self, id: u8) -> Option<u16> {
        self.capabilities()
            .find(|&(_, cap)| cap == id)
            .map(|(offset, _)| offset)
    }

    /// The standard capabilities: (offset, ID) of each, in list order (PCI 3.0 §6.7).
    pub fn capabilities(&self) -> impl Iterator<Item = (u16, u8)> + '_ {
        let mut ptr = u16::from(self.get_u8(PCI_CAPABILITY_LIST) & 0xfc);
        // 48 = the most 4-byte capabilities that fit in 0x40..0xff: bounds a looping list.
        (0..48).map_while(move |_| {
            if ptr < CAP_START {
                return None;
            }
            let at = ptr;
            ptr = u16::from(self.get_u8(at + 1) & 0xfc);
            Some((at, self.get_u8(at)))
        })
    }
}
