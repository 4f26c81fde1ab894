//! exitless's virtio-mmio extension (docs/virtio-mmio-msi.md): MSI vectors with mask and
//! pending bits, programmed through staging registers and a command register
//! (VIRTIO_F_MMIO_MSI), and a doorbell address per queue (VIRTIO_F_MMIO_NOTIFY). Its registers
//! sit in space the standard layout reserves; until their feature is negotiated they read zero
//! and ignore writes.

use std::sync::atomic::Ordering;

use super::MmioTransport;
use crate::guest_error;
use crate::irq::MsiChange;
use crate::virtio::regs::{
    VIRTIO_F_MMIO_MSI, VIRTIO_F_MMIO_NOTIFY, VIRTIO_MMIO_CONFIG_MSI_VEC, VIRTIO_MMIO_DOORBELL_BASE,
    VIRTIO_MMIO_DOORBELL_STRIDE, VIRTIO_MMIO_MSI_ADDRESS_HIGH, VIRTIO_MMIO_MSI_ADDRESS_LOW,
    VIRTIO_MMIO_MSI_CMD_MASK, VIRTIO_MMIO_MSI_CMD_UNMASK, VIRTIO_MMIO_MSI_CMD_UPDATE,
    VIRTIO_MMIO_MSI_COMMAND, VIRTIO_MMIO_MSI_CONTROL, VIRTIO_MMIO_MSI_CTRL_ENABLE,
    VIRTIO_MMIO_MSI_DATA, VIRTIO_MMIO_MSI_SEL, VIRTIO_MMIO_MSI_STATE, VIRTIO_MMIO_MSI_STATE_MASKED,
    VIRTIO_MMIO_MSI_STATE_PENDING, VIRTIO_MMIO_MSI_VEC_NUM, VIRTIO_MMIO_QUEUE_MSI_VEC,
    VIRTIO_MMIO_QUEUE_NOTIFY_OFF, VIRTIO_MSI_NO_VECTOR,
};
use crate::virtio::state::VirtioState;

/// The MSI registers that stage a vector's message until the UPDATE command.
#[derive(Clone, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct MsiStaging {
    /// MsiSel: the vector the other registers act on.
    select: u32,
    /// MsiAddressLow: the low 32 bits of the staged vector's message address.
    address_low: u32,
    /// MsiAddressHigh: the high 32 bits of the staged vector's message address.
    address_high: u32,
    /// MsiData: the staged vector's message data.
    data: u32,
}

/// The extension feature a register belongs to, if it is one of the extension's.
pub(super) fn extension_feature(reg: u32) -> Option<u32> {
    match reg {
        VIRTIO_MMIO_MSI_VEC_NUM..=VIRTIO_MMIO_MSI_CONTROL => Some(VIRTIO_F_MMIO_MSI),
        VIRTIO_MMIO_QUEUE_NOTIFY_OFF => Some(VIRTIO_F_MMIO_NOTIFY),
        _ => None,
    }
}

/// Offset of queue `queue`'s doorbell from the device base.
pub fn doorbell_offset(queue: u32) -> u32 {
    VIRTIO_MMIO_DOORBELL_BASE + queue * VIRTIO_MMIO_DOORBELL_STRIDE
}

impl MmioTransport {
    /// A read of the extension's register `reg`, its feature negotiated; `st` is the common
    /// state, for the selected queue.
    pub(super) fn read_extension(&self, st: &VirtioState, reg: u32) -> u32 {
        let queue = st.queue_select as usize;
        match reg {
            VIRTIO_MMIO_MSI_VEC_NUM => u32::try_from(self.msi().len()).unwrap_or(u32::MAX),
            VIRTIO_MMIO_MSI_SEL => self.staging.lock().unwrap().select,
            VIRTIO_MMIO_MSI_ADDRESS_LOW => self.staging.lock().unwrap().address_low,
            VIRTIO_MMIO_MSI_ADDRESS_HIGH => self.staging.lock().unwrap().address_high,
            VIRTIO_MMIO_MSI_DATA => self.staging.lock().unwrap().data,
            VIRTIO_MMIO_MSI_STATE => self.msi_state(),
            VIRTIO_MMIO_QUEUE_MSI_VEC => u32::from(self.core.interrupts.queue_vector(queue)),
            VIRTIO_MMIO_CONFIG_MSI_VEC => u32::from(self.core.interrupts.config_vector()),
            VIRTIO_MMIO_MSI_CONTROL => self.msi_control.load(Ordering::SeqCst),
            VIRTIO_MMIO_QUEUE_NOTIFY_OFF if queue < st.queue_count() => {
                doorbell_offset(st.queue_select)
            }
            _ => 0, // MsiCommand is write-only; a queue that does not exist has no doorbell
        }
    }

    /// A write of `value` to the extension's register `reg`, its feature negotiated.
    pub(super) fn write_extension(&self, st: &VirtioState, reg: u32, value: u32) {
        match reg {
            VIRTIO_MMIO_MSI_SEL => self.staging.lock().unwrap().select = value,
            VIRTIO_MMIO_MSI_ADDRESS_LOW => self.staging.lock().unwrap().address_low = value,
            VIRTIO_MMIO_MSI_ADDRESS_HIGH => self.staging.lock().unwrap().address_high = value,
            VIRTIO_MMIO_MSI_DATA => self.staging.lock().unwrap().data = value,
            VIRTIO_MMIO_MSI_COMMAND => self.msi_command(value),
            VIRTIO_MMIO_QUEUE_MSI_VEC => {
                let vector = u16::try_from(value).unwrap_or(VIRTIO_MSI_NO_VECTOR);
                self.core
                    .interrupts
                    .set_queue_vector(st.queue_select as usize, vector);
            }
            VIRTIO_MMIO_CONFIG_MSI_VEC => {
                let vector = u16::try_from(value).unwrap_or(VIRTIO_MSI_NO_VECTOR);
                self.core.interrupts.set_config_vector(vector);
            }
            VIRTIO_MMIO_MSI_CONTROL => {
                let enable = value & VIRTIO_MMIO_MSI_CTRL_ENABLE != 0;
                self.msi_control
                    .store(value & VIRTIO_MMIO_MSI_CTRL_ENABLE, Ordering::SeqCst);
                self.msi().update(&[MsiChange::Enable(enable)]);
            }
            _ => self.not_writable(reg, value),
        }
    }

    /// MsiState of the selected vector: its mask and pending bits.
    fn msi_state(&self) -> u32 {
        let sel = self.staging.lock().unwrap().select as usize;
        let masked = if self.msi().is_masked(sel) {
            VIRTIO_MMIO_MSI_STATE_MASKED
        } else {
            0
        };
        let pending = if self.msi().is_pending(sel) {
            VIRTIO_MMIO_MSI_STATE_PENDING
        } else {
            0
        };
        masked | pending
    }

    /// MsiCommand written: carry out `command` on the selected vector.
    fn msi_command(&self, command: u32) {
        let staging = self.staging.lock().unwrap();
        let index = staging.select as usize;
        if index >= self.msi().len() {
            guest_error!(
                self.core.log,
                "MSI command {command} for vector {index}, which does not exist; ignored"
            );
            return;
        }
        match command {
            VIRTIO_MMIO_MSI_CMD_UPDATE => {
                let address =
                    u64::from(staging.address_high) << 32 | u64::from(staging.address_low);
                self.msi().update(&[MsiChange::Program {
                    index,
                    address,
                    data: staging.data,
                }]);
            }
            VIRTIO_MMIO_MSI_CMD_MASK | VIRTIO_MMIO_MSI_CMD_UNMASK => {
                self.msi().update(&[MsiChange::Mask {
                    index,
                    masked: command == VIRTIO_MMIO_MSI_CMD_MASK,
                }]);
            }
            _ => guest_error!(self.core.log, "unknown MSI command {command}; ignored"),
        }
    }

    /// Register (or remove) the per-queue doorbell ioeventfds of the extension's page.
    pub(super) fn place_address_doorbells(&self, on: bool) {
        if self.address_doorbells.is_empty() {
            return;
        }
        if !on {
            self.core.events.unregister_all();
        } else if let Err(e) = self.core.events.register(&self.address_doorbells) {
            // The doorbells still work, through exits; none may stay half-registered.
            self.core
                .log
                .warn(format_args!("cannot register doorbell ioeventfds: {e}"));
            self.core.events.unregister_all();
        }
    }

    /// A write to the doorbell page at `offset` from the device base: a notification of the
    /// queue whose doorbell it is, with the notify feature negotiated.
    pub(super) fn doorbell(&self, offset: u64) {
        let queue = usize::try_from(
            (offset - u64::from(VIRTIO_MMIO_DOORBELL_BASE))
                / u64::from(VIRTIO_MMIO_DOORBELL_STRIDE),
        )
        .unwrap_or(usize::MAX);
        if !self
            .core
            .state
            .lock()
            .unwrap()
            .negotiated(VIRTIO_F_MMIO_NOTIFY)
        {
            guest_error!(
                self.core.log,
                "doorbell written without the notify feature; ignored"
            );
            return;
        }
        self.core.events.notify(queue);
    }
}
