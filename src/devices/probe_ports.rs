//! The ports through which the probe guest marks its phases and ends its run (the port half of
//! the contract in `src/contract.rs`).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::bus::{BusDevice, DeviceId};
use crate::contract::{MAX_OPS, PORT_DONE, PORT_PHASE_BEGIN, PORT_PHASE_END};
use crate::stats::{ExitCounters, ExitKind, ExitSnapshot};
use crate::vm::run_control::{RunControl, StopReason};

/// First port of the range; the others follow at 4-byte steps.
pub const PROBE_PORTS_BASE: u16 = PORT_PHASE_BEGIN;
/// Length of the port range.
pub const PROBE_PORTS_LEN: u16 = PORT_DONE - PORT_PHASE_BEGIN + 4;

/// What the VMM saw during one op.
#[derive(Clone, Debug, Default)]
pub struct PhaseRecord {
    /// Exits between the op's begin and end marks, the marks themselves excluded.
    pub exits: ExitSnapshot,
    /// Host wall time between the marks.
    pub host_time: Duration,
}

#[derive(Default)]
struct Phases {
    open: Option<(u64, ExitSnapshot, Instant)>,
    done: Vec<Option<PhaseRecord>>,
}

/// The phase and done ports.
pub struct ProbePorts {
    counters: Arc<ExitCounters>,
    control: Arc<RunControl>,
    phases: Mutex<Phases>,
    own_id: OnceLock<DeviceId>,
}

impl ProbePorts {
    /// Ports that snapshot `counters` and stop the run through `control`.
    pub fn new(counters: Arc<ExitCounters>, control: Arc<RunControl>) -> Self {
        ProbePorts {
            counters,
            control,
            phases: Mutex::default(),
            own_id: OnceLock::new(),
        }
    }

    /// Tell the ports their bus device id, so their own exits can be left out of phases.
    pub fn set_device_id(&self, id: DeviceId) {
        let _ = self.own_id.set(id);
    }

    /// The records of the ops that completed, indexed by op.
    pub fn records(&self) -> Vec<Option<PhaseRecord>> {
        self.phases.lock().unwrap().done.clone()
    }
}

impl BusDevice for ProbePorts {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            return;
        };
        let value = u64::from(u32::from_le_bytes(bytes));
        let Some(port) = u16::try_from(offset)
            .ok()
            .and_then(|o| PROBE_PORTS_BASE.checked_add(o))
        else {
            return;
        };
        let mut phases = self.phases.lock().unwrap();
        match port {
            PORT_PHASE_BEGIN => {
                phases.open = Some((value, self.counters.snapshot(), Instant::now()));
            }
            PORT_PHASE_END => {
                let now = Instant::now();
                if let Some((op, start, t0)) = phases
                    .open
                    .take()
                    .filter(|o| o.0 == value && value < MAX_OPS)
                {
                    let op = usize::try_from(op).expect("checked < MAX_OPS");
                    if phases.done.len() <= op {
                        phases.done.resize(op + 1, None);
                    }
                    // Exits are counted before dispatch: the begin mark is already in `start`,
                    // the end mark (this exit) is in the new snapshot and taken back out.
                    let mut exits = self.counters.snapshot().since(&start);
                    if let Some(&id) = self.own_id.get() {
                        exits.discount(ExitKind::PioWrite, id);
                    }
                    phases.done[op] = Some(PhaseRecord {
                        exits,
                        host_time: now - t0,
                    });
                }
            }
            PORT_DONE => self.control.stop(StopReason::GuestDone(value)),
            _ => {}
        }
    }
}
