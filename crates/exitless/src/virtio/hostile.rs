//! A hostile driver, without KVM (the in-memory fakes stand in for it): random accesses of
//! every width at every offset of both transports, random configuration writes (BARs moved,
//! decoding and Bus Master toggled), rings full of random bytes and kicks in between, with a
//! plausible bring-up now and then so the device thread gets live queues to chew on. The VMM
//! must neither panic nor hang, and afterwards each device still identifies itself and resets.

use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::notify::NotifyPath;
use super::regs::*;
use super::transport::mmio::{MmioPlacement, MmioTransport};
use super::transport::pci::VirtioPci;
use crate::bus::{BusDevice, IoBuses};
use crate::pci::PciAddress;
use crate::pci::regs::{PCI_BAR0, PCI_COMMAND, PCI_COMMAND_MASTER, PCI_COMMAND_MEMORY};
use crate::pci::root::{BarBuses, BarWindows, PciRoot};

/// xorshift64*: a fixed seed makes a failure reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn width(&mut self) -> usize {
        [1, 2, 4, 8][usize::try_from(self.below(4)).unwrap()]
    }
}

/// Rings live in the first 64 KiB; scribble over them.
fn scribble(mem: &GuestMemoryMmap, rng: &mut Rng) {
    for _ in 0..64 {
        let at = rng.below(0x1_0000) & !7;
        mem.write_obj(rng.next(), GuestAddress(at)).unwrap();
    }
}

const ROUNDS: usize = 300;
const ACCESSES: usize = 100;

#[test]
fn random_accesses_to_virtio_mmio_neither_panic_nor_hang() {
    let p = super::test_parts();
    let (mem, log) = (p.env.mem.clone(), p.env.log.clone());
    let at = MmioPlacement {
        base: 0xd000_0000,
        gsi: 16,
        notify: NotifyPath::Address,
    };
    let (t, _w) = MmioTransport::new(p.env, p.net, at).unwrap();
    let reg = |r: u32, v: u32| t.write(u64::from(r), &v.to_le_bytes());
    let read = |r: u32| {
        let mut b = [0u8; 4];
        t.read(u64::from(r), &mut b);
        u32::from_le_bytes(b)
    };
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut live = 0;
    for round in 0..ROUNDS {
        if round % 10 == 0 {
            reg(VIRTIO_MMIO_STATUS, 0);
            reg(VIRTIO_MMIO_STATUS, 3);
            reg(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
            reg(VIRTIO_MMIO_DRIVER_FEATURES, 1 | 3 << 10); // VERSION_1, MSI, NOTIFY
            reg(VIRTIO_MMIO_STATUS, 0xb);
            for q in 0..2 {
                reg(VIRTIO_MMIO_QUEUE_SEL, q);
                reg(VIRTIO_MMIO_QUEUE_NUM, 16);
                reg(VIRTIO_MMIO_QUEUE_DESC_LOW, 0x1000 + 0x3000 * q);
                reg(VIRTIO_MMIO_QUEUE_AVAIL_LOW, 0x2000 + 0x3000 * q);
                reg(VIRTIO_MMIO_QUEUE_USED_LOW, 0x3000 + 0x3000 * q);
                reg(VIRTIO_MMIO_QUEUE_READY, 1);
            }
            reg(VIRTIO_MMIO_STATUS, 0xf);
            live += usize::from(read(VIRTIO_MMIO_STATUS) == 0xf);
        }
        scribble(&mem, &mut rng);
        for _ in 0..ACCESSES {
            let (offset, width) = (rng.below(0x2000 + 16), rng.width());
            if rng.next() & 1 == 0 {
                t.write(offset, &rng.next().to_le_bytes()[..width]);
            } else {
                let mut b = [0u8; 8];
                t.read(offset, &mut b[..width]);
            }
        }
    }
    reg(VIRTIO_MMIO_STATUS, 0);
    assert_eq!(read(VIRTIO_MMIO_STATUS), 0, "it still resets");
    assert_eq!(read(VIRTIO_MMIO_MAGIC_VALUE), VIRTIO_MMIO_MAGIC);
    assert!(live > 0, "the device went live between the attacks");
    assert!(log.guest_errors() > 0, "the attacks were seen and counted");
}

#[test]
fn random_accesses_to_virtio_pci_neither_panic_nor_hang() {
    let p = super::test_parts();
    let (mem, log) = (p.env.mem.clone(), p.env.log.clone());
    let (function, _w) = VirtioPci::new(p.env, p.net, 0x18, 3, NotifyPath::Address).unwrap();
    let mut io = IoBuses::default();
    let buses = BarBuses::on(&mut io, "pci-bars");
    let windows = BarWindows {
        mmio: (0xc000_0000, 0xe000_0000),
        io: (0xc000, 0x1_0000),
    };
    let root = Arc::new(PciRoot::new(windows, buses).unwrap());
    let at = PciAddress::new(0, 3, 0).unwrap();
    let layout = function.config_layout(0x02_00_00);
    root.add(at, &layout, Box::new(function)).unwrap();
    let home = 0xc000_0000u64;
    let common = |r: u32, len: usize, v: u32| {
        io.mmio.write(
            home + u64::from(VIRTIO_PCI_BAR_COMMON + r),
            &v.to_le_bytes()[..len],
        );
    };
    let mut rng = Rng(0x5eed_1234_abcd_0002);
    for round in 0..ROUNDS {
        if round % 10 == 0 {
            let command = PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
            root.config_write(at, PCI_BAR0, &0xc000_0004u32.to_le_bytes());
            root.config_write(at, PCI_BAR0 + 4, &0u32.to_le_bytes());
            root.config_write(at, PCI_COMMAND, &command.to_le_bytes());
            common(VIRTIO_PCI_COMMON_STATUS, 1, 0);
            common(VIRTIO_PCI_COMMON_STATUS, 1, 3);
            common(VIRTIO_PCI_COMMON_GFSELECT, 4, 1);
            common(VIRTIO_PCI_COMMON_GF, 4, 1); // VERSION_1
            common(VIRTIO_PCI_COMMON_STATUS, 1, 0xb);
            for q in 0..2 {
                common(VIRTIO_PCI_COMMON_Q_SELECT, 2, q);
                common(VIRTIO_PCI_COMMON_Q_SIZE, 2, 16);
                common(VIRTIO_PCI_COMMON_Q_DESCLO, 4, 0x1000 + 0x3000 * q);
                common(VIRTIO_PCI_COMMON_Q_AVAILLO, 4, 0x2000 + 0x3000 * q);
                common(VIRTIO_PCI_COMMON_Q_USEDLO, 4, 0x3000 + 0x3000 * q);
                common(VIRTIO_PCI_COMMON_Q_ENABLE, 2, 1);
            }
            common(VIRTIO_PCI_COMMON_STATUS, 1, 0xf);
        }
        scribble(&mem, &mut rng);
        for _ in 0..ACCESSES {
            let width = rng.width();
            let value = rng.next().to_le_bytes();
            match rng.below(8) {
                // Configuration space, mostly the header and capabilities, sometimes anywhere.
                0 => {
                    let span = if rng.next() & 1 == 0 { 0x100 } else { 0x1000 };
                    let reg = u16::try_from(rng.below(span)).unwrap();
                    root.config_write(at, reg, &value[..width.min(4)]);
                }
                1 => {
                    let mut b = [0u8; 4];
                    let reg = u16::try_from(rng.below(0x1000)).unwrap();
                    root.config_read(at, reg, &mut b[..width.min(4)]);
                }
                // Around BAR 0's home and wherever the guest may have moved it.
                2..=4 => io.mmio.write(home + rng.below(0x4000), &value[..width]),
                _ => {
                    let mut b = [0u8; 8];
                    io.mmio.read(home + rng.below(0x4000), &mut b[..width]);
                }
            }
        }
    }
    root.config_write(at, PCI_BAR0, &0xc000_0004u32.to_le_bytes());
    root.config_write(at, PCI_BAR0 + 4, &0u32.to_le_bytes());
    root.config_write(at, PCI_COMMAND, &PCI_COMMAND_MEMORY.to_le_bytes());
    common(VIRTIO_PCI_COMMON_STATUS, 1, 0);
    let mut status = [0u8; 1];
    io.mmio.read(
        home + u64::from(VIRTIO_PCI_BAR_COMMON + VIRTIO_PCI_COMMON_STATUS),
        &mut status,
    );
    assert_eq!(status[0], 0, "it still resets");
    let mut vendor = [0u8; 2];
    root.config_read(at, 0, &mut vendor);
    assert_eq!(u16::from_le_bytes(vendor), 0x1af4);
    assert!(log.guest_errors() > 0, "the attacks were seen and counted");
}
