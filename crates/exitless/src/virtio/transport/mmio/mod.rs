//! virtio-mmio, version 2 register layout (virtio 1.2 §4.2.2; the register file is in
//! `registers`), with exitless's MSI and per-queue doorbell extension (docs/virtio-mmio-msi.md,
//! in `extension`), each offered as a feature bit.
//!
//! Without the MSI feature the device has one level-triggered line: the driver's handler reads
//! InterruptStatus and writes InterruptACK (two exits) before its EOI. With it, every queue and
//! configuration changes get a vector of their own, with mask and pending bits, and the
//! handler touches no device register.

mod extension;
mod persist;
mod registers;
#[cfg(test)]
pub(super) mod tests;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use extension::MsiStaging;
pub use extension::doorbell_offset;

use crate::bus::BusDevice;
use crate::dma::DmaContext;
use crate::guest_error;
use crate::irq::MsiVectors;

use crate::virtio::interrupt::{Interrupts, LegacyLine};
use crate::virtio::notify::{Datamatch, Doorbell, NotifyPath, QueueEvents};
use crate::virtio::regs::{
    VIRTIO_F_MMIO_MSI, VIRTIO_F_MMIO_NOTIFY, VIRTIO_MMIO_CONFIG, VIRTIO_MMIO_DOORBELL_BASE,
    VIRTIO_MMIO_QUEUE_NOTIFY,
};
use crate::virtio::state::VirtioState;
use crate::virtio::transport::persist::Phase;
use crate::virtio::transport::{TransportCore, TransportEnv};
use crate::virtio::worker::Worker;
use crate::virtio::{DeviceParts, VirtioError};

/// A virtio-mmio device on the MMIO bus.
pub struct MmioTransport {
    /// The registers, the device thread, DMA, interrupts and doorbells.
    core: TransportCore,
    /// The per-queue doorbells to register when the notify feature is negotiated.
    address_doorbells: Vec<Doorbell>,
    /// The extension's staged message of the selected vector.
    staging: Mutex<MsiStaging>,
    /// The extension's MsiControl register.
    msi_control: AtomicU32,
    /// Where it is in a snapshot's life.
    phase: Mutex<Phase>,
}

/// Where a virtio-mmio device sits and how its doorbells are wired.
#[derive(Clone, Copy, Debug)]
pub struct MmioPlacement {
    /// Guest-physical base of its `VIRTIO_MMIO_WINDOW_SIZE`-byte window.
    pub base: u64,
    /// IOAPIC pin of its legacy line.
    pub gsi: u32,
    /// How doorbell writes reach the device.
    pub notify: NotifyPath,
}

fn feature(n: u32) -> u64 {
    1 << n
}

/// The doorbell ioeventfds of a device at `at` with `queues` queues, as (the extension's
/// per-queue doorbells, those registered from the start).
fn doorbells(at: &MmioPlacement, queues: usize) -> (Vec<Doorbell>, Vec<Doorbell>) {
    let doorbells: Vec<Doorbell> = (0..queues)
        .filter_map(|q| {
            let q32 = u32::try_from(q).ok()?;
            match at.notify {
                NotifyPath::Exit => None,
                NotifyPath::Datamatch => Some(Doorbell {
                    queue: q,
                    address: at.base + u64::from(VIRTIO_MMIO_QUEUE_NOTIFY),
                    datamatch: Some(Datamatch::U32(q32)),
                }),
                NotifyPath::Address => Some(Doorbell {
                    queue: q,
                    address: at.base + u64::from(doorbell_offset(q32)),
                    datamatch: None,
                }),
            }
        })
        .collect();
    // QueueNotify is a standard register: its ioeventfds hold from the start. The per-queue
    // doorbell page is the extension's, live only once its feature is negotiated
    // (docs/virtio-mmio-msi.md), so those wait for FEATURES_OK.
    match at.notify {
        NotifyPath::Address => (doorbells, Vec::new()),
        _ => (Vec::new(), doorbells),
    }
}

impl MmioTransport {
    /// `device` at `at` in `env`, with its irqfds, ioeventfds and device thread.
    pub fn new(
        env: TransportEnv,
        device: DeviceParts,
        at: MmioPlacement,
    ) -> Result<(Self, Worker), VirtioError> {
        let TransportEnv {
            ioevents,
            routes,
            mem,
            iommu: _,
            log,
        } = env;
        let signaller = device.work.signaller();
        let state = VirtioState::new(
            device.device,
            feature(VIRTIO_F_MMIO_MSI) | feature(VIRTIO_F_MMIO_NOTIFY),
            mem.clone(),
            log.clone(),
        );
        let queues = state.queue_count();
        let line = LegacyLine {
            irqfd: EventFd::new(EFD_NONBLOCK).map_err(VirtioError::Io)?,
            resample: EventFd::new(EFD_NONBLOCK).map_err(VirtioError::Io)?,
        };
        routes.bind_pin(at.gsi, &line.irqfd, Some(&line.resample))?;
        // One vector per queue and one for configuration changes.
        let msi = MsiVectors::new(routes, queues + 1, log.clone(), signaller)?;
        let interrupts = Arc::new(Interrupts::new(
            queues,
            Some(line),
            Some(Arc::new(msi)),
            log.clone(),
        ));
        let events = QueueEvents::new(ioevents, queues, log.clone()).map_err(VirtioError::Io)?;
        let (address_doorbells, now) = doorbells(&at, queues);
        events.register(&now).map_err(VirtioError::kvm(
            "register a virtio-mmio doorbell ioeventfd",
        ))?;
        let (core, worker) = TransportCore::start(
            format!("virtio-mmio@{:#x}", at.base),
            state,
            device.work,
            interrupts,
            events,
            // A platform device: no Bus Master Enable gates it.
            DmaContext::platform(mem),
            log,
        )?;
        Ok((
            MmioTransport {
                core,
                address_doorbells,
                staging: Mutex::new(MsiStaging::default()),
                msi_control: AtomicU32::new(0),
                phase: Mutex::default(),
            },
            worker,
        ))
    }

    fn msi(&self) -> &MsiVectors {
        self.core
            .interrupts
            .msi()
            .expect("virtio-mmio always has MSI vectors")
    }

    /// What a reset puts back besides the common state: the extension's registers and
    /// doorbells, the interrupt state.
    fn after_reset(&self) {
        self.place_address_doorbells(false);
        self.core.interrupts.reset();
        self.msi().reset();
        self.msi_control.store(0, Ordering::SeqCst);
        *self.staging.lock().unwrap() = MsiStaging::default();
    }
}

/// The part of a device window an access lands in.
enum Window {
    /// A control register, accessed 32 bits wide and aligned (virtio 1.2 §4.2.2.2).
    Register(u32),
    /// A control-register offset accessed with the wrong width or alignment.
    BadAccess,
    /// Device configuration, at this offset into it.
    Config(u64),
    /// The doorbell page, at this offset from the device base.
    Doorbell(u64),
}

/// Where an access of `len` bytes at `offset` of the window lands.
fn window(offset: u64, len: usize) -> Window {
    let config = u64::from(VIRTIO_MMIO_CONFIG);
    let doorbells = u64::from(VIRTIO_MMIO_DOORBELL_BASE);
    match offset {
        o if o >= doorbells => Window::Doorbell(o),
        o if o >= config => Window::Config(o - config),
        o => match u32::try_from(o) {
            Ok(reg) if len == 4 && reg.is_multiple_of(4) => Window::Register(reg),
            _ => Window::BadAccess,
        },
    }
}

impl BusDevice for MmioTransport {
    fn read(&self, offset: u64, data: &mut [u8]) {
        match window(offset, data.len()) {
            Window::Register(reg) => data.copy_from_slice(&self.read_register(reg).to_le_bytes()),
            Window::Config(at) => self.core.state.lock().unwrap().read_config(at, data),
            Window::Doorbell(_) => data.fill(0),
            Window::BadAccess => {
                guest_error!(
                    self.core.log,
                    "virtio-mmio: {}-byte read at {offset:#x}: registers are 32-bit aligned; reads zero",
                    data.len()
                );
                data.fill(0);
            }
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        match window(offset, data.len()) {
            Window::Register(reg) => {
                let value = u32::from_le_bytes(data.try_into().expect("checked: 4 bytes"));
                self.write_register(reg, value);
            }
            Window::Config(at) => self.core.state.lock().unwrap().write_config(at, data),
            Window::Doorbell(at) => self.doorbell(at),
            Window::BadAccess => guest_error!(
                self.core.log,
                "{}-byte write at {offset:#x}: registers are 32-bit aligned; ignored",
                data.len()
            ),
        }
    }
}
