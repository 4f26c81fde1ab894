//! The ports through which the probe guest marks its phases, asks for MSI-X messages and ends
//! its run (the port half of the contract in `crates/exitless-contract/src/lib.rs`), and the board that installs
//! them: only the probe machine has it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::bus::{BusDevice, DeviceId, IoBuses};
use crate::contract::{MAX_OPS, PORT_DONE, PORT_MSIX_SEND, PORT_PHASE_BEGIN, PORT_PHASE_END};
use crate::exits::{ExitCounters, ExitKind, ExitSnapshot, cpu_time};
use crate::guest_error;
use crate::irq::{CommitStats, GsiRouting, MsiVectors};
use crate::logging::DeviceLog;
use crate::machine::wiring::names;
use crate::machine::{Board, BoardParts, MachineError};
use crate::vm::run_control::{RunControl, StopReason};

/// First port of the range; the others follow at 4-byte steps.
pub const PROBE_PORTS_BASE: u16 = PORT_PHASE_BEGIN;
/// Length of the port range.
pub const PROBE_PORTS_LEN: u16 = PORT_MSIX_SEND - PORT_PHASE_BEGIN + 4;

/// What the VMM saw during one op.
#[derive(Clone, Debug, Default)]
pub struct PhaseRecord {
    /// Exits between the op's begin and end marks, the marks themselves excluded.
    pub exits: ExitSnapshot,
    /// Host wall time between the marks.
    pub host_time: Duration,
    /// GSI routing commits between the marks.
    pub routing: CommitStats,
    /// CPU time the whole VMM process (vCPU and device threads, user and system) spent
    /// between the marks: the host's service demand of the op.
    pub host_cpu: Duration,
}

struct OpenPhase {
    op: u64,
    exits: ExitSnapshot,
    routing: CommitStats,
    start: Instant,
    cpu: Duration,
}

#[derive(Default)]
struct Phases {
    open: Option<OpenPhase>,
    done: Vec<Option<PhaseRecord>>,
}

/// The phase, MSI-X and done ports.
pub struct ProbePorts {
    counters: Arc<ExitCounters>,
    control: Arc<RunControl>,
    routing: Arc<GsiRouting>,
    /// MSI-X vectors by ECAM-style function address, for `PORT_MSIX_SEND`.
    msix: BTreeMap<u64, Arc<MsiVectors>>,
    phases: Mutex<Phases>,
    own_id: OnceLock<DeviceId>,
    log: Arc<DeviceLog>,
}

impl ProbePorts {
    /// Ports that snapshot `counters` and `routing`, send the vectors in `msix` on request and
    /// stop the run through `control`.
    pub fn new(
        counters: Arc<ExitCounters>,
        control: Arc<RunControl>,
        routing: Arc<GsiRouting>,
        msix: BTreeMap<u64, Arc<MsiVectors>>,
    ) -> Self {
        ProbePorts {
            counters,
            control,
            routing,
            msix,
            phases: Mutex::default(),
            own_id: OnceLock::new(),
            log: DeviceLog::new(names::PROBE_PORTS),
        }
    }

    /// The ports' log, named as on the bus.
    pub fn log(&self) -> &Arc<DeviceLog> {
        &self.log
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
                phases.open = Some(OpenPhase {
                    op: value,
                    exits: self.counters.snapshot(),
                    routing: self.routing.stats(),
                    start: Instant::now(),
                    cpu: cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID),
                });
            }
            PORT_PHASE_END => {
                let now = Instant::now();
                if let Some(open) = phases
                    .open
                    .take()
                    .filter(|o| o.op == value && value < MAX_OPS)
                {
                    let op = open.op;
                    let op = usize::try_from(op).expect("checked < MAX_OPS");
                    if phases.done.len() <= op {
                        phases.done.resize(op + 1, None);
                    }
                    // Exits are counted before dispatch: the begin mark is already in `start`,
                    // the end mark (this exit) is in the new snapshot and taken back out.
                    let mut exits = self.counters.snapshot().since(&open.exits);
                    if let Some(&id) = self.own_id.get() {
                        exits.discount(ExitKind::PioWrite, id);
                    }
                    phases.done[op] = Some(PhaseRecord {
                        exits,
                        host_time: now - open.start,
                        routing: self.routing.stats().since(&open.routing),
                        host_cpu: cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID).saturating_sub(open.cpu),
                    });
                }
            }
            PORT_DONE => self.control.stop(StopReason::GuestDone(value)),
            PORT_MSIX_SEND => {
                let (function, entry) = (value & !0xfff, (value & 0xfff) as usize);
                match self.msix.get(&function) {
                    Some(vectors) => vectors.trigger(entry),
                    None => guest_error!(
                        self.log,
                        "no MSI-X function at {function:#x} to send a vector from; ignored"
                    ),
                }
            }
            _ => {}
        }
    }
}

/// The probe's board: its ports. Installed by the probe machine only.
#[derive(Default)]
pub struct ProbeBoard {
    ports: Option<Arc<ProbePorts>>,
}

impl ProbeBoard {
    /// What the VMM saw during each op (`None` if the op never completed); empty before the
    /// board is installed.
    pub fn records(&self) -> Vec<Option<PhaseRecord>> {
        self.ports.as_ref().map_or_else(Vec::new, |p| p.records())
    }
}

impl Board for ProbeBoard {
    fn bus_devices(&self) -> usize {
        1
    }

    fn install(&mut self, io: &mut IoBuses, parts: &BoardParts<'_>) -> Result<(), MachineError> {
        self.ports = Some(install_ports(io, parts, |ports| ports)?);
        Ok(())
    }
}

/// Make the probe's ports for `parts` and put them on the port bus as `wrap` makes them into a
/// bus device (themselves, or a device in front that sees each access first: `bench restore`
/// notes the instant of each phase mark).
pub fn install_ports(
    io: &mut IoBuses,
    parts: &BoardParts<'_>,
    wrap: impl FnOnce(Arc<ProbePorts>) -> Arc<dyn BusDevice>,
) -> Result<Arc<ProbePorts>, MachineError> {
    let ports = Arc::new(ProbePorts::new(
        parts.counters.clone(),
        parts.control.clone(),
        parts.routing.clone(),
        parts.msix.clone(),
    ));
    let device = wrap(ports.clone());
    let id = io.add_pio(
        names::PROBE_PORTS,
        PROBE_PORTS_BASE,
        PROBE_PORTS_LEN,
        device,
    )?;
    ports.set_device_id(id);
    parts.counters.attach_log(id, ports.log().clone());
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::irq::CommitStrategy;

    #[test]
    fn an_msix_send_to_no_function_is_a_guest_error_of_the_ports() {
        let vm = kvm_ioctls::Kvm::new().unwrap().create_vm().unwrap();
        vm.create_irq_chip().unwrap();
        let routing = Arc::new(GsiRouting::new(Arc::new(vm), CommitStrategy::Batched).unwrap());
        let counters = Arc::new(ExitCounters::new(1));
        let parts = BoardParts {
            counters: &counters,
            control: &Arc::new(RunControl::default()),
            routing: &routing,
            msix: &BTreeMap::new(),
        };
        let mut io = IoBuses::default();
        let mut board = ProbeBoard::default();
        board.install(&mut io, &parts).unwrap();
        let id = io.id_for(names::PROBE_PORTS);
        let offset = u64::from(PORT_MSIX_SEND - PROBE_PORTS_BASE);
        board
            .ports
            .as_ref()
            .unwrap()
            .write(offset, &0x1000u32.to_le_bytes());
        assert_eq!(counters.snapshot().guest_errors_of(id), 1);
    }
}
