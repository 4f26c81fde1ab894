//! What both transports do for a snapshot (`crate::persist`), around their own registers: the
//! device thread paused with each live queue's position, the common registers and interrupt
//! state saved and checked back in, and the device thread restarted where it stopped: the same
//! thread after a pause, or a fresh one handed the saved queues at their positions when a
//! restored device's driver had set DRIVER_OK.

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueT};

use crate::dma::DmaContext;
use crate::persist::StateError;
use crate::virtio::device::QueuePosition;
use crate::virtio::interrupt::Interrupts;
use crate::virtio::interrupt::persist::InterruptState;
use crate::virtio::state::{RegisterState, VirtioState};
use crate::virtio::worker::{Paused, WorkerHandle};

/// Where a transport is in a snapshot's life.
#[derive(Default)]
pub enum Phase {
    /// Not in a snapshot: the device thread serves the queues.
    #[default]
    Running,
    /// Paused: the device thread waits; what it reported.
    Paused(Paused),
    /// Restored, not yet resumed: the queues to hand the device thread, if it was live.
    Restored(Option<Vec<Queue>>),
}

/// The state both transports keep alike.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommonState {
    /// Features, status, selectors, queue registers.
    pub registers: RegisterState,
    /// ISR status and vector assignment.
    pub interrupts: InterruptState,
    /// Where the device thread is in each queue, if the device was live.
    pub positions: Option<Vec<QueuePosition>>,
    /// What the device thread's queue handler holds, if anything (a responder's answers).
    pub handler: Option<serde_json::Value>,
}

impl Phase {
    /// Pause the device thread (once): it finishes what it was doing and reports its
    /// positions. `what` names the device in an error.
    pub fn pause(&mut self, what: &str, worker: &WorkerHandle) -> Result<(), StateError> {
        if let Phase::Running = self {
            let positions = worker.pause().map_err(|waited| {
                StateError::new(
                    what,
                    format_args!("the device thread did not stop within {waited:?}"),
                )
            })?;
            *self = Phase::Paused(positions);
        }
        Ok(())
    }

    /// The state, with `st` and `interrupts` as they are (the device paused or restored).
    pub fn save(
        &self,
        what: &str,
        st: &VirtioState,
        interrupts: &Interrupts,
    ) -> Result<CommonState, StateError> {
        let (positions, handler) = match self {
            Phase::Running if st.is_live() => {
                return Err(StateError::new(what, "saved while its device thread runs"));
            }
            Phase::Running => (None, None),
            Phase::Paused(paused) => (paused.positions.clone(), paused.handler.clone()),
            Phase::Restored(queues) => (
                queues.as_ref().map(|queues| {
                    queues
                        .iter()
                        .map(|q| QueuePosition {
                            next_avail: q.next_avail(),
                            next_used: q.next_used(),
                        })
                        .collect()
                }),
                None,
            ),
        };
        Ok(CommonState {
            registers: st.save(),
            interrupts: interrupts.save(),
            positions,
            handler,
        })
    }

    /// Take `saved` into the freshly built `st`, `interrupts` and device thread (`worker`,
    /// which gets the handler's state); a live device's queues are kept for
    /// [`Phase::resume`]. Errors name `what`'s field.
    pub fn restore(
        &mut self,
        what: &str,
        st: &mut VirtioState,
        worker: &WorkerHandle,
        interrupts: &Interrupts,
        saved: &CommonState,
    ) -> Result<(), StateError> {
        st.restore(what, &saved.registers)?;
        if let Some(handler) = &saved.handler {
            worker
                .restore_handler(handler.clone())
                .map_err(|why| StateError::new(format!("{what}.handler"), why))?;
        }
        let queues = match (&saved.positions, st.is_live()) {
            (Some(positions), true) => Some(st.queues_at(what, positions)?),
            (None, false) => None,
            // A device that broke (a vhost-user backend that hung up) holds no queues: its
            // driver resets it before it works again.
            (None, true) if saved.registers.needs_reset => None,
            (_, live) => {
                return Err(StateError::new(
                    format!("{what}.positions"),
                    if live {
                        "missing for a live device"
                    } else {
                        "given for a device that is not live"
                    },
                ));
            }
        };
        interrupts.restore(&format!("{what}.interrupts"), &saved.interrupts)?;
        *self = Phase::Restored(queues);
        Ok(())
    }

    /// Serve the queues again: the paused thread resumes, or a restored live device's thread
    /// is handed its queues at their positions through `dma`; either has served each queue
    /// once when this returns ([`Command::Resume`]), or has been warned about.
    pub fn resume(&mut self, st: &VirtioState, worker: &WorkerHandle, dma: &DmaContext) {
        match std::mem::take(self) {
            Phase::Running | Phase::Restored(None) => return,
            Phase::Paused(_) => {}
            Phase::Restored(Some(queues)) => {
                crate::virtio::transport::shared::activate(st, worker, dma, queues)
            }
        }
        // A thread that does not answer in time was warned about by `call`; it serves the
        // queues when it gets to the command.
        let _ = worker.resume();
    }
}
