//! The probe's ports for `bench restore`, with two things the probe's own board does not keep:
//! when each op began and ended (host instants, to time the first interrupt after a restore
//! from the moment the vCPUs started), and the log of GSI routing commits (to tell which
//! function's routes each commit carried).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use exitless::bus::{BusDevice, IoBuses};
use exitless::contract::{PORT_PHASE_BEGIN, PORT_PHASE_END};
use exitless::irq::{CommitRecord, GsiRouting};
use exitless::machine::probe::board::{PROBE_PORTS_BASE, ProbePorts, install_ports};
use exitless::machine::{Board, BoardParts, MachineError};

/// When the guest marked each op's begin and end, by op index.
#[derive(Debug, Default)]
pub(super) struct Marks {
    pub begins: BTreeMap<u64, Instant>,
    pub ends: BTreeMap<u64, Instant>,
}

/// The probe's ports, each phase mark's host instant noted before the ports take it.
struct TimedPorts {
    ports: Arc<ProbePorts>,
    marks: Arc<Mutex<Marks>>,
}

impl BusDevice for TimedPorts {
    fn read(&self, offset: u64, data: &mut [u8]) {
        self.ports.read(offset, data);
    }

    fn write(&self, offset: u64, data: &[u8]) {
        if let Ok(bytes) = <[u8; 4]>::try_from(data) {
            let (op, now) = (u64::from(u32::from_le_bytes(bytes)), Instant::now());
            let mut marks = self.marks.lock().unwrap();
            match offset + u64::from(PROBE_PORTS_BASE) {
                port if port == u64::from(PORT_PHASE_BEGIN) => marks.begins.insert(op, now),
                port if port == u64::from(PORT_PHASE_END) => marks.ends.insert(op, now),
                _ => None,
            };
        }
        self.ports.write(offset, data);
    }
}

/// The board: the timed ports, and the routing table's commit log kept from installation on.
#[derive(Default)]
pub(super) struct RestoreBoard {
    pub marks: Arc<Mutex<Marks>>,
    pub routing: Option<Arc<GsiRouting>>,
}

impl RestoreBoard {
    /// Whether op `op` has begun.
    pub fn began(&self, op: usize) -> bool {
        self.marks.lock().unwrap().begins.contains_key(&(op as u64))
    }

    /// The routing commits since the board was installed.
    pub fn commits(&self) -> Vec<CommitRecord> {
        self.routing
            .as_ref()
            .map_or_else(Vec::new, |r| r.commit_log())
    }
}

impl Board for RestoreBoard {
    fn bus_devices(&self) -> usize {
        1
    }

    fn install(&mut self, io: &mut IoBuses, parts: &BoardParts<'_>) -> Result<(), MachineError> {
        let marks = self.marks.clone();
        install_ports(io, parts, |ports| Arc::new(TimedPorts { ports, marks }))?;
        parts.routing.keep_commit_log();
        self.routing = Some(parts.routing.clone());
        Ok(())
    }
}
