//! The PCI configuration access capability (virtio 1.2 §4.1.4.9) is a window into BAR 0 from
//! configuration space, for firmware that cannot map the BAR: the driver sets its bar, offset
//! and length, then a write of `pci_cfg_data` is that write to the BAR and a read of it is that
//! read of the BAR. While a length is set the function's config reads are hooked, so the ECAM
//! shadow stops mapping its page and those reads exit too (`pci::root`); Linux never sets one,
//! so its reads stay exit-free.

use std::ops::Range;

use crate::guest_error;
use crate::logging::DeviceLog;
use crate::pci::config::{ConfigSpace, touches};
use crate::pci::regs::PCI_CAP_ID_VNDR;
use crate::virtio::regs::{
    VIRTIO_PCI_BAR_SIZE, VIRTIO_PCI_CAP_BAR, VIRTIO_PCI_CAP_CFG_TYPE, VIRTIO_PCI_CAP_LENGTH,
    VIRTIO_PCI_CAP_OFFSET, VIRTIO_PCI_CAP_PCI_CFG, VIRTIO_PCI_CAP_PCI_CFG_DATA,
};

/// Width of `pci_cfg_data`.
const DATA_LEN: u16 = 4;

/// The capability as the function tracks it.
#[derive(Default)]
pub(super) struct PciCfgWindow {
    /// Offset of the capability in configuration space, once placed.
    cap: Option<u16>,
    /// The driver set a length, so reads of `pci_cfg_data` must reach the function.
    armed: bool,
}

/// The BAR access the window describes.
pub(super) struct BarAccess {
    /// The BAR.
    pub(super) bar: usize,
    /// Offset into it.
    pub(super) offset: u64,
    /// 1, 2 or 4 bytes.
    pub(super) len: usize,
}

/// Offset of a field of the capability placed at `cap`.
fn field(cap: u16, reg: u32) -> u16 {
    cap + u16::try_from(reg).expect("a capability field is inside configuration space")
}

impl PciCfgWindow {
    /// Find the capability among those the function was given.
    pub(super) fn attached(&mut self, config: &ConfigSpace) {
        self.cap = config.capabilities().find_map(|(at, id)| {
            let cfg_type = u32::from(config.get_u8(field(at, VIRTIO_PCI_CAP_CFG_TYPE)));
            (id == PCI_CAP_ID_VNDR && cfg_type == VIRTIO_PCI_CAP_PCI_CFG).then_some(at)
        });
    }

    /// The configuration bytes whose reads the function must see: `pci_cfg_data`, while the
    /// driver has a window set up.
    pub(super) fn read_hooked(&self) -> Option<Range<u16>> {
        let data = field(
            self.cap.filter(|_| self.armed)?,
            VIRTIO_PCI_CAP_PCI_CFG_DATA,
        );
        Some(data..data + DATA_LEN)
    }

    /// The BAR access a read of `pci_cfg_data` is, and where `pci_cfg_data` is.
    pub(super) fn access(&self, config: &ConfigSpace, log: &DeviceLog) -> Option<(BarAccess, u16)> {
        let cap = self.cap?;
        let access = bar_access(config, cap, log)?;
        Some((access, field(cap, VIRTIO_PCI_CAP_PCI_CFG_DATA)))
    }

    /// The driver wrote `len` bytes at `offset` of configuration space: the window is set up
    /// once it has a length (§4.1.4.9.1), and a write of `pci_cfg_data` is the BAR write
    /// returned, with its data.
    pub(super) fn written(
        &mut self,
        config: &ConfigSpace,
        offset: u16,
        len: usize,
        log: &DeviceLog,
    ) -> Option<(BarAccess, [u8; 4])> {
        let cap = self.cap?;
        self.armed = config.get_u32(field(cap, VIRTIO_PCI_CAP_LENGTH)) != 0;
        let data_at = field(cap, VIRTIO_PCI_CAP_PCI_CFG_DATA);
        if !touches(offset, len, data_at, usize::from(DATA_LEN)) {
            return None;
        }
        let access = bar_access(config, cap, log)?;
        let mut data = [0u8; 4];
        config.read(data_at, &mut data);
        Some((access, data))
    }
}

/// The BAR access the capability at `cap` now describes, if it is one the driver may ask for
/// (virtio 1.2 §4.1.4.9.2: an aligned access of 1, 2 or 4 bytes inside a BAR).
fn bar_access(config: &ConfigSpace, cap: u16, log: &DeviceLog) -> Option<BarAccess> {
    let bar = config.get_u8(field(cap, VIRTIO_PCI_CAP_BAR));
    let offset = config.get_u32(field(cap, VIRTIO_PCI_CAP_OFFSET));
    let length = config.get_u32(field(cap, VIRTIO_PCI_CAP_LENGTH));
    let valid = bar == 0
        && matches!(length, 1 | 2 | 4)
        && offset.is_multiple_of(length)
        && offset
            .checked_add(length)
            .is_some_and(|end| end <= VIRTIO_PCI_BAR_SIZE);
    if !valid {
        guest_error!(
            log,
            "PCI configuration access to BAR {bar} offset {offset:#x} length \
             {length} is not a valid access; ignored"
        );
        return None;
    }
    Some(BarAccess {
        bar: usize::from(bar),
        offset: u64::from(offset),
        len: length as usize,
    })
}
