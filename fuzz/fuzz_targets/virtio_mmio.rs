#![no_main]
//! virtio-mmio registers, including the MSI and doorbell extension, driven by arbitrary
//! accesses (any offset in and past the window, widths 1/2/4/8, any value) mixed with writes
//! into guest memory where the rings may be. Beyond "no panic, no hang": the identity
//! registers never change, and a reset afterwards brings the status back to 0.

use std::sync::Arc;

use exitless::bus::BusDevice;
use exitless::fakes::{FakeIoEvents, FakeRoutes};
use exitless::logging::DeviceLog;
use exitless::virtio::net::{RequestResponse, VirtioNet};
use exitless::virtio::notify::NotifyPath;
use exitless::virtio::regs::*;
use exitless::virtio::transport::TransportEnv;
use exitless::virtio::transport::mmio::{MmioPlacement, MmioTransport};
use libfuzzer_sys::fuzz_target;

mod common;
use common::Input;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const MEM: usize = 1 << 20;

fn read(t: &MmioTransport, reg: u32) -> u32 {
    let mut b = [0u8; 4];
    t.read(u64::from(reg), &mut b);
    u32::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    let env = TransportEnv {
        ioevents: Arc::new(FakeIoEvents::default()),
        routes: Arc::new(FakeRoutes::default()),
        mem: mem.clone(),
        iommu: None,
        log: DeviceLog::new("fuzz"),
    };
    let net = VirtioNet::parts([0; 6], vec![Box::new(RequestResponse::new(64))]);
    let at = MmioPlacement {
        base: 0xd000_0000,
        gsi: 16,
        notify: NotifyPath::Address,
    };
    let (t, _worker) = MmioTransport::new(env, net, at).unwrap();
    let mut input = Input(data);
    for _ in 0..512 {
        if input.0.is_empty() {
            break;
        }
        let [kind, w] = input.bytes::<2>();
        let offset = u64::from(u16::from_le_bytes(input.bytes::<2>())) % 0x2100;
        let value = input.bytes::<8>();
        let width = [1, 2, 4, 8][usize::from(w % 4)];
        match kind % 4 {
            0 | 1 => t.write(offset, &value[..width]),
            2 => {
                let mut b = [0u8; 8];
                t.read(offset, &mut b[..width]);
            }
            _ => {
                // Where the driver would put rings and buffers.
                let at = u64::from_le_bytes(value) % (MEM as u64 - 8);
                let _ = mem.write_slice(&value, GuestAddress(at & !7));
            }
        }
    }
    assert_eq!(read(&t, VIRTIO_MMIO_MAGIC_VALUE), VIRTIO_MMIO_MAGIC);
    assert_eq!(read(&t, VIRTIO_MMIO_VERSION), 2);
    assert_eq!(read(&t, VIRTIO_MMIO_DEVICE_ID), VIRTIO_ID_NET);
    t.write(u64::from(VIRTIO_MMIO_STATUS), &0u32.to_le_bytes());
    assert_eq!(read(&t, VIRTIO_MMIO_STATUS), 0, "a reset always resets");
});
