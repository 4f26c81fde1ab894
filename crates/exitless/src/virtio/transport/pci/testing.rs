//! What the virtio-pci function's tests share: a net function on the fakes, its configuration
//! space, BAR 0 accesses, and a driver's first steps.

#![allow(clippy::cast_possible_truncation)] // fixtures

use std::sync::Arc;

use super::*;
use crate::fakes::FakeIoEvents;
use crate::pci::config::ConfigWindow;
use crate::pci::regs::*;
use crate::virtio::regs::*;

pub(super) fn function(notify: NotifyPath) -> (VirtioPci, Worker, Arc<FakeIoEvents>) {
    let p = crate::virtio::test_parts();
    let (f, w) = VirtioPci::new(p.env, p.net, 0x18, 3, notify).unwrap();
    (f, w, p.ioevents)
}

pub(super) fn config() -> ConfigSpace {
    let window = Arc::new(ConfigWindow::new(1).unwrap());
    let layout = VirtioPci::layout(VIRTIO_ID_NET, 0x02_00_00, 2, 3);
    ConfigSpace::new(window, 0, &layout, &[0xc000_0000])
        .unwrap()
        .0
}

pub(super) fn bar_read(f: &mut VirtioPci, c: &ConfigSpace, offset: u32, len: usize) -> u32 {
    let mut b = [0u8; 4];
    f.bar_read(c, 0, u64::from(offset), &mut b[..len]);
    u32::from_le_bytes(b)
}

pub(super) fn bar_write(f: &mut VirtioPci, c: &ConfigSpace, offset: u32, len: usize, v: u32) {
    f.bar_write(c, 0, u64::from(offset), &v.to_le_bytes()[..len]);
}

/// A driver's feature negotiation: VIRTIO_F_VERSION_1 only, up to FEATURES_OK.
pub(super) fn negotiate_version_1(f: &mut VirtioPci, c: &ConfigSpace) {
    bar_write(f, c, VIRTIO_PCI_COMMON_STATUS, 1, 3);
    bar_write(f, c, VIRTIO_PCI_COMMON_GFSELECT, 4, 1);
    bar_write(
        f,
        c,
        VIRTIO_PCI_COMMON_GF,
        4,
        1 << (VIRTIO_F_VERSION_1 - 32),
    );
    bar_write(f, c, VIRTIO_PCI_COMMON_STATUS, 1, 0xb);
}

/// A driver sets up queue `q` of 16 entries on `rings` (descriptors, driver, device areas,
/// below 4 GiB) and enables it.
pub(super) fn enable_queue(f: &mut VirtioPci, c: &ConfigSpace, q: u32, rings: [u64; 3]) {
    bar_write(f, c, VIRTIO_PCI_COMMON_Q_SELECT, 2, q);
    bar_write(f, c, VIRTIO_PCI_COMMON_Q_SIZE, 2, 16);
    for (n, ring) in rings.into_iter().enumerate() {
        bar_write(
            f,
            c,
            VIRTIO_PCI_COMMON_Q_DESCLO + 8 * n as u32,
            4,
            ring as u32,
        );
    }
    bar_write(f, c, VIRTIO_PCI_COMMON_Q_ENABLE, 2, 1);
}

pub(super) fn set_command(f: &mut VirtioPci, c: &ConfigSpace, command: u16) {
    c.set_u16(PCI_COMMAND, command);
    f.config_written(c, PCI_COMMAND, 2);
}
