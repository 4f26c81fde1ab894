//! A virtio-mmio transport in a snapshot (`crate::persist`): the common registers, interrupt
//! state and queue positions ([`crate::virtio::transport::persist`]), and the MSI extension
//! (docs/virtio-mmio-msi.md): MsiControl, the staging registers, each vector's message, mask
//! and pending bit. At restore the vectors' routes are committed as the strategy in force
//! says, and the extension's per-queue doorbells are registered again if the driver had
//! negotiated them.

use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::MmioTransport;
use super::extension::MsiStaging;
use crate::irq::MsiChange;
use crate::irq::msi::VectorState;
use crate::persist::{Persist, StateError, from_state, to_state};
use crate::virtio::regs::{VIRTIO_F_MMIO_NOTIFY, VIRTIO_MMIO_MSI_CTRL_ENABLE};
use crate::virtio::transport::persist::CommonState;

/// What a virtio-mmio transport saves.
#[derive(Serialize, Deserialize)]
struct MmioState {
    common: CommonState,
    /// The extension's MsiControl.
    msi_control: u32,
    /// The extension's staging registers.
    staging: MsiStaging,
    /// Each vector.
    vectors: Vec<VectorState>,
}

impl MmioTransport {
    fn what(&self) -> &str {
        self.core.log.name()
    }
}

impl Persist for MmioTransport {
    fn pause(&self) -> Result<(), StateError> {
        self.phase
            .lock()
            .unwrap()
            .pause(self.what(), &self.core.worker)
    }

    fn save(&self) -> Result<serde_json::Value, StateError> {
        let st = self.core.state.lock().unwrap();
        let state = MmioState {
            common: self
                .phase
                .lock()
                .unwrap()
                .save(self.what(), &st, &self.core.interrupts)?,
            msi_control: self.msi_control.load(Ordering::SeqCst),
            staging: self.staging.lock().unwrap().clone(),
            vectors: self.msi().save(),
        };
        to_state(self.what(), &state)
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), StateError> {
        let what = self.what();
        let saved: MmioState = from_state(what, state)?;
        if saved.msi_control & !VIRTIO_MMIO_MSI_CTRL_ENABLE != 0 {
            return Err(StateError::new(
                format!("{what}.msi_control"),
                format_args!("{:#x} has undefined bits", saved.msi_control),
            ));
        }
        let mut st = self.core.state.lock().unwrap();
        self.phase.lock().unwrap().restore(
            what,
            &mut st,
            &self.core.worker,
            &self.core.interrupts,
            &saved.common,
        )?;
        // A platform device: always master of the bus, never function-masked.
        let bits = [
            MsiChange::BusMaster(true),
            MsiChange::FunctionMask(false),
            MsiChange::Enable(saved.msi_control != 0),
        ];
        self.msi()
            .restore(&format!("{what}.vectors"), &saved.vectors, bits)?;
        self.msi_control.store(saved.msi_control, Ordering::SeqCst);
        *self.staging.lock().unwrap() = saved.staging;
        if st.negotiated(VIRTIO_F_MMIO_NOTIFY) {
            self.place_address_doorbells(true);
        }
        // A reset the device thread was late for when the snapshot was taken: done now, as
        // the driver, reading the status until it is 0, waits for it.
        if saved.common.registers.reset_pending {
            self.write_device_status(&mut st, 0);
        }
        Ok(())
    }

    fn resume(&self) {
        let st = self.core.state.lock().unwrap();
        self.phase
            .lock()
            .unwrap()
            .resume(&st, &self.core.worker, &self.core.dma);
        // A line whose status was not acknowledged is asserted again (level-triggered).
        self.core.interrupts.resample();
    }
}

#[cfg(test)]
mod tests;
