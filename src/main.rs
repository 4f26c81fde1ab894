//! The `exitless` command line. Everything else lives in the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use exitless::bench::{Report, host, pci::PciBench, report};

/// exitless: a KVM VMM whose device I/O avoids VM exits, and the benchmarks that prove it.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Boot the embedded probe guest once per configuration and print, per scenario, every
    /// variant side by side: time ratios first, the seed's ratios beside them, then time and
    /// exits per operation, with the host named.
    Bench(BenchArgs),
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// PCI config space by port I/O, trapped ECAM and shadowed ECAM (T1, seed 000).
    Pci,
}

#[derive(clap::Args)]
struct BenchArgs {
    /// Scenarios to run (default: all).
    #[arg(value_enum)]
    scenarios: Vec<Scenario>,
    /// Print the report as JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Also write an SVG chart of the results to this file.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Config reads per read variant of `pci` (the seed used 100000).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    reads: u64,
    /// Enumerations per method in `pci`; the median is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=100))]
    enumerations: u16,
    /// Give up on a guest run after this many seconds.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    timeout: u64,
}

fn bench(args: BenchArgs) -> Result<(), String> {
    let scenarios = if args.scenarios.is_empty() {
        vec![Scenario::Pci]
    } else {
        args.scenarios
    };
    let mut report = Report {
        host: host::describe(),
        scenarios: Vec::new(),
    };
    for scenario in scenarios {
        let result = match scenario {
            Scenario::Pci => PciBench {
                reads: args.reads,
                enumerations: args.enumerations,
                timeout: Duration::from_secs(args.timeout),
            }
            .run(),
        };
        report.scenarios.push(result.map_err(|e| e.to_string())?);
    }
    if args.json {
        println!("{}", report::json(&report));
    } else {
        print!("{}", report::text(&report));
    }
    if let Some(path) = args.svg {
        std::fs::write(&path, report::svg(&report))
            .map_err(|e| format!("cannot write the chart to {}: {e}", path.display()))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exitless: error: {e}");
            ExitCode::FAILURE
        }
    }
}
