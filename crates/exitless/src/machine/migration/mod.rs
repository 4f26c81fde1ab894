//! Live migration: a running machine sent to another exitless over a stream (TCP or a Unix
//! socket) while it runs, paused only for its last pages and its devices' state.
//!
//! - [`stream`]: the records each side writes and how they are checked;
//! - [`address`]: where a target listens and a source connects (`tcp:HOST:PORT`,
//!   `unix:PATH`);
//! - [`send`]: the source's passes over guest memory, the switch-over, and going on as it was
//!   when anything fails before it;
//! - [`receive`]: the target's side, which builds the machine once the stream is whole.
//!
//! Which pages to send: KVM's dirty log ([`crate::vm::Vm::dirty_pages`]) holds the vCPUs'
//! writes, but not those of the VMM's device threads, the kernel's vhost workers, io_uring or a
//! vhost-user backend. Rather than ask each of them for a log of its own, the source keeps a
//! 64-bit hash of every page as the target has it, and once the machine is paused (every
//! device stopped: no writer is left) it hashes all of guest memory and sends each page whose
//! hash changed. That scan is in the downtime: it costs a read of the guest RAM this process
//! ever touched ([`touched`]; see docs/migration.md for the figures); the passes before it
//! send what KVM logged, so that little is left for it. Described for users in
//! docs/migration.md.

pub mod address;
mod local;
pub mod receive;
pub mod send;
pub mod stream;
mod touched;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use address::{Address, Listener};
pub use receive::Incoming;
pub use stream::StreamError;

use crate::machine::MachineError;
use crate::machine::snapshot::SnapshotError;
use crate::vm::VmError;
use crate::vm::pause::PauseError;

/// The downtime a migration aims for unless told otherwise: Cloud Hypervisor's default.
pub const DEFAULT_DOWNTIME: Duration = Duration::from_millis(300);
/// Most passes over memory before the machine is paused whatever is left: a guest that
/// dirties memory faster than the stream carries it would never converge.
pub const MAX_PASSES: u32 = 30;

/// Why a migration failed. Each message is one line; on the source, the machine goes on.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// An address that is not `tcp:HOST:PORT`, `unix:PATH` or `local:PATH`.
    #[error("`{0}` is not a migration address: give tcp:HOST:PORT, unix:PATH or local:PATH")]
    Address(String),
    /// The target cannot be reached, or its address not listened on.
    #[error("cannot {what} {address}: {source}")]
    Connect {
        /// Connect to, or listen on.
        what: &'static str,
        /// The address.
        address: String,
        /// The host's error.
        #[source]
        source: std::io::Error,
    },
    /// The stream broke or is not one exitless wrote.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// The machine's configuration or state cannot be sent or taken.
    #[error(transparent)]
    State(#[from] SnapshotError),
    /// KVM's dirty log.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// The machine cannot be paused for the switch-over.
    #[error("cannot pause the VM for the switch-over: {0}")]
    Pause(#[from] PauseError),
    /// The target cannot build or run the machine.
    #[error(transparent)]
    Machine(#[from] Box<MachineError>),
    /// The target said no.
    #[error("the target refused the VM: {0}")]
    Refused(String),
    /// A machine with a device whose migration is not written yet.
    #[error("this VM cannot be migrated yet: it has {0}")]
    Unsupported(&'static str),
    /// A record out of its place.
    #[error("the migration stream is out of order: {0}")]
    Order(String),
}

/// How to migrate: where to, and the downtime to aim for.
#[derive(Clone, Debug)]
pub struct MigrationOptions {
    /// The target.
    pub address: Address,
    /// The longest pause to aim for: passes go on until what is left fits it, or
    /// [`MAX_PASSES`].
    pub downtime: Duration,
    /// Longest to wait for every vCPU to park at the switch-over.
    pub pause_deadline: Duration,
}

impl MigrationOptions {
    /// [`MigrationOptions::downtime`] in milliseconds.
    pub fn downtime_ms(&self) -> f64 {
        self.downtime.as_secs_f64() * 1e3
    }
}

/// What a migration did, measured on the source.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Migrated {
    /// Passes over memory while the machine ran (none in a live update).
    pub passes: u32,
    /// Files handed over in a live update (`local:`): guest RAM's memfd, disk images, tap
    /// queues; 0 otherwise.
    #[serde(default)]
    pub files: u64,
    /// Pages sent in all (changed pages sent again count again).
    pub pages: u64,
    /// Bytes written to the stream.
    pub bytes: u64,
    /// Pages sent while the machine was paused.
    pub final_pages: u64,
    /// Of those, the pages KVM's log did not hold: written by a device thread, a kernel
    /// worker or a backend, found by the scan.
    pub scanned_pages: u64,
    /// From the pause to the target's go-ahead sent, in milliseconds.
    pub downtime_ms: f64,
    /// From the first byte to the go-ahead, in milliseconds.
    pub total_ms: f64,
}

/// Where a migration under way stands, as `vm.info` shows it while it runs.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Progress {
    /// `copying` while the machine runs, `switching over` once it is paused.
    pub phase: &'static str,
    /// The pass over memory under way (the first sends every page).
    pub pass: u32,
    /// Pages sent so far.
    pub pages: u64,
    /// Bytes written to the stream so far.
    pub bytes: u64,
    /// Pages the vCPUs wrote during the last pass: what the next one sends.
    pub dirty_pages: u64,
    /// Pages the vCPUs wrote per second during the last pass.
    pub dirty_pages_per_s: f64,
    /// Bytes per second the last pass carried.
    pub bytes_per_s: f64,
    /// How long the pause would be if the switch-over came now: the dirty pages at that
    /// rate, in milliseconds.
    pub expected_downtime_ms: f64,
    /// Since the migration started, in milliseconds.
    pub elapsed_ms: f64,
}

/// What sends a running machine to a target: the machine's own, or a test's stand-in.
pub trait SendMigration: Send + Sync {
    /// Send the machine as `options` say. On success the machine is the target's and this
    /// run stops; on failure it goes on as it was (running or paused).
    fn send(&self, options: &MigrationOptions) -> Result<Migrated, MigrationError>;

    /// Where the migration under way stands; `None` when none is.
    fn progress(&self) -> Option<Progress>;
}
