//! Other VMMs running exitless's probe guest, for figures side by side with exitless's own
//! (`exitless bench --against qemu`).
//!
//! The probe is one image for both: exitless loads it and enters it in long mode with the boot
//! info and ops in guest memory; [QEMU](qemu::Qemu) boots the same bytes through their
//! multiboot header, and the probe learns the machine as an OS does (ACPI MCFG for ECAM, PCI
//! enumeration for devices, the PM timer for the TSC), takes its ops from a fw_cfg file and
//! prints its results on the serial port ([`dump`]) after its timed loops. Both sides follow
//! one contract (`exitless_contract`).
//!
//! ```no_run
//! use std::time::Duration;
//! use exitless_contract::{METHOD_ECAM, OP_CFG_READ_LOOP, Op};
//! use exitless_peer::{Qemu, QemuMachine};
//!
//! let qemu = Qemu::find()?;
//! let machine = QemuMachine { virtio_net: 1, ..QemuMachine::default() };
//! // Read the vendor ID of the first virtio-net function 1000 times (ECAM offset dev << 15).
//! let vendor_id = Op {
//!     kind: OP_CFG_READ_LOOP,
//!     method: METHOD_ECAM,
//!     address: u64::from(machine.virtio_net_slot(0)) << 15,
//!     size: 4,
//!     count: 1000,
//!     ..Op::default()
//! };
//! let run = qemu.run_probe(&machine, &[vendor_id], Duration::from_secs(120))?;
//! println!("{}: {} cycles at {:?} kHz", qemu.version(), run.results[0].cycles, run.tsc_khz);
//! # Ok::<(), exitless_peer::PeerError>(())
//! ```

pub mod backends;
pub mod dump;
pub mod host_tap;
pub mod qemu;

use std::process::ExitStatus;
use std::time::Duration;

pub use qemu::migrate::{MarkerTrace, MarkerTraces, Migration, QemuResume};
pub use qemu::{Qemu, QemuMachine, QemuTap};

use exitless_contract::{EnumRecord, OpResult};

/// What the probe measured under another VMM.
#[derive(Debug)]
pub struct PeerRun {
    /// One per op, in op order (status `STATUS_UNSUPPORTED` for ops only exitless can do).
    pub results: Vec<OpResult>,
    /// Records written by the last `OP_ENUMERATE`.
    pub enum_records: Vec<EnumRecord>,
    /// The guest's TSC frequency, as the probe measured it against the ACPI PM timer.
    pub tsc_khz: Option<u32>,
    /// The whole run, from starting the VMM to its exit: firmware, boot and ops.
    pub wall: Duration,
    /// Everything the serial port carried (the firmware's banner, the probe's lines).
    pub serial: String,
}

/// Why a run under another VMM produced no results.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The VMM is not installed.
    #[error("{binary} is not on PATH (Debian: apt-get install {package})")]
    NotFound {
        /// The program looked for.
        binary: &'static str,
        /// The Debian package that has it.
        package: &'static str,
    },
    /// The VMM could not be started, or its files written.
    #[error("cannot {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// More ops than the contract holds.
    #[error("{0} ops requested; the probe holds at most {max}", max = exitless_contract::MAX_OPS)]
    TooManyOps(usize),
    /// Too little RAM for the probe.
    #[error(
        "{mib} MiB of RAM is too little: the probe and the firmware's tables need {need_mib} MiB"
    )]
    Memory {
        /// RAM asked for.
        mib: u32,
        /// RAM needed.
        need_mib: u64,
    },
    /// Functions that do not fit on q35's bus 0.
    #[error("{count} functions from slot {first} do not fit on bus 0: q35 has slots 1 to 30 free")]
    Slots {
        /// The first function's slot.
        first: u8,
        /// Functions asked for.
        count: u8,
    },
    /// The run did not end in time; the VMM was killed.
    #[error("the probe under {vmm} did not finish within {limit:?}; serial output:\n{serial}")]
    Timeout {
        /// The VMM and its version.
        vmm: String,
        /// The time limit.
        limit: Duration,
        /// What the serial port carried.
        serial: String,
    },
    /// The VMM ended other than the probe ends a good run.
    #[error("{vmm} exited with {status} ({meaning}); stderr:\n{stderr}serial output:\n{serial}")]
    Failed {
        /// The VMM and its version.
        vmm: String,
        /// How it exited.
        status: ExitStatus,
        /// What that status says.
        meaning: String,
        /// What it printed.
        stderr: String,
        /// What the serial port carried.
        serial: String,
    },
    /// The serial dump is missing, truncated or garbled.
    #[error("the probe's serial dump {0}")]
    Dump(#[from] dump::DumpError),
    /// A dump with a result count other than the op count.
    #[error("the probe's serial dump holds {got} results for {sent} ops")]
    ResultCount {
        /// Results in the dump.
        got: usize,
        /// Ops sent.
        sent: usize,
    },
}
