//! The S3 sleeping state (ACPI 6.5 §16.1.3, §7.4.2.4): suspend-to-RAM as a machine without
//! firmware does it. A sleep request stops every vCPU (they park on their threads, kicked out of
//! `KVM_RUN` by the VMM thread) with memory and device state kept; a wake event then restarts
//! the boot vCPU at the waking vector the OS left in the FACS (§5.2.10) and puts the others in
//! wait-for-SIPI, as firmware would hand over.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// Where the boot vCPU resumes, as firmware hands over to the waking vector (ACPI 6.5 §5.2.10).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakeEntry {
    /// Real mode at `cs:ip`: the 32-bit Firmware Waking Vector, CS = vector >> 4 and
    /// IP = vector & 0xF.
    Real {
        /// The code segment's selector (its base is `cs << 4`).
        cs: u16,
        /// The instruction pointer.
        ip: u16,
    },
    /// 32-bit protected mode, paging off, at this physical address: the X_Firmware_Waking_Vector
    /// when the OS set it and left 64BIT_WAKE_F clear.
    Protected32(u32),
}

/// Where the machine is in the sleep cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Running.
    Awake,
    /// SLP_EN written: the vCPUs are parking. A wake event now wakes the machine as soon as
    /// it is asleep.
    Entering,
    /// Every vCPU parked: a wake event resumes.
    Asleep,
}

struct State {
    phase: Phase,
    entry: WakeEntry,
    /// A wake event came while entering.
    wake_pending: bool,
    /// vCPUs parked, out of the machine's `vcpus`.
    parked: u8,
    vcpus: u8,
    /// Counts the wakes, so a parked vCPU knows its sleep ended.
    wakes: u64,
}

/// The sleep state shared by the power-management block (which asks for it and reports wake
/// events), the vCPU threads (which park) and the VMM thread (which kicks them out of the guest).
pub struct Sleep {
    /// Whether a vCPU must park before it enters the guest again: read before every entry.
    parking: AtomicBool,
    /// Set at each wake: PM1 status's WAK_STS until the guest clears it.
    woke: AtomicBool,
    state: Mutex<State>,
    changed: Condvar,
}

impl Default for Sleep {
    fn default() -> Self {
        Sleep {
            parking: AtomicBool::new(false),
            woke: AtomicBool::new(false),
            state: Mutex::new(State {
                phase: Phase::Awake,
                entry: WakeEntry::Real { cs: 0, ip: 0 },
                wake_pending: false,
                parked: 0,
                vcpus: 1,
                wakes: 0,
            }),
            changed: Condvar::new(),
        }
    }
}

/// How often a parked vCPU looks whether the run is stopping (a stop also notifies it; this
/// bounds a missed notification).
const PARK_POLL: Duration = Duration::from_millis(50);

impl Sleep {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many vCPUs must park before the machine is asleep.
    pub fn set_vcpus(&self, vcpus: u8) {
        self.lock().vcpus = vcpus.max(1);
    }

    /// Enter S3, to resume at `entry`. Ignored while a sleep is already under way.
    pub fn suspend(&self, entry: WakeEntry) {
        let mut state = self.lock();
        if state.phase != Phase::Awake {
            return;
        }
        (state.phase, state.entry, state.wake_pending) = (Phase::Entering, entry, false);
        self.parking.store(true, Ordering::Release);
        self.changed.notify_all();
    }

    /// A wake event (an enabled RTC alarm, a console key): resume if asleep, or as soon as
    /// asleep if entering; nothing while awake. Returns whether it woke (or will wake) the
    /// machine.
    pub fn wake(&self) -> bool {
        let mut state = self.lock();
        match state.phase {
            Phase::Awake => false,
            Phase::Entering => {
                state.wake_pending = true;
                true
            }
            Phase::Asleep => {
                self.resume(&mut state);
                true
            }
        }
    }

    /// Whether the machine woke since [`Sleep::clear_woke`] (ACPI 6.5 §4.8.3.1.1, WAK_STS).
    pub fn woke(&self) -> bool {
        self.woke.load(Ordering::Acquire)
    }

    /// The guest cleared WAK_STS.
    pub fn clear_woke(&self) {
        self.woke.store(false, Ordering::Release);
    }

    fn resume(&self, state: &mut State) {
        self.woke.store(true, Ordering::Release);
        state.phase = Phase::Awake;
        state.wakes += 1;
        self.changed.notify_all();
    }

    /// Whether this vCPU must park ([`Sleep::park`]) before it enters the guest again.
    pub fn must_park(&self) -> bool {
        self.parking.load(Ordering::Acquire)
    }

    /// Whether the vCPUs are being put to sleep and some still run: the VMM thread kicks them.
    pub fn entering(&self) -> bool {
        self.lock().phase == Phase::Entering
    }

    /// Whether the machine is asleep.
    pub fn asleep(&self) -> bool {
        self.lock().phase == Phase::Asleep
    }

    /// Park the calling vCPU until the machine wakes (`Some`: where the boot vCPU resumes) or
    /// `stopping` says the run ends (`None`). The last vCPU to park puts the machine to sleep.
    pub fn park(&self, stopping: impl Fn() -> bool) -> Option<WakeEntry> {
        let mut state = self.lock();
        if state.phase != Phase::Entering {
            return None;
        }
        let wakes = state.wakes;
        state.parked += 1;
        if state.parked >= state.vcpus {
            state.phase = Phase::Asleep;
            self.parking.store(false, Ordering::Release);
            if state.wake_pending {
                self.resume(&mut state);
            }
            self.changed.notify_all();
        }
        while state.wakes == wakes && !stopping() {
            state = self
                .changed
                .wait_timeout(state, PARK_POLL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state.parked -= 1;
        (state.wakes != wakes).then_some(state.entry)
    }

    /// Wake every parked vCPU so it sees the run stopping.
    pub fn notify_stop(&self) {
        let _state = self.lock();
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const ENTRY: WakeEntry = WakeEntry::Real { cs: 0x100, ip: 4 };

    #[test]
    fn a_wake_while_awake_does_nothing() {
        let sleep = Sleep::default();
        assert!(!sleep.wake());
        assert!(!sleep.must_park());
        assert_eq!(sleep.park(|| false), None, "nothing to park for");
    }

    #[test]
    fn the_last_vcpu_to_park_puts_the_machine_to_sleep_and_a_wake_resumes_all() {
        let sleep = Arc::new(Sleep::default());
        sleep.set_vcpus(2);
        sleep.suspend(ENTRY);
        assert!(sleep.must_park() && sleep.entering());
        let parked: Vec<_> = (0..2)
            .map(|_| {
                let sleep = sleep.clone();
                std::thread::spawn(move || sleep.park(|| false))
            })
            .collect();
        while !sleep.asleep() {
            std::thread::yield_now();
        }
        assert!(!sleep.must_park());
        assert!(sleep.wake());
        for p in parked {
            assert_eq!(p.join().unwrap(), Some(ENTRY));
        }
        assert!(!sleep.asleep() && !sleep.entering());
    }

    #[test]
    fn a_wake_while_entering_resumes_once_asleep_and_a_stop_unparks() {
        let sleep = Sleep::default();
        sleep.suspend(ENTRY);
        assert!(sleep.wake(), "pending");
        assert_eq!(sleep.park(|| false), Some(ENTRY), "woke at once");
        sleep.suspend(ENTRY);
        assert_eq!(sleep.park(|| true), None, "the run stops");
    }
}
