//! Modern virtio-pci (virtio 1.2 §4.1): the common, notify, ISR and device configuration
//! structures in BAR 0, found through vendor capabilities, and MSI-X (PCI 3.0 §6.8.2) with its
//! table and pending-bit array in the same BAR. The function lives in the foundation's PCI
//! model, so its configuration space is the same bytes for CF8/CFC, trapped ECAM and the ECAM
//! shadow.
//!
//! Every queue has its own notify address (`notify_off_multiplier` = 4), so a doorbell can be an
//! address-only ioeventfd. The ioeventfds follow BAR 0: they are registered where the BAR
//! decodes and removed while memory decoding is off.

// Common-configuration fields are 8, 16 or 32 bits wide: a value is cut to its field's width,
// as the hardware register would cut it.
#![allow(clippy::cast_possible_truncation)]

use std::sync::{Arc, Mutex};

use virtio_queue::QueueT;
use vm_memory::GuestMemoryMmap;

use super::device::{Notification, StatusChange, VirtioState};
use super::interrupt::Interrupts;
use super::notify::{Datamatch, Doorbell, IoEventRegistrar, NotifyPath, QueueEvents};
use super::regs::*;
use super::worker::{Command, Worker, WorkerHandle};
use super::{DeviceParts, Ring, VirtioError, set_queue_address, spawn_worker, write_status};
use crate::dma::DmaContext;
use crate::irq::{InterruptRoutes, MsiChange, MsiVectors};
use crate::pci::config::{Bar, Capability, ConfigSpace, FunctionLayout};
use crate::pci::function::PciFunction;
use crate::pci::regs::*;

/// BAR 0 as declared.
const BAR0: Bar = Bar::Memory64 {
    size: VIRTIO_PCI_BAR_SIZE as u64,
    prefetchable: false,
};
/// Largest MSI-X table that fits between the table and PBA offsets of BAR 0.
pub const MAX_VECTORS: usize =
    ((VIRTIO_PCI_BAR_MSIX_PBA - VIRTIO_PCI_BAR_MSIX_TABLE) / PCI_MSIX_ENTRY_SIZE) as usize;

/// A virtio device behind a PCI function.
pub struct VirtioPci {
    state: Mutex<VirtioState>,
    worker: WorkerHandle,
    dma: DmaContext,
    interrupts: Arc<Interrupts>,
    events: QueueEvents,
    notify: NotifyPath,
    /// Address low, address high, data of each MSI-X entry as the guest wrote them; the mask
    /// bit lives in the [`MsiVectors`].
    msix_table: Vec<[u32; 3]>,
    msix_cap: Option<u16>,
    msix_enabled: bool,
    doorbells_at: Option<u64>,
}

/// A virtio_pci_cap (virtio 1.2 §4.1.4) of `cfg_type` over `offset..offset + length` of BAR 0,
/// with `extra` bytes appended (the notify multiplier).
fn virtio_cap(cfg_type: u32, offset: u32, length: u32, extra: &[u8]) -> Capability {
    let cap_len = 16 + extra.len() as u8;
    let mut body = vec![cap_len, cfg_type as u8, 0, 0, 0, 0];
    body.extend_from_slice(&offset.to_le_bytes());
    body.extend_from_slice(&length.to_le_bytes());
    body.extend_from_slice(extra);
    Capability {
        id: PCI_CAP_ID_VNDR,
        body,
        body_wmask: Vec::new(),
    }
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
        let table_size = u16::try_from(vectors.clamp(1, MAX_VECTORS) - 1).expect("≤ 2048 vectors");
        let mut msix = table_size.to_le_bytes().to_vec();
        msix.extend_from_slice(&VIRTIO_PCI_BAR_MSIX_TABLE.to_le_bytes()); // BIR 0
        msix.extend_from_slice(&VIRTIO_PCI_BAR_MSIX_PBA.to_le_bytes());
        let notify_len = queues as u32 * VIRTIO_PCI_NOTIFY_MULTIPLIER;
        FunctionLayout {
            vendor_id: VIRTIO_PCI_VENDOR_ID as u16,
            device_id: (VIRTIO_PCI_DEVICE_ID_BASE + device_type) as u16,
            class_code,
            revision: 1, // modern devices have revision ≥ 1 (virtio 1.2 §4.1.2.1)
            bars: vec![BAR0],
            capabilities: vec![
                virtio_cap(
                    VIRTIO_PCI_CAP_COMMON_CFG,
                    VIRTIO_PCI_BAR_COMMON,
                    VIRTIO_PCI_COMMON_SIZE,
                    &[],
                ),
                virtio_cap(
                    VIRTIO_PCI_CAP_NOTIFY_CFG,
                    VIRTIO_PCI_BAR_NOTIFY,
                    notify_len,
                    &VIRTIO_PCI_NOTIFY_MULTIPLIER.to_le_bytes(),
                ),
                virtio_cap(VIRTIO_PCI_CAP_ISR_CFG, VIRTIO_PCI_BAR_ISR, 1, &[]),
                virtio_cap(
                    VIRTIO_PCI_CAP_DEVICE_CFG,
                    VIRTIO_PCI_BAR_DEVICE,
                    0x1000,
                    &[],
                ),
                Capability {
                    id: PCI_CAP_ID_MSIX,
                    body: msix,
                    // Message Control: Enable and Function Mask are writable.
                    body_wmask: ((PCI_MSIX_FLAGS_ENABLE | PCI_MSIX_FLAGS_MASKALL).to_le_bytes())
                        .to_vec(),
                },
            ],
            ..Default::default()
        }
    }

    /// `device` as the virtio-pci function `requester_id` (bus << 8 | devfn) with `vectors`
    /// MSI-X vectors (at most [`MAX_VECTORS`]), doorbells on `notify`, and its device thread.
    pub fn new(
        ioevents: Arc<dyn IoEventRegistrar>,
        routing: Arc<dyn InterruptRoutes>,
        device: DeviceParts,
        mem: GuestMemoryMmap,
        requester_id: u16,
        vectors: usize,
        notify: NotifyPath,
    ) -> Result<(Self, Worker), VirtioError> {
        let state = VirtioState::new(device.device, 0, mem.clone());
        let queues = state.queue_count();
        let vectors = vectors.clamp(1, MAX_VECTORS);
        let msi = MsiVectors::new(routing, vectors)?;
        // The command register resets to 0: no messages until the driver sets Bus Master.
        msi.update(&[MsiChange::BusMaster(false)]);
        let interrupts = Arc::new(Interrupts::new(queues, None, Some(Arc::new(msi))));
        let events = QueueEvents::new(ioevents, queues).map_err(VirtioError::Io)?;
        let worker = spawn_worker(
            "virtio-pci".into(),
            &state,
            device.queues,
            &interrupts,
            &events,
        )?;
        Ok((
            VirtioPci {
                state: Mutex::new(state),
                worker: worker.handle(),
                dma: DmaContext::pci(mem, requester_id),
                interrupts,
                events,
                notify,
                msix_table: vec![[0; 3]; vectors],
                msix_cap: None,
                msix_enabled: false,
                doorbells_at: None,
            },
            worker,
        ))
    }

    /// The function's MSI-X vectors.
    pub fn msi(&self) -> &Arc<MsiVectors> {
        self.interrupts
            .msi()
            .expect("virtio-pci always has MSI-X vectors")
    }

    /// Register the doorbell ioeventfds where BAR 0 decodes now (none while decoding is off).
    fn place_doorbells(&mut self, config: &ConfigSpace) {
        let decoding = config.get_u16(PCI_COMMAND) & PCI_COMMAND_MEMORY != 0;
        let at = decoding.then(|| config.bar_address(0, &BAR0));
        if at == self.doorbells_at || self.notify == NotifyPath::Exit {
            return;
        }
        self.doorbells_at = at;
        let queues = self.state.lock().unwrap().queue_count();
        let doorbells: Vec<Doorbell> = match at {
            None => Vec::new(),
            Some(base) => (0..queues)
                .map(|q| Doorbell {
                    queue: q,
                    address: base
                        + u64::from(VIRTIO_PCI_BAR_NOTIFY)
                        + q as u64 * u64::from(VIRTIO_PCI_NOTIFY_MULTIPLIER),
                    datamatch: (self.notify == NotifyPath::Datamatch)
                        .then_some(Datamatch::U16(q as u16)),
                })
                .collect(),
        };
        if let Err(e) = self.events.register(&doorbells) {
            // The doorbells still work, through exits.
            warn_ratelimited!("virtio-pci: cannot register doorbell ioeventfds: {e}");
            self.doorbells_at = None;
        }
    }

    /// Bus Master Enable changed or was written (PCI 3.0 §6.2.2): without it the function
    /// does no DMA (the device thread leaves the rings alone) and sends no MSI-X message (held
    /// pending); when it is set again the queues are looked at and pending messages sent.
    fn set_bus_master(&mut self, enabled: bool) {
        if self.dma.bus_master().enabled() == enabled {
            return;
        }
        self.dma.bus_master().set(enabled);
        self.msi().update(&[MsiChange::BusMaster(enabled)]);
        if enabled {
            self.worker.send(Command::KickAll);
        }
    }

    fn find_msix_cap(config: &ConfigSpace) -> Option<u16> {
        let mut ptr = u16::from(config.get_u8(PCI_CAPABILITY_LIST));
        for _ in 0..48 {
            if ptr < 0x40 {
                return None;
            }
            if config.get_u8(ptr) == PCI_CAP_ID_MSIX {
                return Some(ptr);
            }
            ptr = u16::from(config.get_u8(ptr + 1) & 0xfc);
        }
        None
    }

    fn common_read(&self, offset: u32, len: usize) -> Option<u32> {
        let st = self.state.lock().unwrap();
        let queue = st.selected_queue();
        let sel = st.queue_select as usize;
        Some(match (offset, len) {
            (VIRTIO_PCI_COMMON_DFSELECT, 4) => st.device_features_select,
            (VIRTIO_PCI_COMMON_DF, 4) => st.device_features_word(),
            (VIRTIO_PCI_COMMON_GFSELECT, 4) => st.driver_features_select,
            (VIRTIO_PCI_COMMON_GF, 4) => st.driver_features_word(),
            (VIRTIO_PCI_COMMON_MSIX, 2) => u32::from(self.interrupts.config_vector()),
            (VIRTIO_PCI_COMMON_NUMQ, 2) => st.queue_count() as u32,
            (VIRTIO_PCI_COMMON_STATUS, 1) => st.status(),
            (VIRTIO_PCI_COMMON_CFGGENERATION, 1) => st.config_generation() & 0xff,
            (VIRTIO_PCI_COMMON_Q_SELECT, 2) => st.queue_select,
            (VIRTIO_PCI_COMMON_Q_SIZE, 2) => queue.map_or(0, |q| u32::from(q.size())),
            (VIRTIO_PCI_COMMON_Q_MSIX, 2) => u32::from(self.interrupts.queue_vector(sel)),
            (VIRTIO_PCI_COMMON_Q_ENABLE, 2) => queue.map_or(0, |q| u32::from(q.ready())),
            (VIRTIO_PCI_COMMON_Q_NOFF, 2) => queue.map_or(0, |_| st.queue_select),
            (VIRTIO_PCI_COMMON_Q_DESCLO..=VIRTIO_PCI_COMMON_Q_USEDHI, 4)
                if offset.is_multiple_of(4) =>
            {
                let q = queue?;
                let rel = offset - VIRTIO_PCI_COMMON_Q_DESCLO;
                let addr = [q.desc_table(), q.avail_ring(), q.used_ring()][(rel / 8) as usize];
                if rel % 8 == 4 {
                    (addr >> 32) as u32
                } else {
                    addr as u32
                }
            }
            _ => return None,
        })
    }

    fn common_write(&mut self, offset: u32, len: usize, value: u32) -> bool {
        let mut st = self.state.lock().unwrap();
        let mut config_changed = false;
        match (offset, len) {
            (VIRTIO_PCI_COMMON_DFSELECT, 4) => st.device_features_select = value,
            (VIRTIO_PCI_COMMON_GFSELECT, 4) => st.driver_features_select = value,
            (VIRTIO_PCI_COMMON_GF, 4) => st.write_driver_features(value),
            (VIRTIO_PCI_COMMON_MSIX, 2) => {
                self.interrupts.set_config_vector(value as u16);
            }
            (VIRTIO_PCI_COMMON_STATUS, 1) => {
                if write_status(&mut st, &self.worker, &self.dma, value) == StatusChange::Reset {
                    // A virtio reset leaves the PCI function's MSI-X state alone.
                    self.interrupts.reset();
                    self.interrupts.set_msi_active(self.msix_enabled);
                }
            }
            (VIRTIO_PCI_COMMON_Q_SELECT, 2) => st.queue_select = value,
            (VIRTIO_PCI_COMMON_Q_SIZE, 2) => config_changed = st.set_queue_size(value),
            (VIRTIO_PCI_COMMON_Q_MSIX, 2) => {
                self.interrupts
                    .set_queue_vector(st.queue_select as usize, value as u16);
            }
            (VIRTIO_PCI_COMMON_Q_ENABLE, 2) => {
                if value == 1 {
                    config_changed = st.set_queue_ready();
                } else {
                    warn_ratelimited!(
                        "virtio-pci: queue_enable written with {value} (only 1 is allowed); ignored"
                    );
                }
            }
            (VIRTIO_PCI_COMMON_Q_DESCLO..=VIRTIO_PCI_COMMON_Q_USEDHI, 4)
                if offset.is_multiple_of(4) =>
            {
                let rel = offset - VIRTIO_PCI_COMMON_Q_DESCLO;
                let ring = [Ring::Descriptors, Ring::Driver, Ring::Device][(rel / 8) as usize];
                set_queue_address(&mut st, ring, rel % 8 == 4, value);
            }
            _ => return false,
        }
        drop(st);
        if config_changed {
            self.interrupts.notify(Notification::Config);
        }
        true
    }

    fn msix_read(&self, offset: u32) -> u32 {
        let (entry, field) = (
            (offset / PCI_MSIX_ENTRY_SIZE) as usize,
            offset % PCI_MSIX_ENTRY_SIZE,
        );
        match (self.msix_table.get(entry), field) {
            (Some(_), PCI_MSIX_ENTRY_VECTOR_CTRL) => u32::from(self.msi().is_masked(entry)),
            (Some(e), f) => e[(f / 4) as usize],
            (None, _) => 0,
        }
    }

    fn msix_write(&mut self, offset: u32, value: u32) {
        let (entry, field) = (
            (offset / PCI_MSIX_ENTRY_SIZE) as usize,
            offset % PCI_MSIX_ENTRY_SIZE,
        );
        let Some(e) = self.msix_table.get_mut(entry) else {
            warn_ratelimited!("virtio-pci: MSI-X entry {entry} does not exist; write ignored");
            return;
        };
        if field == PCI_MSIX_ENTRY_VECTOR_CTRL {
            let masked = value & PCI_MSIX_ENTRY_CTRL_MASKBIT != 0;
            let mask = MsiChange::Mask {
                index: entry,
                masked,
            };
            if masked {
                self.msi().update(&[mask]);
            } else {
                // The entry is complete when software unmasks it (PCI 3.0 §6.8.2.9).
                self.msi().update(&[self.entry_message(entry), mask]);
            }
            return;
        }
        e[(field / 4) as usize] = value;
        // Software should mask an entry before changing it (individually or with Function
        // Mask); if it did not, the data write is the last of the three (Linux's order), so the
        // pair takes effect then and never half. While MSI-X is disabled the table is not in
        // use: Enable takes every unmasked entry as it then is.
        if field == PCI_MSIX_ENTRY_DATA
            && self.msix_enabled
            && !self.msi().is_masked(entry)
            && !self.msi().is_function_masked()
        {
            self.msi().update(&[self.entry_message(entry)]);
        }
    }

    /// The message of MSI-X entry `entry` as the guest wrote it.
    fn entry_message(&self, entry: usize) -> MsiChange {
        let [lo, hi, data] = self.msix_table[entry];
        MsiChange::Program {
            index: entry,
            address: u64::from(hi) << 32 | u64::from(lo),
            data,
        }
    }

    fn pba_read(&self, offset: u32, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            let first = (offset as usize + i) * 8;
            *byte = (0..8).fold(0u8, |b, bit| {
                b | (u8::from(self.msi().is_pending(first + bit)) << bit)
            });
        }
    }
}

/// Regions of BAR 0.
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

fn le_value(data: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    let n = data.len().min(4);
    b[..n].copy_from_slice(&data[..n]);
    u32::from_le_bytes(b)
}

impl PciFunction for VirtioPci {
    fn attached(&mut self, config: &ConfigSpace) {
        self.msix_cap = Self::find_msix_cap(config);
        self.place_doorbells(config);
    }

    fn config_written(&mut self, config: &ConfigSpace, offset: u16, len: usize) {
        let touches = |start: u16, size: u16| offset < start + size && start < offset + len as u16;
        if touches(PCI_COMMAND, 2) || touches(PCI_BAR0, 8) {
            self.place_doorbells(config);
        }
        if touches(PCI_COMMAND, 2) {
            self.set_bus_master(config.get_u16(PCI_COMMAND) & PCI_COMMAND_MASTER != 0);
        }
        if let Some(cap) = self.msix_cap
            && touches(cap + PCI_MSIX_FLAGS, 2)
        {
            let control = config.get_u16(cap + PCI_MSIX_FLAGS);
            self.msix_enabled = control & PCI_MSIX_FLAGS_ENABLE != 0;
            let function_masked = control & PCI_MSIX_FLAGS_MASKALL != 0;
            let mut changes = vec![
                MsiChange::FunctionMask(function_masked),
                MsiChange::Enable(self.msix_enabled),
            ];
            // Entries software changed while the function was disabled or masked take effect
            // now, all in this one access: one routing commit when batched.
            if self.msix_enabled && !function_masked {
                changes.extend(
                    (0..self.msix_table.len())
                        .filter(|&i| !self.msi().is_masked(i))
                        .map(|i| self.entry_message(i)),
                );
            }
            self.msi().update(&changes);
            self.interrupts.set_msi_active(self.msix_enabled);
        }
    }

    fn bar_read(&mut self, _config: &ConfigSpace, bar: usize, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Some((start, rel)) = region(offset).filter(|_| bar == 0) else {
            return;
        };
        match start {
            VIRTIO_PCI_BAR_COMMON => match self.common_read(rel, data.len()) {
                Some(v) => data.copy_from_slice(&v.to_le_bytes()[..data.len()]),
                None => warn_ratelimited!(
                    "virtio-pci: {}-byte read at common config {rel:#x} is not a field; reads zero",
                    data.len()
                ),
            },
            VIRTIO_PCI_BAR_ISR if rel == 0 => data[0] = self.interrupts.take_status() as u8,
            VIRTIO_PCI_BAR_DEVICE => self.state.lock().unwrap().read_config(u64::from(rel), data),
            VIRTIO_PCI_BAR_MSIX_TABLE if data.len() == 4 && rel % 4 == 0 => {
                data.copy_from_slice(&self.msix_read(rel).to_le_bytes())
            }
            VIRTIO_PCI_BAR_MSIX_PBA => self.pba_read(rel, data),
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
                    warn_ratelimited!(
                        "virtio-pci: {}-byte write at common config {rel:#x} is not a writable field; ignored",
                        data.len()
                    );
                }
            }
            VIRTIO_PCI_BAR_DEVICE => self
                .state
                .lock()
                .unwrap()
                .write_config(u64::from(rel), data),
            VIRTIO_PCI_BAR_NOTIFY => self
                .events
                .notify((rel / VIRTIO_PCI_NOTIFY_MULTIPLIER) as usize),
            VIRTIO_PCI_BAR_MSIX_TABLE if data.len() == 4 && rel % 4 == 0 => {
                self.msix_write(rel, le_value(data))
            }
            VIRTIO_PCI_BAR_MSIX_TABLE if data.len() == 8 && rel % 8 == 0 => {
                self.msix_write(rel, le_value(&data[..4]));
                self.msix_write(rel + 4, le_value(&data[4..]));
            }
            _ => warn_ratelimited!(
                "virtio-pci: {}-byte write at BAR 0 offset {offset:#x} ignored",
                data.len()
            ),
        }
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // fixtures
mod tests {
    use super::*;
    use crate::fakes::FakeIoEvents;
    use crate::pci::config::ConfigWindow;

    fn function(notify: NotifyPath) -> (VirtioPci, Worker, Arc<FakeIoEvents>) {
        let p = crate::virtio::test_parts();
        let (f, w) =
            VirtioPci::new(p.ioevents.clone(), p.routes, p.net, p.mem, 0x18, 3, notify).unwrap();
        (f, w, p.ioevents)
    }

    fn config() -> ConfigSpace {
        let window = Arc::new(ConfigWindow::new(1).unwrap());
        let layout = VirtioPci::layout(VIRTIO_ID_NET, 0x02_00_00, 2, 3);
        ConfigSpace::new(window, 0, &layout, &[0xc000_0000])
            .unwrap()
            .0
    }

    fn bar_read(f: &mut VirtioPci, c: &ConfigSpace, offset: u32, len: usize) -> u32 {
        let mut b = [0u8; 4];
        f.bar_read(c, 0, u64::from(offset), &mut b[..len]);
        u32::from_le_bytes(b)
    }

    fn bar_write(f: &mut VirtioPci, c: &ConfigSpace, offset: u32, len: usize, v: u32) {
        f.bar_write(c, 0, u64::from(offset), &v.to_le_bytes()[..len]);
    }

    #[test]
    fn capabilities_describe_bar0_and_msix() {
        let c = config();
        let mut ptr = u16::from(c.get_u8(PCI_CAPABILITY_LIST));
        let mut found = Vec::new();
        while ptr != 0 {
            let id = c.get_u8(ptr);
            if id == PCI_CAP_ID_VNDR {
                let cfg_type = u32::from(c.get_u8(ptr + VIRTIO_PCI_CAP_CFG_TYPE as u16));
                let offset = c.get_u32(ptr + VIRTIO_PCI_CAP_OFFSET as u16);
                found.push((cfg_type, offset));
                if cfg_type == VIRTIO_PCI_CAP_NOTIFY_CFG {
                    assert_eq!(c.get_u32(ptr + VIRTIO_PCI_NOTIFY_CAP_MULT as u16), 4);
                }
            } else {
                assert_eq!(id, PCI_CAP_ID_MSIX);
                assert_eq!(c.get_u16(ptr + PCI_MSIX_FLAGS) & PCI_MSIX_FLAGS_QSIZE, 2);
                assert_eq!(c.get_u32(ptr + PCI_MSIX_TABLE), VIRTIO_PCI_BAR_MSIX_TABLE);
                assert_eq!(c.get_u32(ptr + PCI_MSIX_PBA), VIRTIO_PCI_BAR_MSIX_PBA);
            }
            ptr = u16::from(c.get_u8(ptr + 1));
        }
        assert_eq!(
            found,
            vec![
                (VIRTIO_PCI_CAP_COMMON_CFG, VIRTIO_PCI_BAR_COMMON),
                (VIRTIO_PCI_CAP_NOTIFY_CFG, VIRTIO_PCI_BAR_NOTIFY),
                (VIRTIO_PCI_CAP_ISR_CFG, VIRTIO_PCI_BAR_ISR),
                (VIRTIO_PCI_CAP_DEVICE_CFG, VIRTIO_PCI_BAR_DEVICE),
            ]
        );
    }

    #[test]
    fn common_config_fields_have_their_width_and_queues_their_own_notify_offset() {
        let (mut f, _w, _vm) = function(NotifyPath::Exit);
        let c = config();
        assert_eq!(bar_read(&mut f, &c, VIRTIO_PCI_COMMON_NUMQ, 2), 2);
        assert_eq!(
            bar_read(&mut f, &c, VIRTIO_PCI_COMMON_NUMQ, 4),
            0,
            "wrong width"
        );
        assert_eq!(
            bar_read(&mut f, &c, VIRTIO_PCI_COMMON_NUMQ + 1, 1),
            0,
            "not a field"
        );
        bar_write(&mut f, &c, VIRTIO_PCI_COMMON_Q_SELECT, 2, 1);
        assert_eq!(bar_read(&mut f, &c, VIRTIO_PCI_COMMON_Q_NOFF, 2), 1);
        assert_eq!(bar_read(&mut f, &c, VIRTIO_PCI_COMMON_Q_SIZE, 2), 256);
        bar_write(&mut f, &c, VIRTIO_PCI_COMMON_Q_MSIX, 2, 7);
        assert_eq!(
            bar_read(&mut f, &c, VIRTIO_PCI_COMMON_Q_MSIX, 2),
            u32::from(VIRTIO_MSI_NO_VECTOR)
        );
        bar_write(&mut f, &c, VIRTIO_PCI_COMMON_Q_SELECT, 2, 9);
        assert_eq!(
            bar_read(&mut f, &c, VIRTIO_PCI_COMMON_Q_SIZE, 2),
            0,
            "no queue 9"
        );
        bar_write(&mut f, &c, VIRTIO_PCI_COMMON_Q_ENABLE, 2, 1); // ignored, no panic
        bar_write(&mut f, &c, VIRTIO_PCI_BAR_NOTIFY + 4 * 9, 2, 9); // no queue 9: ignored
    }

    #[test]
    fn msix_entries_out_of_range_or_invalid_are_dropped() {
        let (mut f, _w, _vm) = function(NotifyPath::Exit);
        let c = config();
        let entry =
            |i: u32, field: u32| VIRTIO_PCI_BAR_MSIX_TABLE + i * PCI_MSIX_ENTRY_SIZE + field;
        bar_write(&mut f, &c, entry(5, PCI_MSIX_ENTRY_DATA), 4, 0x41); // no entry 5
        assert_eq!(
            bar_read(&mut f, &c, entry(0, PCI_MSIX_ENTRY_VECTOR_CTRL), 4),
            1,
            "masked at reset"
        );
        // An address outside the interrupt window: kept in the table, never routed.
        bar_write(&mut f, &c, entry(0, PCI_MSIX_ENTRY_LOWER_ADDR), 4, 0x1000);
        bar_write(&mut f, &c, entry(0, PCI_MSIX_ENTRY_DATA), 4, 0x41);
        bar_write(&mut f, &c, entry(0, PCI_MSIX_ENTRY_VECTOR_CTRL), 4, 0);
        assert_eq!(
            bar_read(&mut f, &c, entry(0, PCI_MSIX_ENTRY_LOWER_ADDR), 4),
            0x1000
        );
        assert_eq!(f.msi().message(0), Some((0x1000, 0x41)));
        // Masked, a due message is pending, and the PBA shows it.
        bar_write(
            &mut f,
            &c,
            entry(1, PCI_MSIX_ENTRY_LOWER_ADDR),
            4,
            0xfee0_0000,
        );
        bar_write(&mut f, &c, entry(1, PCI_MSIX_ENTRY_DATA), 4, 0x42);
        f.msi().update(&[MsiChange::Enable(true)]);
        set_command(&mut f, &c, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);
        f.msi().trigger(1);
        assert_eq!(bar_read(&mut f, &c, VIRTIO_PCI_BAR_MSIX_PBA, 4), 0b10);
        bar_write(&mut f, &c, entry(1, PCI_MSIX_ENTRY_VECTOR_CTRL), 4, 0);
        assert_eq!(
            bar_read(&mut f, &c, VIRTIO_PCI_BAR_MSIX_PBA, 4),
            0,
            "sent at unmask"
        );
    }

    #[test]
    fn doorbell_ioeventfds_follow_bar0() {
        let (mut f, _w, _vm) = function(NotifyPath::Address);
        let c = config();
        let addresses = |f: &VirtioPci| {
            f.events
                .registered()
                .iter()
                .map(|d| d.address)
                .collect::<Vec<_>>()
        };
        assert!(
            addresses(&f).is_empty(),
            "nothing before the function is placed"
        );
        c.set_u16(PCI_COMMAND, PCI_COMMAND_MEMORY);
        f.attached(&c);
        let notify = u64::from(VIRTIO_PCI_BAR_NOTIFY);
        assert_eq!(
            addresses(&f),
            vec![0xc000_0000 + notify, 0xc000_0004 + notify]
        );
        assert!(f.events.registered().iter().all(|d| d.datamatch.is_none()));
        // Decoding off: no doorbell; BAR moved and decoding on: doorbells at the new place.
        c.write(PCI_COMMAND, &0u16.to_le_bytes());
        f.config_written(&c, PCI_COMMAND, 2);
        assert!(addresses(&f).is_empty());
        c.write(PCI_BAR0, &0xc100_0000u32.to_le_bytes());
        f.config_written(&c, PCI_BAR0, 4);
        assert!(addresses(&f).is_empty(), "still not decoding");
        c.write(PCI_COMMAND, &PCI_COMMAND_MEMORY.to_le_bytes());
        f.config_written(&c, PCI_COMMAND, 2);
        assert_eq!(
            addresses(&f),
            vec![0xc100_0000 + notify, 0xc100_0004 + notify]
        );
    }

    fn set_command(f: &mut VirtioPci, c: &ConfigSpace, command: u16) {
        c.set_u16(PCI_COMMAND, command);
        f.config_written(c, PCI_COMMAND, 2);
    }

    /// Defect: Bus Master Enable was ignored (PCI 3.0 §6.2.2): a function without it sent
    /// MSI-X messages.
    #[test]
    fn without_bus_master_enable_no_message_is_sent_until_it_is_set() {
        let (mut f, _w, _vm) = function(NotifyPath::Exit);
        let c = config();
        let entry = |field: u32| VIRTIO_PCI_BAR_MSIX_TABLE + field;
        bar_write(&mut f, &c, entry(PCI_MSIX_ENTRY_LOWER_ADDR), 4, 0xfee0_0000);
        bar_write(&mut f, &c, entry(PCI_MSIX_ENTRY_DATA), 4, 0x42);
        bar_write(&mut f, &c, entry(PCI_MSIX_ENTRY_VECTOR_CTRL), 4, 0);
        f.msi().update(&[MsiChange::Enable(true)]);
        set_command(&mut f, &c, PCI_COMMAND_MEMORY);
        f.msi().trigger(0);
        assert_eq!(
            bar_read(&mut f, &c, VIRTIO_PCI_BAR_MSIX_PBA, 4),
            1,
            "held pending while the function may not master"
        );
        set_command(&mut f, &c, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);
        assert_eq!(bar_read(&mut f, &c, VIRTIO_PCI_BAR_MSIX_PBA, 4), 0, "sent");
        assert!(f.dma.bus_master().enabled());
        set_command(&mut f, &c, PCI_COMMAND_MEMORY);
        assert!(!f.dma.bus_master().enabled(), "DMA is gated too");
    }
}
