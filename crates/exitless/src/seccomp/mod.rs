//! Confinement: every thread runs under a seccomp filter (seccomp(2), `SECCOMP_SET_MODE_FILTER`)
//! that allows the system calls its kind of work needs and nothing else.
//!
//! The [`ThreadKind`]s are the threads exitless has: the main thread (command line, machine
//! building, reports), one per vCPU, one per virtio device (and the VT-d unit's doorbell
//! thread, of the same kind), the log writer, the console writer and the console input, the timer chips' threads (the RTC's, the PIT's), the control
//! socket's server. [`enable`] compiles one filter per kind and installs the SIGSYS handler, once, before
//! any thread starts; every thread then installs its own kind's filter as it starts
//! ([`spawn`]), and the main thread with [`confine`] before it builds a machine. Without
//! [`enable`] (tests, `--no-seccomp`) nothing is confined.
//!
//! A filter applies to the thread that installs it and to the threads it starts later, on top
//! of their own: a vCPU thread started by the confined main thread runs under both filters, and
//! a call passes only if both allow it. So the main thread's filter also allows what its
//! children do; each child then narrows itself to its kind's list.
//!
//! A call a filter does not allow traps (`SECCOMP_RET_TRAP`): the kernel sends SIGSYS, and the
//! handler reports the thread and the call, then ends the process with [`EXIT_VIOLATION`].

mod filters;
mod kvm;
mod sigsys;

use std::io;
use std::sync::{OnceLock, mpsc};
use std::thread::{self, JoinHandle};

use seccompiler::BpfProgram;

use filters::allowed;
pub use filters::{BLKALIGNOFF, BLKDISCARD, BLKGETSIZE64, kick_signal};
pub use sigsys::EXIT_VIOLATION;

/// The kinds of threads, each with its own filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadKind {
    /// The thread that runs the command: builds machines, starts and stops the other threads,
    /// writes the report.
    Main,
    /// Runs one vCPU and handles its exits.
    Vcpu,
    /// Serves one virtio device's queues.
    Device,
    /// Talks to one vhost-user device's backend (`virtio::vhost_user`): the queues are the
    /// backend's, the thread only configures them and watches the call fds of masked vectors.
    VhostUser,
    /// Writes queued log records to stderr.
    LogWriter,
    /// Writes the guest's console output.
    Console,
    /// Feeds the console UART's receiver from stdin.
    ConsoleInput,
    /// Raises a timer chip's interrupts when they fall due (the RTC's, the PIT's).
    Timer,
    /// Serves the control socket (`exitless run --api-socket`).
    Api,
    /// Sends the machine to a migration target when the control socket asks
    /// (`vm.send-migration`).
    Migration,
}

impl ThreadKind {
    /// Every kind, in the order [`enable`] compiles their filters.
    pub const ALL: [ThreadKind; 10] = [
        ThreadKind::Main,
        ThreadKind::Vcpu,
        ThreadKind::Device,
        ThreadKind::VhostUser,
        ThreadKind::LogWriter,
        ThreadKind::Console,
        ThreadKind::ConsoleInput,
        ThreadKind::Timer,
        ThreadKind::Api,
        ThreadKind::Migration,
    ];

    /// The kind's name, as reports show it.
    pub fn name(self) -> &'static str {
        match self {
            ThreadKind::Main => "main",
            ThreadKind::Vcpu => "vcpu",
            ThreadKind::Device => "device",
            ThreadKind::VhostUser => "vhost-user",
            ThreadKind::LogWriter => "log writer",
            ThreadKind::Console => "console",
            ThreadKind::ConsoleInput => "console input",
            ThreadKind::Timer => "timer",
            ThreadKind::Api => "api",
            ThreadKind::Migration => "migration",
        }
    }
}

/// Errors setting up confinement.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// A filter does not compile to BPF.
    #[error("cannot build the seccomp filter of the {kind} thread: {source}")]
    Build {
        /// The thread kind's name.
        kind: &'static str,
        /// seccompiler's reason.
        #[source]
        source: seccompiler::Error,
    },
    /// The SIGSYS handler could not be installed.
    #[error("cannot install the SIGSYS handler that reports seccomp violations: {0}")]
    Handler(#[source] vmm_sys_util::errno::Error),
    /// The kernel refused a filter.
    #[error("cannot confine the {kind} thread with seccomp: {source} (--no-seccomp runs without)")]
    Apply {
        /// The thread kind's name.
        kind: &'static str,
        /// The kernel's refusal, as seccompiler reports it.
        #[source]
        source: seccompiler::Error,
    },
}

/// The compiled filters, in [`ThreadKind::ALL`] order, once [`enable`] has run.
static FILTERS: OnceLock<Vec<BpfProgram>> = OnceLock::new();

/// Compile `kind`'s filter.
fn compile(kind: ThreadKind) -> Result<BpfProgram, SeccompError> {
    filters::compile(&allowed(kind)).map_err(|source| SeccompError::Build {
        kind: kind.name(),
        source,
    })
}

/// Turn confinement on for this process: compile every kind's filter and install the SIGSYS
/// handler. Call it before starting any thread that should be confined; a second call does
/// nothing.
pub fn enable() -> Result<(), SeccompError> {
    if FILTERS.get().is_some() {
        return Ok(());
    }
    let filters = ThreadKind::ALL
        .into_iter()
        .map(compile)
        .collect::<Result<Vec<_>, _>>()?;
    sigsys::install().map_err(SeccompError::Handler)?;
    filters::prepare_allocator();
    let _ = FILTERS.set(filters);
    Ok(())
}

/// Whether [`enable`] has run: threads are (or will be) confined.
pub fn enabled() -> bool {
    FILTERS.get().is_some()
}

/// Confine the calling thread to `kind`'s filter, for the rest of its life (and the threads it
/// starts afterwards). Does nothing unless [`enable`] has run.
pub fn confine(kind: ThreadKind) -> Result<(), SeccompError> {
    let Some(filters) = FILTERS.get() else {
        return Ok(());
    };
    let index = ThreadKind::ALL
        .iter()
        .position(|&k| k == kind)
        .expect("ALL holds every kind");
    sigsys::identify(kind);
    // The calling thread only: each thread installs its own (no SECCOMP_FILTER_FLAG_TSYNC).
    seccompiler::apply_filter(&filters[index]).map_err(|source| SeccompError::Apply {
        kind: kind.name(),
        source,
    })
}

/// Start a thread called `name` that confines itself to `kind`'s filter, then runs `body`.
/// Returns once the filter is in place; if it could not be, the thread ends without running
/// `body` and the error is returned, so no thread ever runs unconfined when confinement is on.
pub fn spawn(
    kind: ThreadKind,
    name: String,
    body: impl FnOnce() + Send + 'static,
) -> io::Result<JoinHandle<()>> {
    let (report, confined) = mpsc::sync_channel(1);
    let thread = thread::Builder::new().name(name).spawn(move || {
        let result = confine(kind);
        let ok = result.is_ok();
        let _ = report.send(result);
        if ok {
            body();
        }
    })?;
    match confined.recv() {
        Ok(Ok(())) => Ok(thread),
        Ok(Err(e)) => Err(io::Error::other(e)),
        Err(mpsc::RecvError) => Err(io::Error::other(format!(
            "the {} thread ended before confining itself",
            kind.name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_compiles_to_bpf() {
        for kind in ThreadKind::ALL {
            let bpf = compile(kind).unwrap_or_else(|e| panic!("{e}"));
            assert!(!bpf.is_empty(), "{kind:?}");
        }
    }
}
