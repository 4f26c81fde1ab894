//! Exit accounting: every vCPU exit counted by kind and by device, lock-free, and per guest
//! phase (op) through snapshots taken when the probe marks a phase. Each device's guest-error
//! count (from its [`DeviceLog`]) is read into the same snapshots.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::bus::DeviceId;
use crate::logging::{DeviceLog, QueueTotals};

/// How a vCPU left the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitKind {
    /// `in` from a port.
    PioRead,
    /// `out` to a port.
    PioWrite,
    /// Load from MMIO (or from memory with no slot).
    MmioRead,
    /// Store to MMIO (or to a read-only slot).
    MmioWrite,
    /// Anything else (hlt, shutdown, interrupt window, ...).
    Other,
}

impl ExitKind {
    /// All kinds, in counter order.
    pub const ALL: [ExitKind; 5] = [
        ExitKind::PioRead,
        ExitKind::PioWrite,
        ExitKind::MmioRead,
        ExitKind::MmioWrite,
        ExitKind::Other,
    ];

    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            ExitKind::PioRead => "pio-read",
            ExitKind::PioWrite => "pio-write",
            ExitKind::MmioRead => "mmio-read",
            ExitKind::MmioWrite => "mmio-write",
            ExitKind::Other => "other",
        }
    }
}

/// Counters shared by all vCPUs. `by_device` has one extra last slot for unclaimed addresses.
#[derive(Debug)]
pub struct ExitCounters {
    by_kind: [AtomicU64; 5],
    by_device: Vec<AtomicU64>,
    /// Each device's log, once attached; the last slot is the unclaimed-access log.
    logs: Vec<OnceLock<Arc<DeviceLog>>>,
}

/// A copy of the counters at one moment, or the difference of two.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExitSnapshot {
    /// Exits by [`ExitKind`], in `ExitKind::ALL` order.
    pub by_kind: [u64; 5],
    /// Exits by device id; the last slot is "no device".
    pub by_device: Vec<u64>,
    /// Guest errors by device id, as `by_device`; the last slot counts accesses to unclaimed
    /// addresses. Devices without an attached log count 0.
    pub guest_errors: Vec<u64>,
    /// CPU time of each device's own thread (virtio devices), in nanoseconds, as `by_device`.
    pub thread_cpu_ns: Vec<u64>,
    /// Frames each device's backend found with a wrong payload (the sink), as `by_device`.
    pub bad_frames: Vec<u64>,
}

impl ExitCounters {
    /// Counters for `devices` devices (plus the "no device" slot).
    pub fn new(devices: usize) -> Self {
        let logs: Vec<OnceLock<Arc<DeviceLog>>> = (0..=devices).map(|_| OnceLock::new()).collect();
        let _ = logs[devices].set(DeviceLog::new("no device"));
        ExitCounters {
            by_kind: Default::default(),
            by_device: (0..=devices).map(|_| AtomicU64::new(0)).collect(),
            logs,
        }
    }

    /// Count the guest errors of `log` as those of device `id` in every snapshot. Returns
    /// false, attaching nothing, for an unknown id or one that has a log already.
    pub fn attach_log(&self, id: DeviceId, log: Arc<DeviceLog>) -> bool {
        id < self.logs.len() - 1 && self.logs[id].set(log).is_ok()
    }

    /// The log of accesses to addresses no device claims.
    pub fn unclaimed_log(&self) -> &DeviceLog {
        self.logs
            .last()
            .and_then(OnceLock::get)
            .expect("set by ExitCounters::new")
    }

    /// Count one exit.
    pub fn record(&self, kind: ExitKind, device: Option<DeviceId>) {
        self.by_kind[kind as usize].fetch_add(1, Ordering::Relaxed);
        if matches!(kind, ExitKind::Other) {
            return;
        }
        let slot = device
            .filter(|&d| d < self.by_device.len() - 1)
            .unwrap_or(self.by_device.len() - 1);
        self.by_device[slot].fetch_add(1, Ordering::Relaxed);
    }

    /// The I/O counters of each queue device `id`'s thread serves, by queue index (empty for
    /// a device with no queues of exitless's, or no log attached).
    pub fn queue_totals(&self, id: DeviceId) -> Vec<QueueTotals> {
        let log = self.logs.get(id).and_then(OnceLock::get);
        log.map(|l| l.queue_totals()).unwrap_or_default()
    }

    /// Current values.
    pub fn snapshot(&self) -> ExitSnapshot {
        ExitSnapshot {
            by_kind: std::array::from_fn(|i| self.by_kind[i].load(Ordering::Relaxed)),
            by_device: self
                .by_device
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            guest_errors: self
                .logs
                .iter()
                .map(|l| l.get().map_or(0, |l| l.guest_errors()))
                .collect(),
            thread_cpu_ns: self
                .logs
                .iter()
                .map(|l| l.get().map_or(0, |l| l.thread_cpu_ns()))
                .collect(),
            bad_frames: self
                .logs
                .iter()
                .map(|l| l.get().map_or(0, |l| l.bad_frames()))
                .collect(),
        }
    }
}

/// CPU time so far on `clock` (`CLOCK_THREAD_CPUTIME_ID`: the calling thread's;
/// `CLOCK_PROCESS_CPUTIME_ID`: every thread's), 0 if the clock cannot be read.
pub fn cpu_time(clock: libc::clockid_t) -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec passed.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// `now - earlier`, slot by slot (a slot `earlier` lacks counts from 0).
fn since(now: &[u64], earlier: &[u64]) -> Vec<u64> {
    now.iter()
        .zip(earlier.iter().chain(std::iter::repeat(&0)))
        .map(|(a, b)| a.saturating_sub(*b))
        .collect()
}

impl ExitSnapshot {
    /// `self - earlier`, counter by counter.
    pub fn since(&self, earlier: &ExitSnapshot) -> ExitSnapshot {
        ExitSnapshot {
            by_kind: std::array::from_fn(|i| self.by_kind[i] - earlier.by_kind[i]),
            by_device: self
                .by_device
                .iter()
                .zip(&earlier.by_device)
                .map(|(a, b)| a - b)
                .collect(),
            guest_errors: since(&self.guest_errors, &earlier.guest_errors),
            thread_cpu_ns: since(&self.thread_cpu_ns, &earlier.thread_cpu_ns),
            bad_frames: since(&self.bad_frames, &earlier.bad_frames),
        }
    }

    /// Frames with a wrong payload device `id`'s backend counted.
    pub fn bad_frames_of(&self, id: DeviceId) -> u64 {
        self.bad_frames.get(id).copied().unwrap_or(0)
    }

    /// CPU time device `id`'s own thread spent, in nanoseconds.
    pub fn thread_cpu_ns_of(&self, id: DeviceId) -> u64 {
        self.thread_cpu_ns.get(id).copied().unwrap_or(0)
    }

    /// Take back one exit of `kind` at `device` (a bookkeeping exit that is not the guest's
    /// work, such as the probe's phase mark).
    pub fn discount(&mut self, kind: ExitKind, device: DeviceId) {
        let k = &mut self.by_kind[kind as usize];
        *k = k.saturating_sub(1);
        if let Some(d) = self.by_device.get_mut(device) {
            *d = d.saturating_sub(1);
        }
    }

    /// Exits of one kind.
    pub fn of_kind(&self, kind: ExitKind) -> u64 {
        self.by_kind[kind as usize]
    }

    /// Exits that reached device `id`.
    pub fn of_device(&self, id: DeviceId) -> u64 {
        self.by_device.get(id).copied().unwrap_or(0)
    }

    /// All exits.
    pub fn total(&self) -> u64 {
        self.by_kind.iter().sum()
    }

    /// Guest errors device `id` counted.
    pub fn guest_errors_of(&self, id: DeviceId) -> u64 {
        self.guest_errors.get(id).copied().unwrap_or(0)
    }

    /// The devices that counted guest errors, by name (`names` indexed by device id; the
    /// unclaimed-access slot is "no device"), for reports.
    pub fn guest_errors_by_name(&self, names: &[String]) -> BTreeMap<String, u64> {
        self.guest_errors
            .iter()
            .enumerate()
            .filter(|&(_, &n)| n > 0)
            .map(|(id, &n)| {
                let name = names.get(id).map_or("no device", String::as_str);
                (name.to_owned(), n)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_kind_and_device_and_differences() {
        let c = ExitCounters::new(2);
        let before = c.snapshot();
        c.record(ExitKind::PioWrite, Some(1));
        c.record(ExitKind::MmioRead, None);
        c.record(ExitKind::MmioRead, Some(7)); // unknown ids count as "no device"
        c.record(ExitKind::Other, None);
        let d = c.snapshot().since(&before);
        assert_eq!(d.total(), 4);
        assert_eq!(d.of_kind(ExitKind::MmioRead), 2);
        assert_eq!(d.of_device(1), 1);
        assert_eq!(d.of_device(2), 2);
        assert_eq!(d.of_device(0), 0);
    }

    #[test]
    fn guest_errors_are_counted_per_device_in_snapshots() {
        let c = ExitCounters::new(2);
        let log = DeviceLog::new("dev1");
        assert!(c.attach_log(1, log.clone()));
        assert!(
            !c.attach_log(1, DeviceLog::new("again")),
            "one log per device"
        );
        assert!(!c.attach_log(2, DeviceLog::new("the no-device slot")));
        let before = c.snapshot();
        crate::guest_error!(log, "bad access");
        crate::guest_error!(log, "bad access");
        crate::guest_error!(c.unclaimed_log(), "nobody there");
        let d = c.snapshot().since(&before);
        assert_eq!(d.guest_errors, vec![0, 2, 1]);
        assert_eq!(d.guest_errors_of(1), 2);
        assert_eq!(d.guest_errors_of(9), 0);
        let names = ["dev0".to_owned(), "dev1".to_owned()];
        let by_name = d.guest_errors_by_name(&names);
        assert_eq!(by_name.get("dev1"), Some(&2));
        assert_eq!(by_name.get("no device"), Some(&1));
        assert_eq!(by_name.len(), 2, "devices without errors are left out");
    }
}
