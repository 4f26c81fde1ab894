//! A one-line description of the host, printed with every result: absolute numbers mean little
//! without it (docs/host-kvm.md: the software KVM here inflates them about tenfold); and how busy
//! the host is before measuring (a busy host's figures are noisy).

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::model::HostLoad;

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

/// Other processes' CPU time, in percent of one CPU, above which the host is called busy: one
/// CPU's worth of work elsewhere takes a tenth of the time a vCPU could have, and the tick
/// accounting of a short window is coarse (one 10 ms tick is 3% of 300 ms), so less than this
/// is not told apart from an idle host.
pub const BUSY_OTHERS_PERCENT: f64 = 10.0;
/// The 1-minute load average per online CPU above which the host is called busy: half the
/// CPUs had a runnable task on average. It lags a minute (a build just before the bench
/// counts); the window's figure is the present.
pub const BUSY_LOAD_PER_CPU: f64 = 0.5;
/// How long other processes' CPU time is watched.
pub const LOAD_WINDOW: Duration = Duration::from_millis(300);

/// The 1-minute load average of `/proc/loadavg`'s contents.
pub fn parse_loadavg(loadavg: &str) -> Option<f64> {
    loadavg.split_whitespace().next()?.parse().ok()
}

/// The CPUs of a `/proc/self/status`'s `Cpus_allowed_list` (`0-3,6`).
pub fn parse_allowed_cpus(status: &str) -> Option<Vec<usize>> {
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
        .trim();
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((lo, hi)) => {
                cpus.extend(lo.trim().parse::<usize>().ok()?..=hi.trim().parse().ok()?)
            }
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    Some(cpus)
}

/// From `/proc/stat`'s contents: the busy ticks (user, nice, system, irq, softirq, steal; not
/// idle or iowait) of the CPUs in `allowed` (every CPU if `None`), and how many CPUs are online.
pub fn parse_stat_busy(stat: &str, allowed: Option<&[usize]>) -> Option<(u64, usize)> {
    let (mut busy, mut online) = (0u64, 0usize);
    for line in stat.lines() {
        let Some((cpu, rest)) = line.strip_prefix("cpu").and_then(|r| r.split_once(' ')) else {
            continue;
        };
        let Ok(n) = cpu.parse::<usize>() else {
            continue; // the all-CPU line
        };
        online += 1;
        if allowed.is_some_and(|a| !a.contains(&n)) {
            continue;
        }
        let f: Vec<u64> = rest
            .split_whitespace()
            .map_while(|v| v.parse().ok())
            .collect();
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        busy += at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    }
    (online > 0).then_some((busy, online))
}

/// User plus system ticks of every thread of the process, from a `/proc/PID/stat`'s contents.
pub fn parse_process_ticks(stat: &str) -> Option<u64> {
    // Fields after the command name (which may hold spaces): state is field 3, utime 14.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// One reading of the CPU counters: busy ticks of the CPUs this process may use, its own ticks.
#[derive(Clone, Copy, Debug)]
pub struct CpuSample {
    /// Busy ticks of the allowed CPUs.
    pub busy: u64,
    /// This process's ticks.
    pub own: u64,
}

/// What others took between two samples `seconds` apart, in percent of one CPU.
pub fn others_percent(before: CpuSample, after: CpuSample, seconds: f64, ticks_per_s: f64) -> f64 {
    let all = after.busy.saturating_sub(before.busy);
    let own = after.own.saturating_sub(before.own);
    all.saturating_sub(own) as f64 / ticks_per_s / seconds * 100.0
}

/// Whether `load` makes the figures noisy, by the thresholds above.
pub fn is_busy(load: &HostLoad) -> bool {
    load.others_cpu_percent > BUSY_OTHERS_PERCENT
        || load.loadavg1 / load.cpus_online.max(1) as f64 > BUSY_LOAD_PER_CPU
}

fn read_sample(allowed: Option<&[usize]>) -> Option<(CpuSample, usize)> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let (busy, online) = parse_stat_busy(&stat, allowed)?;
    let own = parse_process_ticks(&fs::read_to_string("/proc/self/stat").ok()?)?;
    Some((CpuSample { busy, own }, online))
}

/// Read the load average and watch other processes' CPU time for [`LOAD_WINDOW`]; `None` where
/// /proc does not tell.
pub fn sample_load() -> Option<HostLoad> {
    let loadavg1 = parse_loadavg(&fs::read_to_string("/proc/loadavg").ok()?)?;
    let allowed = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| parse_allowed_cpus(&s));
    // SAFETY: sysconf reads a constant; it touches no memory of ours.
    let ticks_per_s = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        t if t > 0 => t as f64,
        _ => 100.0,
    };
    let started = Instant::now();
    let (before, online) = read_sample(allowed.as_deref())?;
    std::thread::sleep(LOAD_WINDOW);
    let (after, _) = read_sample(allowed.as_deref())?;
    let seconds = started.elapsed().as_secs_f64();
    Some(HostLoad {
        loadavg1,
        others_cpu_percent: others_percent(before, after, seconds, ticks_per_s),
        cpus_online: online,
        cpus_watched: allowed.map_or(online, |a| a.len()),
        window_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    })
}

/// The line printed on stderr when `load` is busy.
pub fn busy_line(load: &HostLoad) -> String {
    format!(
        "exitless: the host is busy (other processes used {:.0}% of a CPU over {} ms, \
         1-minute load {:.2} on {} CPUs): the figures will be noisy",
        load.others_cpu_percent, load.window_ms, load.loadavg1, load.cpus_online
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  300 0 100 5000 20 0 0 0 0 0\n\
                        cpu0 100 0 50 2500 10 0 0 0 0 0\n\
                        cpu1 200 0 50 2500 10 0 0 0 0 0\n\
                        intr 12345 0 0\nctxt 999\n";

    fn load(loadavg1: f64, others: f64) -> HostLoad {
        HostLoad {
            loadavg1,
            others_cpu_percent: others,
            cpus_online: 2,
            cpus_watched: 2,
            window_ms: 300,
        }
    }

    #[test]
    fn parses_proc_contents() {
        assert_eq!(parse_loadavg("0.42 0.30 0.10 1/234 5678\n"), Some(0.42));
        assert_eq!(parse_loadavg(""), None);
        let status = "Name:\texitless\nCpus_allowed:\tf\nCpus_allowed_list:\t0-2,5\n";
        assert_eq!(parse_allowed_cpus(status), Some(vec![0, 1, 2, 5]));
        assert_eq!(parse_stat_busy(STAT, None), Some((400, 2)));
        assert_eq!(parse_stat_busy(STAT, Some(&[1])), Some((250, 2)));
        // The command name may hold spaces and parentheses; utime 7 and stime 3 follow.
        let me = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0";
        assert_eq!(parse_process_ticks(me), Some(10));
        assert_eq!(parse_process_ticks("garbage"), None);
    }

    #[test]
    fn others_exclude_this_process() {
        let before = CpuSample { busy: 400, own: 10 };
        // 30 ticks in 0.3 s at 100 Hz, 6 of them ours: others took 80% of one CPU.
        let after = CpuSample { busy: 430, own: 16 };
        let p = others_percent(before, after, 0.3, 100.0);
        assert!((p - 80.0).abs() < 1e-9, "{p}");
        // Counters never make a negative share.
        assert_eq!(others_percent(after, before, 0.3, 100.0), 0.0);
    }

    #[test]
    fn busy_by_either_threshold() {
        assert!(!is_busy(&load(0.2, 3.0)));
        assert!(is_busy(&load(0.2, 25.0)), "others over 10% of a CPU");
        assert!(is_busy(&load(1.5, 0.0)), "load 0.75 per CPU");
        assert!(!is_busy(&load(1.0, 10.0)), "at both thresholds, not above");
        assert!(busy_line(&load(1.5, 25.0)).contains("noisy"));
    }
}
