//! Modern virtio-pci (virtio 1.2 §4.1): the common, notify, ISR and device configuration
//! structures in BAR 0, found through vendor capabilities (`capabilities`), and MSI-X (PCI 3.0
//! §6.8.2) with its table and pending-bit array in the same BAR. The function lives in the
//! foundation's PCI model, so its configuration space is the same bytes for CF8/CFC, trapped
//! ECAM and the ECAM shadow.
//!
//! Every queue has its own notify address (`notify_off_multiplier` = 4), so a doorbell can be an
//! address-only ioeventfd. The ioeventfds follow BAR 0 as the root places it on the bus: they
//! are registered where it decodes and removed while it does not (decoding off, or a BAR moved
//! onto another range, which the root refuses).

mod capabilities;
mod cfg_access;
mod common_cfg;
mod persist;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use cfg_access::PciCfgWindow;

use crate::dma::DmaContext;
use crate::guest_error;
use crate::irq::{MsiChange, MsiVectors};

use crate::pci::config::{ConfigSpace, FunctionLayout, touches};
use crate::pci::function::PciFunction;
use crate::pci::msix::Msix;
use crate::pci::regs::{PCI_COMMAND, PCI_COMMAND_MASTER, PCI_MSIX_ENTRY_SIZE};
use crate::persist::StateError;
use crate::virtio::interrupt::Interrupts;
use crate::virtio::notify::{Datamatch, Doorbell, NotifyPath, QueueEvents};
use crate::virtio::regs::{
    VIRTIO_F_ACCESS_PLATFORM, VIRTIO_PCI_BAR_COMMON, VIRTIO_PCI_BAR_DEVICE, VIRTIO_PCI_BAR_ISR,
    VIRTIO_PCI_BAR_MSIX_PBA, VIRTIO_PCI_BAR_MSIX_TABLE, VIRTIO_PCI_BAR_NOTIFY,
    VIRTIO_PCI_NOTIFY_MULTIPLIER,
};
use crate::virtio::state::VirtioState;
use crate::virtio::transport::persist::Phase;
use crate::virtio::transport::{TransportCore, TransportEnv};
use crate::virtio::worker::{Command, Worker};
use crate::virtio::{DeviceParts, VirtioError};

/// Largest MSI-X table that fits between the table and PBA offsets of BAR 0.
pub const MAX_VECTORS: usize =
    ((VIRTIO_PCI_BAR_MSIX_PBA - VIRTIO_PCI_BAR_MSIX_TABLE) / PCI_MSIX_ENTRY_SIZE) as usize;

/// A virtio device behind a PCI function.
pub struct VirtioPci {
    /// The registers, the device thread, DMA, interrupts and doorbells.
    core: TransportCore,
    notify: NotifyPath,
    msix: Msix,
    /// The PCI configuration access capability's window into BAR 0.
    pci_cfg: PciCfgWindow,
    /// Where BAR 0 decodes and the doorbell ioeventfds are registered, if it does.
    doorbells_at: Option<u64>,
    /// Where it is in a snapshot's life.
    phase: Phase,
}

impl VirtioPci {
    /// `device` as the virtio-pci function `requester_id` (bus << 8 | devfn) with `vectors`
    /// MSI-X vectors (at most [`MAX_VECTORS`]), doorbells on `notify`, and its device thread.
    /// Behind the environment's IOMMU, if any, it offers VIRTIO_F_ACCESS_PLATFORM (and never
    /// indirect descriptors, whose tables it would read untranslated).
    pub fn new(
        env: TransportEnv,
        device: DeviceParts,
        requester_id: u16,
        vectors: usize,
        notify: NotifyPath,
    ) -> Result<(Self, Worker), VirtioError> {
        let TransportEnv {
            ioevents,
            routes,
            mem,
            iommu,
            log,
        } = env;
        let mut dma = DmaContext::pci(mem.clone(), requester_id);
        let mut features = 0;
        let signaller = device.work.signaller();
        // A vhost-user backend reaches guest RAM untranslated (wiring refuses one behind the
        // IOMMU; without ACCESS_PLATFORM the driver gives it guest-physical addresses).
        if let Some(iommu) = iommu.filter(|_| device.work.translatable()) {
            dma = dma.behind(iommu);
            features |= 1 << VIRTIO_F_ACCESS_PLATFORM;
        }
        let state = VirtioState::new(device.device, features, mem, log.clone());
        let queues = state.queue_count();
        let vectors = vectors.clamp(1, MAX_VECTORS);
        let msi = Arc::new(MsiVectors::new(routes, vectors, log.clone(), signaller)?);
        // The command register resets to 0: no messages until the driver sets Bus Master.
        msi.update(&[MsiChange::BusMaster(false)]);
        let interrupts = Arc::new(Interrupts::new(
            queues,
            None,
            Some(msi.clone()),
            log.clone(),
        ));
        // The function has no INTx: its notifications always go to its MSI-X vectors, which
        // hold them pending while MSI-X is disabled and send them at Enable.
        interrupts.set_msi_active(true);
        let events = QueueEvents::new(ioevents, queues, log.clone()).map_err(VirtioError::Io)?;
        let (core, worker) = TransportCore::start(
            "virtio-pci".into(),
            state,
            device.work,
            interrupts,
            events,
            dma,
            log,
        )?;
        Ok((
            VirtioPci {
                core,
                notify,
                msix: Msix::new(msi),
                pci_cfg: PciCfgWindow::default(),
                doorbells_at: None,
                phase: Phase::default(),
            },
            worker,
        ))
    }

    /// Its configuration layout, with class code `class_code`: the one [`VirtioPci::layout`]
    /// gives for its device type, queues and MSI-X vectors.
    pub fn config_layout(&self, class_code: u32) -> FunctionLayout {
        let st = self.core.state.lock().unwrap();
        Self::layout(
            st.device_type(),
            class_code,
            st.queue_count(),
            self.msi().len(),
        )
    }

    /// The function's MSI-X vectors.
    pub fn msi(&self) -> &Arc<MsiVectors> {
        self.msix.vectors()
    }

    /// Register the doorbell ioeventfds where BAR 0 decodes now, `at` (none while it does not
    /// decode: they would catch writes meant for whatever is there instead).
    fn place_doorbells(&mut self, at: Option<u64>) {
        if at == self.doorbells_at || self.notify == NotifyPath::Exit {
            return;
        }
        self.doorbells_at = at;
        let queues = self.core.state.lock().unwrap().queue_count();
        let doorbells: Vec<Doorbell> = match at {
            None => Vec::new(),
            Some(base) => (0..queues)
                .map(|q| Doorbell {
                    queue: q,
                    address: base
                        + u64::from(VIRTIO_PCI_BAR_NOTIFY)
                        + q as u64 * u64::from(VIRTIO_PCI_NOTIFY_MULTIPLIER),
                    // A queue index fits the 16-bit notification data (virtio 1.2 §4.1.5.2).
                    #[allow(clippy::cast_possible_truncation)]
                    datamatch: (self.notify == NotifyPath::Datamatch)
                        .then_some(Datamatch::U16(q as u16)),
                })
                .collect(),
        };
        if let Err(e) = self.core.events.register(&doorbells) {
            // The doorbells still work, through exits; none may stay half-registered.
            self.core
                .log
                .warn(format_args!("cannot register doorbell ioeventfds: {e}"));
            self.core.events.unregister_all();
            self.doorbells_at = None;
        }
    }

    /// Bus Master Enable changed or was written (PCI 3.0 §6.2.2): without it the function
    /// does no DMA (the device thread leaves the rings alone) and sends no MSI-X message (held
    /// pending); when it is set again the queues are looked at and pending messages sent.
    fn set_bus_master(&mut self, enabled: bool) {
        if self.core.dma.bus_master().enabled() == enabled {
            return;
        }
        self.core.dma.bus_master().set(enabled);
        self.msi().update(&[MsiChange::BusMaster(enabled)]);
        if enabled {
            self.core.worker.send(Command::KickAll);
        } else {
            // The device thread may be past the gate in a ring walk: the guest's write
            // completes only once that work is done (the call logs if it takes too long).
            let _ = self.core.worker.sync();
        }
    }

    /// What a virtio reset puts back besides the common state. It leaves the PCI function's
    /// MSI-X table, masks and enable alone, but no message the device raised before it may
    /// arrive after it (virtio 1.2 §2.4), on whatever the vector is used for next.
    fn after_reset(&self) {
        self.core.interrupts.reset();
        self.msi().clear_pending();
        self.core.interrupts.set_msi_active(true);
    }
}

/// The structure of BAR 0 an offset falls in, as (its start, the offset into it): exitless's
/// layout, which the capabilities describe to the driver.
fn region(offset: u64) -> Option<(u32, u32)> {
    let offset = u32::try_from(offset).ok()?;
    let starts = [
        VIRTIO_PCI_BAR_COMMON,
        VIRTIO_PCI_BAR_ISR,
        VIRTIO_PCI_BAR_DEVICE,
        VIRTIO_PCI_BAR_NOTIFY,
        VIRTIO_PCI_BAR_MSIX_TABLE,
        VIRTIO_PCI_BAR_MSIX_PBA,
    ];
    let start = *starts.iter().rev().find(|&&s| offset >= s)?;
    Some((start, offset - start))
}

/// The little-endian value of a write of up to 4 bytes.
fn le_value(data: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    let n = data.len().min(4);
    b[..n].copy_from_slice(&data[..n]);
    u32::from_le_bytes(b)
}

impl PciFunction for VirtioPci {
    fn attached(&mut self, config: &ConfigSpace) {
        self.msix.attached(config);
        self.pci_cfg.attached(config);
    }

    fn bar_decoded(&mut self, _config: &ConfigSpace, bar: usize, at: Option<u64>) {
        if bar == 0 {
            self.place_doorbells(at);
        }
    }

    fn read_hooked(&self) -> Option<std::ops::Range<u16>> {
        self.pci_cfg.read_hooked()
    }

    fn config_read(&mut self, config: &ConfigSpace, _offset: u16, _len: usize) {
        // The root calls this only for reads touching pci_cfg_data.
        if let Some((access, data_at)) = self.pci_cfg.access(config, &self.core.log) {
            let mut bytes = [0u8; 4];
            let bytes = &mut bytes[..access.len];
            self.bar_read(config, access.bar, access.offset, bytes);
            config.set_bytes(data_at, bytes);
        }
    }

    fn config_written(&mut self, config: &ConfigSpace, offset: u16, len: usize) {
        if touches(offset, len, PCI_COMMAND, 2) {
            self.set_bus_master(config.get_u16(PCI_COMMAND) & PCI_COMMAND_MASTER != 0);
        }
        if let Some((access, data)) = self.pci_cfg.written(config, offset, len, &self.core.log) {
            self.bar_write(config, access.bar, access.offset, &data[..access.len]);
        }
        self.msix.config_written(config, offset, len);
    }

    fn bar_read(&mut self, _config: &ConfigSpace, bar: usize, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Some((start, rel)) = region(offset).filter(|_| bar == 0) else {
            return;
        };
        match start {
            VIRTIO_PCI_BAR_COMMON => match self.common_read(rel, data.len()) {
                Some(v) => data.copy_from_slice(&v.to_le_bytes()[..data.len()]),
                None => guest_error!(
                    self.core.log,
                    "{}-byte read at common config {rel:#x} is not a field; reads zero",
                    data.len()
                ),
            },
            // The ISR status is one byte (virtio 1.2 §4.1.4.5).
            #[allow(clippy::cast_possible_truncation)]
            VIRTIO_PCI_BAR_ISR if rel == 0 => data[0] = self.core.interrupts.take_status() as u8,
            VIRTIO_PCI_BAR_DEVICE => self
                .core
                .state
                .lock()
                .unwrap()
                .read_config(u64::from(rel), data),
            VIRTIO_PCI_BAR_MSIX_TABLE => self.msix.table_read(u64::from(rel), data),
            VIRTIO_PCI_BAR_MSIX_PBA => self.msix.pba_read(u64::from(rel), data),
            _ => {}
        }
    }

    fn bar_write(&mut self, _config: &ConfigSpace, bar: usize, offset: u64, data: &[u8]) {
        let Some((start, rel)) = region(offset).filter(|_| bar == 0) else {
            return;
        };
        match start {
            VIRTIO_PCI_BAR_COMMON => {
                if !self.common_write(rel, data.len(), le_value(data)) {
                    guest_error!(
                        self.core.log,
                        "{}-byte write at common config {rel:#x} is not a writable field; ignored",
                        data.len()
                    );
                }
            }
            VIRTIO_PCI_BAR_DEVICE => self
                .core
                .state
                .lock()
                .unwrap()
                .write_config(u64::from(rel), data),
            VIRTIO_PCI_BAR_NOTIFY => self
                .core
                .events
                .notify((rel / VIRTIO_PCI_NOTIFY_MULTIPLIER) as usize),
            VIRTIO_PCI_BAR_MSIX_TABLE => self.msix.table_write(u64::from(rel), data),
            VIRTIO_PCI_BAR_MSIX_PBA => self.msix.pba_write(u64::from(rel), data),
            _ => guest_error!(
                self.core.log,
                "{}-byte write at BAR 0 offset {offset:#x} ignored",
                data.len()
            ),
        }
    }

    fn pause(&mut self) -> Result<(), StateError> {
        self.snapshot_pause()
    }

    fn save(&self) -> Result<Option<serde_json::Value>, StateError> {
        self.snapshot_save()
    }

    fn restore(
        &mut self,
        what: &str,
        config: &ConfigSpace,
        state: Option<serde_json::Value>,
    ) -> Result<(), StateError> {
        self.snapshot_restore(what, config, state)
    }

    fn resume(&mut self) {
        self.snapshot_resume();
    }
}
