//! A one-line description of the host, printed with every result: absolute numbers mean little
//! without it (docs/host-kvm.md: the software KVM here inflates them about tenfold).

use std::fs;
use std::path::Path;

/// CPU model, CPU count, kernel, and which KVM module is loaded.
pub fn describe() -> String {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let kvm = ["kvm_pvm", "kvm_intel", "kvm_amd"]
        .into_iter()
        .find(|m| Path::new("/sys/module").join(m).exists())
        .map_or("kvm".to_owned(), |m| match m {
            "kvm_pvm" => "kvm_pvm (software KVM: ring 0 emulated, ~35 us exits)".to_owned(),
            other => format!("{other} (hardware-assisted)"),
        });
    format!("{model}, {cpus} CPUs, Linux {}, {kvm}", kernel.trim())
}
