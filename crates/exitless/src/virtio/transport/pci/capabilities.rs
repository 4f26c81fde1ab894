//! What a virtio-pci function shows in configuration space: its IDs (virtio 1.2 §4.1.2), BAR 0,
//! and the vendor capabilities that tell the driver where in BAR 0 each structure lives
//! (virtio 1.2 §4.1.4), then MSI-X (PCI 3.0 §6.8.2).

// The capabilities' fields are 8 bits wide where they hold a length or a type.
#![allow(clippy::cast_possible_truncation)]

use std::mem::{offset_of, size_of};

use zerocopy::little_endian::U32;
use zerocopy::{Immutable, IntoBytes};

use super::{MAX_VECTORS, VirtioPci};
use crate::pci::config::{Bar, Capability, FunctionLayout};
use crate::pci::msix::{Msix, MsixLocation};
use crate::pci::regs::PCI_CAP_ID_VNDR;
use crate::virtio::regs::{
    VIRTIO_PCI_BAR_COMMON, VIRTIO_PCI_BAR_DEVICE, VIRTIO_PCI_BAR_ISR, VIRTIO_PCI_BAR_MSIX_PBA,
    VIRTIO_PCI_BAR_MSIX_TABLE, VIRTIO_PCI_BAR_NOTIFY, VIRTIO_PCI_BAR_SIZE, VIRTIO_PCI_CAP_BAR,
    VIRTIO_PCI_CAP_COMMON_CFG, VIRTIO_PCI_CAP_DEVICE_CFG, VIRTIO_PCI_CAP_ISR_CFG,
    VIRTIO_PCI_CAP_NOTIFY_CFG, VIRTIO_PCI_CAP_OFFSET, VIRTIO_PCI_CAP_PCI_CFG,
    VIRTIO_PCI_COMMON_SIZE, VIRTIO_PCI_DEVICE_ID_BASE, VIRTIO_PCI_NOTIFY_MULTIPLIER,
    VIRTIO_PCI_SUBSYSTEM_ID_BASE, VIRTIO_PCI_VENDOR_ID,
};

/// BAR 0 as declared: one 64-bit memory BAR holds every structure and the MSI-X table.
const BAR0: Bar = Bar::Memory64 {
    size: VIRTIO_PCI_BAR_SIZE as u64,
    prefetchable: false,
};

/// Revision ID: modern (non-transitional) devices have revision ≥ 1 (virtio 1.2 §4.1.2.1).
const MODERN_REVISION: u8 = 1;

/// The ISR status is a single byte (virtio 1.2 §4.1.4.5).
const ISR_LEN: u32 = 1;

/// The device-specific configuration fills BAR 0 up to the notification area.
const DEVICE_CFG_LEN: u32 = VIRTIO_PCI_BAR_NOTIFY - VIRTIO_PCI_BAR_DEVICE;

/// `struct virtio_pci_cap` (virtio 1.2 §4.1.4): which structure, in which BAR, where.
#[derive(IntoBytes, Immutable)]
#[repr(C)]
pub(super) struct VirtioPciCap {
    /// PCI_CAP_ID_VNDR.
    pub(super) cap_vndr: u8,
    /// Next capability, filled in by the PCI model.
    pub(super) cap_next: u8,
    /// Length of this capability, with what follows `length` in the larger structures.
    pub(super) cap_len: u8,
    /// Which structure (`VIRTIO_PCI_CAP_*_CFG`).
    pub(super) cfg_type: u8,
    /// The BAR that holds it.
    pub(super) bar: u8,
    /// Tells apart several capabilities of one type; exitless has one of each.
    pub(super) id: u8,
    /// Reserved.
    pub(super) padding: [u8; 2],
    /// Where the structure starts in the BAR.
    pub(super) offset: U32,
    /// Its length in bytes.
    pub(super) length: U32,
}

/// `struct virtio_pci_notify_cap` (virtio 1.2 §4.1.4.4).
#[derive(IntoBytes, Immutable)]
#[repr(C)]
pub(super) struct VirtioPciNotifyCap {
    /// The notification area.
    pub(super) cap: VirtioPciCap,
    /// Queue n's doorbell is at `queue_notify_off * notify_off_multiplier` in the area.
    pub(super) notify_off_multiplier: U32,
}

/// `struct virtio_pci_cfg_cap` (virtio 1.2 §4.1.4.9).
#[derive(IntoBytes, Immutable)]
#[repr(C)]
pub(super) struct VirtioPciCfgCap {
    /// The BAR range the driver points the window at.
    pub(super) cap: VirtioPciCap,
    /// The data the window reads or writes.
    pub(super) pci_cfg_data: [u8; 4],
}

/// The bytes the PCI model writes itself: capability ID and next pointer (PCI 3.0 §6.7).
const CAP_HEADER_LEN: usize = offset_of!(VirtioPciCap, cap_len);

impl VirtioPciCap {
    /// The capability for structure `cfg_type` over `offset..offset + length` of BAR 0, in a
    /// capability structure of `cap_len` bytes.
    fn new(cfg_type: u32, offset: u32, length: u32, cap_len: usize) -> Self {
        VirtioPciCap {
            cap_vndr: PCI_CAP_ID_VNDR,
            cap_next: 0,
            cap_len: cap_len as u8,
            cfg_type: cfg_type as u8,
            bar: 0,
            id: 0,
            padding: [0; 2],
            offset: U32::new(offset),
            length: U32::new(length),
        }
    }

    /// A plain `virtio_pci_cap` for structure `cfg_type` over `offset..offset + length`.
    fn plain(cfg_type: u32, offset: u32, length: u32) -> Capability {
        vendor_capability(&Self::new(cfg_type, offset, length, size_of::<Self>()), &[])
    }
}

/// `cap` as the PCI model takes a capability: its bytes after the header, with `wmask` over
/// them (none writable if empty).
fn vendor_capability<T: IntoBytes + Immutable>(cap: &T, wmask: &[u8]) -> Capability {
    Capability {
        id: PCI_CAP_ID_VNDR,
        body: cap.as_bytes()[CAP_HEADER_LEN..].to_vec(),
        body_wmask: wmask.to_vec(),
    }
}

/// The notification capability: one doorbell per queue, `VIRTIO_PCI_NOTIFY_MULTIPLIER` apart.
fn notify_cap(queues: usize) -> Capability {
    let cap = VirtioPciNotifyCap {
        cap: VirtioPciCap::new(
            VIRTIO_PCI_CAP_NOTIFY_CFG,
            VIRTIO_PCI_BAR_NOTIFY,
            queues as u32 * VIRTIO_PCI_NOTIFY_MULTIPLIER,
            size_of::<VirtioPciNotifyCap>(),
        ),
        notify_off_multiplier: U32::new(VIRTIO_PCI_NOTIFY_MULTIPLIER),
    };
    vendor_capability(&cap, &[])
}

/// The PCI configuration access capability (virtio 1.2 §4.1.4.9): the driver writes its bar,
/// offset, length and pci_cfg_data; the rest is read-only.
fn pci_cfg_cap() -> Capability {
    let cap = VirtioPciCfgCap {
        cap: VirtioPciCap::new(VIRTIO_PCI_CAP_PCI_CFG, 0, 0, size_of::<VirtioPciCfgCap>()),
        pci_cfg_data: [0; 4],
    };
    // A byte the driver may write is writable in all its bits.
    const WRITABLE: u8 = 0xff;
    let mut wmask = [0u8; size_of::<VirtioPciCfgCap>()];
    wmask[VIRTIO_PCI_CAP_BAR as usize] = WRITABLE;
    // offset, length and pci_cfg_data run to the end of the capability.
    wmask[VIRTIO_PCI_CAP_OFFSET as usize..].fill(WRITABLE);
    vendor_capability(&cap, &wmask[CAP_HEADER_LEN..])
}

impl VirtioPci {
    /// Configuration layout of a virtio-pci function for `device_type` with class `class_code`,
    /// `queues` queues and `vectors` MSI-X vectors.
    pub fn layout(
        device_type: u32,
        class_code: u32,
        queues: usize,
        vectors: usize,
    ) -> FunctionLayout {
        FunctionLayout {
            vendor_id: VIRTIO_PCI_VENDOR_ID as u16,
            device_id: (VIRTIO_PCI_DEVICE_ID_BASE + device_type) as u16,
            class_code,
            revision: MODERN_REVISION,
            subsystem_vendor_id: VIRTIO_PCI_VENDOR_ID as u16,
            subsystem_id: (VIRTIO_PCI_SUBSYSTEM_ID_BASE + device_type) as u16,
            bars: vec![BAR0],
            capabilities: vec![
                VirtioPciCap::plain(
                    VIRTIO_PCI_CAP_COMMON_CFG,
                    VIRTIO_PCI_BAR_COMMON,
                    VIRTIO_PCI_COMMON_SIZE,
                ),
                notify_cap(queues),
                VirtioPciCap::plain(VIRTIO_PCI_CAP_ISR_CFG, VIRTIO_PCI_BAR_ISR, ISR_LEN),
                VirtioPciCap::plain(
                    VIRTIO_PCI_CAP_DEVICE_CFG,
                    VIRTIO_PCI_BAR_DEVICE,
                    DEVICE_CFG_LEN,
                ),
                pci_cfg_cap(),
                Msix::capability(
                    vectors.clamp(1, MAX_VECTORS),
                    MsixLocation {
                        bir: 0,
                        offset: VIRTIO_PCI_BAR_MSIX_TABLE,
                    },
                    MsixLocation {
                        bir: 0,
                        offset: VIRTIO_PCI_BAR_MSIX_PBA,
                    },
                ),
            ],
            ..Default::default()
        }
    }
}
