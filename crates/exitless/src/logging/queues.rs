//! Per-queue I/O counters of a device whose queues exitless serves itself: what each queue
//! carried (requests or frames, and bytes each way) and what went wrong on it, by cause. The
//! device thread adds to them, once per pass over a ring for the common counts; the API
//! (`vm.counters`) reads them at any time. Lock-free and always on: a few relaxed atomic adds
//! per pass.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a request or a frame did not go through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The driver's request or buffers were wrong (a guest error: also counted, and logged,
    /// on the device's log).
    Guest,
    /// The host side failed or refused it: the disk file, the tap, the backend.
    Backend,
    /// The IOMMU refused a buffer (the fault is the unit's to report); the chain completed
    /// with nothing written.
    Iommu,
}

/// What one pass over a ring did, added to a queue's counters at its end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Requests or frames completed (a frame over several mergeable buffers counts once).
    pub completed: u64,
    /// Bytes of the driver's readable buffers the device was given.
    pub bytes_read: u64,
    /// Bytes the device wrote into the driver's writable buffers (the used lengths).
    pub bytes_written: u64,
    /// Chains completed with nothing written because the IOMMU refused a buffer.
    pub iommu_faults: u64,
}

/// One queue's counters.
#[derive(Debug, Default)]
pub struct QueueCounters {
    completed: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    guest_errors: AtomicU64,
    backend_errors: AtomicU64,
    iommu_faults: AtomicU64,
}

/// A copy of one queue's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueTotals {
    /// Requests (virtio-blk) or frames (virtio-net) completed, errors included.
    pub completed: u64,
    /// Bytes of the driver's buffers the device read (headers included).
    pub bytes_read: u64,
    /// Bytes the device wrote into the driver's buffers (headers and status included).
    pub bytes_written: u64,
    /// Requests answered with an error status, or frames dropped, by cause.
    pub errors: ErrorTotals,
}

/// Errors by [`Cause`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ErrorTotals {
    /// The driver's fault.
    pub guest: u64,
    /// The host's side.
    pub backend: u64,
    /// Refused by the IOMMU.
    pub iommu: u64,
}

impl QueueCounters {
    /// Add what a pass over the ring did.
    pub fn add(&self, tally: &Tally) {
        for (counter, n) in [
            (&self.completed, tally.completed),
            (&self.bytes_read, tally.bytes_read),
            (&self.bytes_written, tally.bytes_written),
            (&self.iommu_faults, tally.iommu_faults),
        ] {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// Count one request or frame that failed for `cause`.
    pub fn error(&self, cause: Cause) {
        let counter = match cause {
            Cause::Guest => &self.guest_errors,
            Cause::Backend => &self.backend_errors,
            Cause::Iommu => &self.iommu_faults,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn totals(&self) -> QueueTotals {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        QueueTotals {
            completed: load(&self.completed),
            bytes_read: load(&self.bytes_read),
            bytes_written: load(&self.bytes_written),
            errors: ErrorTotals {
                guest: load(&self.guest_errors),
                backend: load(&self.backend_errors),
                iommu: load(&self.iommu_faults),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_and_errors_add_up_by_cause() {
        let q = QueueCounters::default();
        q.add(&Tally {
            completed: 2,
            bytes_read: 32,
            bytes_written: 1025,
            iommu_faults: 1,
        });
        q.add(&Tally::default());
        q.error(Cause::Guest);
        q.error(Cause::Backend);
        q.error(Cause::Backend);
        q.error(Cause::Iommu);
        let t = q.totals();
        assert_eq!((t.completed, t.bytes_read, t.bytes_written), (2, 32, 1025));
        assert_eq!(
            t.errors,
            ErrorTotals {
                guest: 1,
                backend: 2,
                iommu: 2
            }
        );
    }
}
