//! The `exitless` binary: parse the command line ([`cli`]) and hand each command to the
//! library.

mod cli;
mod fd_limit;
mod probe_report;
mod run;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use exitless::api::client;
use exitless::contract::STATUS_OK;
use exitless::logging::stderr_line;
use exitless::machine::ProbeConfig;
use exitless::seccomp::{self, ThreadKind};
use exitless::vm::run_control;
use exitless_bench::options::BenchOptions;
use exitless_bench::restore;
use exitless_bench::session::{self, Session};

use crate::cli::{Cli, Command, CtlArgs, ProbeArgs, RestoreChildArgs};

/// `exitless run`'s status for an error of its own: even, so never a guest's isa-debug-exit
/// status (always odd), nor a clean exit.
const RUN_ERROR_STATUS: u8 = 2;
/// The status of a mistake on the command line, for every subcommand: clap's, and
/// `exitless run`'s own error status.
const USAGE_ERROR_STATUS: u8 = RUN_ERROR_STATUS;
/// `exitless bench`'s status for a `--baseline` file it cannot read or make sense of: the
/// usage error's, apart from a regression's (1).
const BASELINE_ERROR_STATUS: u8 = USAGE_ERROR_STATUS;

fn probe(args: ProbeArgs) -> Result<(), String> {
    if args.cpuid {
        return emit(&probe_report::cpuid(&args.cpu).map_err(|e| e.to_string())?);
    }
    let ecam = args.ecam.mode();
    let cfg = ProbeConfig {
        ecam,
        vcpus: args.vcpus,
        console_to_stdout: args.console,
        ..Default::default()
    };
    let run = probe_report::enumerate(cfg, args.method.method()).map_err(|e| e.to_string())?;
    if run.results[0].status != STATUS_OK {
        return Err(
            "the guest cannot enumerate by ECAM when none is described (use --ecam trap or shadow)"
                .into(),
        );
    }
    emit(&probe_report::describe(&run, ecam))
}

/// `exitless ctl`: connect, confine, ask, print the answer; a refusal's error on stderr and
/// status 1, nothing listening or no answer in time (`--timeout`) status 2.
fn ctl(args: CtlArgs, confine: impl FnOnce() -> Result<(), String>) -> Result<ExitCode, String> {
    let Some(socket) = &args.api_socket else {
        stderr_line(format_args!(
            "exitless: error: ctl needs the VM's socket: --api-socket PATH (see --help)"
        ));
        return Ok(ExitCode::from(USAGE_ERROR_STATUS));
    };
    let stream = match client::connect(socket) {
        Ok(stream) => stream,
        Err(e) => {
            stderr_line(format_args!("exitless: error: {e}"));
            return Ok(ExitCode::from(USAGE_ERROR_STATUS));
        }
    };
    let body = args.action.body()?;
    confine()?;
    let wait = Duration::from_secs(args.timeout);
    let answer = match client::request(stream, args.action.endpoint(), &body, wait) {
        Ok(answer) => answer,
        Err(e @ client::ClientError::NoAnswer(_)) => {
            stderr_line(format_args!("exitless: error: {e}"));
            return Ok(ExitCode::from(USAGE_ERROR_STATUS));
        }
        Err(e) => return Err(e.to_string()),
    };
    if !answer.ok() {
        return Err(format!("{} (HTTP {})", answer.error(), answer.status));
    }
    emit(&answer.body)?;
    Ok(ExitCode::SUCCESS)
}

/// Write `text` to stdout. A reader that went away (`exitless probe | head -2`) ends the
/// output normally, as for any Unix filter; other errors are reported.
fn emit(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(format!("cannot write the report to stdout: {e}"))
        }
        _ => Ok(()),
    }
}

/// `exitless bench`: the baseline read before anything boots, the peer's boots, the main
/// thread confined, the run, the report; status 1 for a regression under
/// `--fail-on-regression`, after one line naming the variants.
fn bench(
    options: BenchOptions,
    confine: impl FnOnce() -> Result<(), String>,
) -> Result<ExitCode, String> {
    let baseline = match session::load_baseline(&options) {
        Ok(baseline) => baseline,
        Err(e) => {
            stderr_line(format_args!("exitless: error: {e}"));
            return Ok(ExitCode::from(BASELINE_ERROR_STATUS));
        }
    };
    let session = Session::prepare(options)?.with_baseline(baseline);
    confine()?;
    let output = session.run()?;
    emit(&output.text)?;
    output.write_files()?;
    Ok(match output.regression() {
        Some(line) => {
            exitless::logging::flush();
            stderr_line(format_args!("exitless: {line}"));
            ExitCode::FAILURE
        }
        None => ExitCode::SUCCESS,
    })
}

/// `exitless bench-restore-child`: the restore, confined, and its figures on stdout; `entered`
/// is when `main` began (CLOCK_MONOTONIC).
fn restore_child(args: RestoreChildArgs, entered: Duration) -> Result<(), String> {
    let timeout = Duration::from_secs(args.timeout);
    let ops = args.ops;
    let report = restore::restore_child(&args.dir, args.strategy, ops, timeout, entered)
        .map_err(|e| e.to_string())?;
    emit(&report)
}

/// Parse the command line. A mistake in it gets one line and status 2 (clap's own status for
/// usage errors), as every other bad input does; `--help` and `--version` print as usual.
fn parse_command_line() -> Result<Cli, ExitCode> {
    Cli::try_parse().map_err(|e| {
        if !e.use_stderr() {
            // --help or --version: not an error.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        // clap's message is a paragraph (the error, maybe the arguments it names), then a blank
        // line and usage hints: the paragraph, joined into one line, says it all.
        let rendered = e.to_string();
        let paragraph: Vec<&str> = rendered
            .lines()
            .take_while(|line| !line.trim().is_empty())
            .map(str::trim)
            .collect();
        let message = paragraph.join(" ");
        let reason = message.strip_prefix("error: ").unwrap_or(&message);
        stderr_line(format_args!("exitless: error: {reason} (see --help)"));
        ExitCode::from(USAGE_ERROR_STATUS)
    })
}

fn main() -> ExitCode {
    // `bench restore` times a restore in a new exitless from its start: here, past exec.
    let entered = restore::monotonic();
    let cli = match parse_command_line() {
        Ok(cli) => cli,
        Err(status) => return status,
    };
    // `exitless run` exits with the guest's status, and its own errors with an even one.
    let error_status = match cli.command {
        // A restore as `run --restore` is: its errors get `run`'s status.
        Command::Run(_) | Command::BenchRestoreChild(_) => ExitCode::from(RUN_ERROR_STATUS),
        // Its only errors are a template this host cannot give, or no KVM: bad input.
        Command::Probe(ProbeArgs { cpuid: true, .. }) => ExitCode::from(USAGE_ERROR_STATUS),
        _ => ExitCode::FAILURE,
    };
    // Before any thread starts, so that each confines itself as it starts (the log writer now).
    if !cli.no_seccomp
        && let Err(e) = seccomp::enable()
    {
        stderr_line(format_args!("exitless: error: {e}"));
        return error_status;
    }
    // Before any thread starts, so that every thread inherits the unblocked signal mask.
    if let Command::Run(_) = cli.command
        && let Err(e) = run_control::stop_on_signals()
            .and_then(|()| run_control::write_past_file_size_limit_fails())
    {
        stderr_line(format_args!(
            "exitless: error: cannot handle SIGINT, SIGTERM, SIGHUP and SIGXFSZ: {e}"
        ));
        return error_status;
    }
    // Before the log writer, the first thread (see raise_open_file_limit).
    fd_limit::raise_open_file_limit();
    exitless::logging::init();
    // The main thread's own filter, before it builds any machine.
    let confine = || seccomp::confine(ThreadKind::Main).map_err(|e| e.to_string());
    let result = match cli.command {
        // The peer's boots (`--against`) come before the filter: QEMU would inherit it.
        Command::Bench(options) => bench(options, confine),
        Command::Probe(args) => confine()
            .and_then(|()| probe(args))
            .map(|()| ExitCode::SUCCESS),
        // The sockets are bound before the filter, which allows no bind(2).
        // The migration's first: once the control socket is there, so is it.
        Command::Run(args) => run::migration_listener(&args)
            .and_then(|incoming| Ok((run::api_socket(&args)?, incoming)))
            .and_then(|(api, incoming)| confine().and_then(|()| run::run(args, api, incoming)))
            .map(ExitCode::from),
        Command::Ctl(args) => ctl(args, confine),
        Command::BenchRestoreChild(args) => confine()
            .and_then(|()| restore_child(args, entered))
            .map(|()| ExitCode::SUCCESS),
        // Unconfined: it starts programs, as `bench` does before its filter (see
        // `exitless_bench::restore::Launcher`).
        Command::BenchRestoreLauncher => restore::serve_launcher().map(|()| ExitCode::SUCCESS),
    };
    // Log lines still queued come before the error, and are not lost at exit.
    exitless::logging::flush();
    result.unwrap_or_else(|e| {
        stderr_line(format_args!("exitless: error: {e}"));
        error_status
    })
}
