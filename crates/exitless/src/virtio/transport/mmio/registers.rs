//! The virtio-mmio register file (virtio 1.2 §4.2.2, table "MMIO Device Register Layout"):
//! identification, feature negotiation, the selected queue, interrupt status and device
//! status. The extension's registers, in the reserved space between them, are handed to
//! `extension` once their feature is negotiated.

use virtio_queue::QueueT;

use super::MmioTransport;
use super::extension::extension_feature;
use crate::guest_error;
use crate::pci::function::EXITLESS_VENDOR_ID;
use crate::virtio::Ring;
use crate::virtio::device::Notification;
use crate::virtio::regs::{
    VIRTIO_F_MMIO_MSI, VIRTIO_F_MMIO_NOTIFY, VIRTIO_MMIO_CONFIG_GENERATION,
    VIRTIO_MMIO_DEVICE_FEATURES, VIRTIO_MMIO_DEVICE_FEATURES_SEL, VIRTIO_MMIO_DEVICE_ID,
    VIRTIO_MMIO_DRIVER_FEATURES, VIRTIO_MMIO_DRIVER_FEATURES_SEL, VIRTIO_MMIO_INTERRUPT_ACK,
    VIRTIO_MMIO_INTERRUPT_STATUS, VIRTIO_MMIO_MAGIC, VIRTIO_MMIO_MAGIC_VALUE,
    VIRTIO_MMIO_QUEUE_AVAIL_LOW, VIRTIO_MMIO_QUEUE_DESC_HIGH, VIRTIO_MMIO_QUEUE_DESC_LOW,
    VIRTIO_MMIO_QUEUE_NOTIFY, VIRTIO_MMIO_QUEUE_NUM, VIRTIO_MMIO_QUEUE_NUM_MAX,
    VIRTIO_MMIO_QUEUE_READY, VIRTIO_MMIO_QUEUE_SEL, VIRTIO_MMIO_QUEUE_USED_HIGH,
    VIRTIO_MMIO_STATUS, VIRTIO_MMIO_VENDOR_ID, VIRTIO_MMIO_VERSION,
};
use crate::virtio::state::{StatusChange, VirtioState};
use crate::virtio::transport::ring_dword;
use crate::virtio::transport::shared::finish_late_reset;

/// The Version register of a non-legacy device (virtio 1.2 §4.2.2; legacy devices read 1).
const VERSION: u32 = 2;

/// Distance between two rings' address registers: QueueDesc, QueueDriver and QueueDevice
/// each take a low/high pair at the start of 16 bytes.
const RING_STRIDE: u32 = VIRTIO_MMIO_QUEUE_AVAIL_LOW - VIRTIO_MMIO_QUEUE_DESC_LOW;

/// The ring address register `reg` (32-bit aligned) is, if it is one, and whether it is the
/// high dword.
fn ring_address(reg: u32) -> Option<(Ring, bool)> {
    let rel = reg.checked_sub(VIRTIO_MMIO_QUEUE_DESC_LOW)?;
    let pair = VIRTIO_MMIO_QUEUE_DESC_HIGH - VIRTIO_MMIO_QUEUE_DESC_LOW;
    (reg <= VIRTIO_MMIO_QUEUE_USED_HIGH && rel % RING_STRIDE <= pair)
        .then(|| ring_dword(rel, RING_STRIDE))
}

impl MmioTransport {
    /// A read of register `reg`.
    pub(super) fn read_register(&self, reg: u32) -> u32 {
        let mut st = self.core.state.lock().unwrap();
        if finish_late_reset(&mut st) {
            self.after_reset();
        }
        if let Some(f) = extension_feature(reg) {
            if !st.negotiated(f) {
                return 0; // docs/virtio-mmio-msi.md: un-negotiated registers read zero
            }
            return self.read_extension(&st, reg);
        }
        match reg {
            VIRTIO_MMIO_MAGIC_VALUE => VIRTIO_MMIO_MAGIC,
            VIRTIO_MMIO_VERSION => VERSION,
            VIRTIO_MMIO_DEVICE_ID => st.device_type(),
            VIRTIO_MMIO_VENDOR_ID => u32::from(EXITLESS_VENDOR_ID),
            VIRTIO_MMIO_DEVICE_FEATURES => st.device_features_word(),
            VIRTIO_MMIO_QUEUE_NUM_MAX => st.selected_queue().map_or(0, |q| u32::from(q.max_size())),
            VIRTIO_MMIO_QUEUE_READY => st.selected_queue().map_or(0, |q| u32::from(q.ready())),
            VIRTIO_MMIO_INTERRUPT_STATUS => self.core.interrupts.status(),
            VIRTIO_MMIO_STATUS => st.status(),
            VIRTIO_MMIO_CONFIG_GENERATION => st.config_generation(),
            _ => 0, // write-only and reserved registers read zero
        }
    }

    /// A write of `value` to register `reg`.
    pub(super) fn write_register(&self, reg: u32, value: u32) {
        let mut st = self.core.state.lock().unwrap();
        if finish_late_reset(&mut st) {
            self.after_reset();
        }
        if let Some(f) = extension_feature(reg) {
            if !st.negotiated(f) {
                guest_error!(
                    self.core.log,
                    "register {reg:#x} written without its feature {f} negotiated; ignored"
                );
                return;
            }
            self.write_extension(&st, reg, value);
            return;
        }
        if let Some((ring, high)) = ring_address(reg) {
            st.set_queue_address(ring, high, value);
            return;
        }
        match reg {
            VIRTIO_MMIO_DEVICE_FEATURES_SEL => st.device_features_select = value,
            VIRTIO_MMIO_DRIVER_FEATURES => st.write_driver_features(value),
            VIRTIO_MMIO_DRIVER_FEATURES_SEL => st.driver_features_select = value,
            VIRTIO_MMIO_QUEUE_SEL => st.queue_select = value,
            VIRTIO_MMIO_QUEUE_NUM => st.set_queue_size(value),
            VIRTIO_MMIO_QUEUE_READY if value != 0 => st.set_queue_ready(),
            VIRTIO_MMIO_QUEUE_READY => self.stop_queue(&mut st),
            VIRTIO_MMIO_QUEUE_NOTIFY => self.core.events.notify(value as usize),
            VIRTIO_MMIO_INTERRUPT_ACK => self.core.interrupts.ack(value),
            VIRTIO_MMIO_STATUS => self.write_device_status(&mut st, value),
            _ => self.not_writable(reg, value),
        }
    }

    /// A write to a register the driver may only read, or to a reserved offset.
    pub(super) fn not_writable(&self, reg: u32, value: u32) {
        guest_error!(
            self.core.log,
            "write of {value:#x} to register {reg:#x}, which is read-only or reserved; ignored"
        );
    }

    /// QueueReady written with 0 (§4.2.2): the selected queue stops; the driver reads 0 back
    /// once the device has stopped using it. If the device thread does not say so in time,
    /// the register keeps reading 1 and the device is broken.
    fn stop_queue(&self, st: &mut VirtioState) {
        let Some(index) = st.stop_queue() else {
            return;
        };
        match self.core.worker.stop_queue(index) {
            Ok(()) => st.queue_stopped(index),
            Err(_) => {
                let why = format_args!("the device thread did not stop queue {index}");
                if st.fail(&why) {
                    self.core.interrupts.notify(Notification::Config);
                }
            }
        }
    }

    /// The Status register written (virtio 1.2 §2.1): the common status change, then what it
    /// means for this transport's doorbells and interrupts.
    pub(super) fn write_device_status(&self, st: &mut VirtioState, value: u32) {
        let had_features = st.negotiated(VIRTIO_F_MMIO_NOTIFY);
        let change = self.core.write_status(st, value);
        if !had_features && st.negotiated(VIRTIO_F_MMIO_NOTIFY) {
            self.place_address_doorbells(true);
        }
        if change == StatusChange::Reset {
            self.after_reset();
        }
        // With the MSI feature negotiated, notifications go to the vectors, which hold them
        // pending until MsiControl enables them (docs/virtio-mmio-msi.md); without it, to the
        // line.
        self.core
            .interrupts
            .set_msi_active(st.negotiated(VIRTIO_F_MMIO_MSI));
    }
}
