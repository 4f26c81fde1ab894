#![no_main]
//! PCI bus 0 as the guest reaches it: configuration space by CF8/CFC and by ECAM, and every
//! decoded BAR on the buses (a virtio-pci function's common config, notify, ISR, device
//! config, MSI-X table and PBA, and the test devices' BARs), with BARs moved, decoding and Bus
//! Master toggled by the same accesses. Beyond "no panic, no hang": read-only identity
//! registers (vendor and device IDs, class) never change, by either config method.

use std::sync::Arc;

use exitless::bus::{BusDevice, IoBuses};
use exitless::fakes::{FakeIoEvents, FakeRoutes};
use exitless::logging::DeviceLog;
use exitless::pci::PciAddress;
use exitless::pci::cf8::PciConfigIo;
use exitless::pci::ecam::PciConfigMmio;
use exitless::pci::root::{BarBuses, BarWindows, PciRoot};
use exitless::virtio::net::{RequestResponse, VirtioNet};
use exitless::virtio::notify::NotifyPath;
use exitless::virtio::transport::TransportEnv;
use exitless::virtio::transport::pci::VirtioPci;
use libfuzzer_sys::fuzz_target;

mod common;
use common::Input;
use vm_memory::{GuestAddress, GuestMemoryMmap};

/// Functions present: (address, vendor and device ID dword, class dword >> 8).
fn identities(root: &PciRoot) -> Vec<[u8; 8]> {
    (0u8..32)
        .flat_map(|d| (0u8..8).map(move |f| (d, f)))
        .filter_map(|(d, f)| PciAddress::new(0, d, f))
        .map(|a| {
            let mut id = [0u8; 8];
            root.config_read(a, 0, &mut id[..4]);
            root.config_read(a, 8, &mut id[4..]);
            id[4] = 0; // revision may be anything; the class is the rest
            id
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let mut io = IoBuses::default();
    let buses = BarBuses::on(&mut io, "pci-bars");
    let windows = BarWindows {
        mmio: (0xc000_0000, 0xe000_0000),
        io: (0xc000, 0x1_0000),
    };
    let root = Arc::new(PciRoot::new(windows, buses).unwrap());
    root.add_host_bridge().unwrap();
    root.add_test_endpoints().unwrap();
    let env = TransportEnv {
        ioevents: Arc::new(FakeIoEvents::default()),
        routes: Arc::new(FakeRoutes::default()),
        mem,
        iommu: None,
        log: DeviceLog::new("fuzz"),
    };
    let net = VirtioNet::parts([0; 6], vec![Box::new(RequestResponse::new(64))]);
    let (function, _worker) = VirtioPci::new(env, net, 0x18, 3, NotifyPath::Address).unwrap();
    let at = PciAddress::new(0, 3, 0).unwrap();
    root.add(at, &function.config_layout(0x02_00_00), Box::new(function))
        .unwrap();
    let cf8 = PciConfigIo::new(root.clone());
    let ecam = PciConfigMmio::new(root.clone());
    let before = identities(&root);
    let mut input = Input(data);
    for _ in 0..512 {
        if input.0.is_empty() {
            break;
        }
        let [kind, w] = input.bytes::<2>();
        let offset = u32::from_le_bytes(input.bytes::<4>());
        let value = input.bytes::<8>();
        let width = [1, 2, 4, 8][usize::from(w % 4)];
        let mut b = [0u8; 8];
        match kind % 8 {
            // CONFIG_ADDRESS / CONFIG_DATA (ports 0xCF8..=0xCFF).
            0 => cf8.write(u64::from(offset % 8), &value[..width.min(4)]),
            1 => cf8.read(u64::from(offset % 8), &mut b[..width.min(4)]),
            // ECAM (bus 0: 1 MiB).
            2 => ecam.write(u64::from(offset % (1 << 20)), &value[..width]),
            3 => ecam.read(u64::from(offset % (1 << 20)), &mut b[..width]),
            // Wherever BARs may decode.
            4 | 5 => io.mmio.write(
                0xc000_0000 + u64::from(offset % 0x0100_0000),
                &value[..width],
            ),
            6 => io.mmio.read(
                0xc000_0000 + u64::from(offset % 0x0100_0000),
                &mut b[..width],
            ),
            _ => io
                .pio
                .write(0xc000 + u64::from(offset % 0x4000), &value[..width.min(4)]),
        }
    }
    assert_eq!(
        identities(&root),
        before,
        "read-only identity registers changed"
    );
});
