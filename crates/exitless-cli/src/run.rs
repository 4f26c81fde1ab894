//! `exitless run`: its arguments made into the library's run or restore configuration, and
//! how the run's end becomes the process's status.

use std::path::PathBuf;
use std::time::Duration;

use exitless::api::ApiSocket;
use exitless::logging::stderr_line;
use exitless::machine::migration::Listener;
use exitless::machine::pc::incoming::IncomingConfig;
use exitless::machine::pc::restore::RestoreConfig;
use exitless::machine::pc::{RunConfig, RunError, RunOutcome};
use exitless::machine::{Console, Overflow};
use exitless::vm::run_control;

use crate::cli::RunArgs;

/// `exitless run`'s status when the guest runs past --timeout: timeout(1)'s, and even.
const RUN_TIMEOUT_STATUS: u8 = 124;

/// Boot the kernel, restore the snapshot, or run the VM that comes to `incoming` (the bound
/// `--migrate-from`), serving `api` if given; the status to exit with.
pub fn run(
    args: RunArgs,
    api: Option<ApiSocket>,
    incoming: Option<Listener>,
) -> Result<u8, String> {
    // A path, as --kernel's: any bytes the file system takes, not only UTF-8.
    let console = if args.console.as_os_str() == "stdio" {
        Console::Stdio
    } else {
        Console::File(args.console)
    };
    let console_overflow = if args.console_drop {
        Overflow::Drop
    } else {
        Overflow::Hold
    };
    // 0 is no limit, as for timeout(1).
    let timeout = args
        .timeout
        .filter(|&seconds| seconds != 0)
        .map(Duration::from_secs);
    let serve = |view| api.map(|socket: ApiSocket| socket.serve(view)).transpose();
    let ran = match (args.restore, args.kernel) {
        _ if let Some(listener) = incoming => IncomingConfig {
            listener,
            console,
            console_overflow,
            timeout,
        }
        .run_with(serve),
        (Some(dir), _) => RestoreConfig {
            dir,
            console,
            console_overflow,
            timeout,
            paused: args.paused,
        }
        .run_with(serve),
        (None, _) if args.paused => {
            return Err("--paused is for --restore DIR: a kernel boots running".into());
        }
        (None, Some(kernel)) => RunConfig {
            kernel,
            initrd: args.initrd,
            cmdline: args.cmdline,
            memory_mib: args.memory,
            cpus: args.cpus,
            ecam: args.ecam.mode(),
            iommu: args.iommu,
            console,
            console_overflow,
            disks: args.disk,
            nets: args.net,
            timeout,
            dump_guest_memory: args.dump_guest_memory,
            shared_memory: args.shared_memory,
            cpu: args.cpu,
        }
        .run_with(serve),
        // clap requires one of them.
        (None, None) => return Err("--kernel FILE or --restore DIR".into()),
    };
    match ran {
        Ok(outcome @ RunOutcome::Panicked) => {
            stderr_line(format_args!(
                "exitless: the guest's kernel panicked (it said so on the pvpanic port); its console says why"
            ));
            Ok(outcome.exit_status())
        }
        Ok(outcome @ RunOutcome::Migrated) => {
            stderr_line(format_args!(
                "exitless: the VM went to its migration target, where it runs on"
            ));
            Ok(outcome.exit_status())
        }
        Ok(outcome) => Ok(outcome.exit_status()),
        Err(e @ RunError::TimedOut(_)) => {
            stderr_line(format_args!("exitless: {e}"));
            Ok(RUN_TIMEOUT_STATUS)
        }
        Err(RunError::Signal(signal)) => {
            // The run is over (devices stopped, files closed); end as the signal would have.
            exitless::logging::flush();
            run_control::end_by_signal(signal)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// `exitless run --migrate-from`'s socket, bound.
pub fn migration_listener(args: &RunArgs) -> Result<Option<Listener>, String> {
    let listen = |address: &exitless::machine::migration::Address| {
        address.listen().map_err(|e| e.to_string())
    };
    args.migrate_from.as_ref().map(listen).transpose()
}

/// `exitless run --api-socket`'s socket, bound.
pub fn api_socket(args: &RunArgs) -> Result<Option<ApiSocket>, String> {
    let bind = |path: &PathBuf| ApiSocket::bind(path).map_err(|e| e.to_string());
    args.api_socket.as_ref().map(bind).transpose()
}
