//! An Intel 8254 PIT at ports 0x40-0x43, with the PC's port 0x61 beside it (channel 2's gate
//! and OUT, the speaker's data enable, the refresh toggle), for machines KVM gives no PIT: a
//! split irqchip (`KVM_CREATE_PIT2` needs KVM's own PICs and IOAPIC), or a KVM without
//! `KVM_CAP_PIT2`. Channel 0's OUT rising edges are IRQ 0, which the MADT routes to GSI 2;
//! channel 2 is what Linux calibrates the TSC against; channel 1 (DRAM refresh) has no wire.
//!
//! Written here: no rust-vmm crate models the 8254 (crosvm's devices/src/pit.rs is one, inside
//! crosvm). The counters are a state machine of elapsed ticks without threads ([`counter`]); a
//! timer thread sleeps until channel 0's next rising edge and pulses IRQ 0. Edges the thread
//! wakes too late for are raised once, not one by one (a late tick is lost, as QEMU's
//! `lost_tick_policy=discard`), and IRQ 0 is raised at most every [`MIN_IRQ_PERIOD`].

mod counter;
mod persist;

use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;

use super::timer::{IDLE, Timed, TimerThread};
use crate::bus::BusDevice;
use crate::guest_error;
use crate::logging::DeviceLog;
use counter::Counter;

/// Counter 0's data port; counters 1 and 2 and the control word follow.
pub const PIT_PORT: u16 = 0x40;
/// Ports the PIT decodes.
pub const PIT_PORTS_LEN: u16 = 4;
/// The PC's NMI status and control port (port B), where channel 2's gate and OUT are.
pub const PORT_B: u16 = 0x61;
/// The GSI IRQ 0 reaches, as the MADT's interrupt source override says.
pub const PIT_GSI: u32 = 2;
/// The counters' input clock on a PC, in Hz.
pub const PIT_HZ: u64 = 1_193_182;
/// The shortest period IRQ 0 is raised at. KVM's own PIT clamps its periodic timer likewise
/// (its `min_timer_period_us`, 200 µs by default): a guest that loads a tiny count cannot
/// make the timer thread spin.
pub const MIN_IRQ_PERIOD: Duration = Duration::from_micros(200);

/// The control word's offset among the PIT's ports.
const CONTROL: u64 = 3;
/// Port B's bits (IBM PC/AT Technical Reference, "Port B"): channel 2's gate, the speaker's
/// data enable, the refresh request toggle (every 15.085 µs), channel 2's OUT.
const GATE2: u8 = 1 << 0;
const SPEAKER_DATA: u8 = 1 << 1;
const REFRESH: u8 = 1 << 4;
const OUT2: u8 = 1 << 5;
const REFRESH_PERIOD_NS: u128 = 15_085;
/// The tick count at the clock's start: past the longest span a restored counter's start lies
/// back ([`persist`] keeps at most two counter periods), so it never falls before tick 0.
const ORIGIN: u64 = 1 << 20;

/// Time since the machine started, or a test's.
pub type Clock = Box<dyn Fn() -> Duration + Send + Sync>;

/// The host's monotonic clock from now.
pub fn monotonic_clock() -> Clock {
    let start = Instant::now();
    Box::new(move || start.elapsed())
}

/// Ticks of the input clock in `time`.
fn ticks(time: Duration) -> u64 {
    u64::try_from(time.as_nanos() * u128::from(PIT_HZ) / 1_000_000_000).unwrap_or(u64::MAX)
}

/// The time `ticks` of the input clock take.
fn duration(ticks: u64) -> Duration {
    let nanos = u128::from(ticks) * 1_000_000_000 / u128::from(PIT_HZ);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// The chip: three counters, the speaker's data bit, and when IRQ 0 was last looked at.
#[derive(Default)]
struct Chip {
    counters: [Counter; 3],
    speaker_data: bool,
    /// Channel 0's edges up to this tick have been raised (or were before its count).
    irq_checked: u64,
    /// No IRQ 0 before this tick ([`MIN_IRQ_PERIOD`] after the last).
    irq_not_before: u64,
}

struct Shared {
    chip: Timed<Chip>,
    clock: Clock,
    irq: EventFd,
    log: Arc<DeviceLog>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Chip> {
        self.chip.lock()
    }

    /// The tick count now, from [`ORIGIN`].
    fn now(&self) -> u64 {
        ticks((self.clock)()) + ORIGIN
    }
}

/// The PIT and its timer thread (stopped and joined on drop).
pub struct Pit {
    shared: Arc<Shared>,
    _timer: TimerThread,
}

impl Pit {
    /// A PIT reading `clock`, pulsing `irq` on channel 0's rising edges; starts its timer.
    pub fn new(clock: Clock, irq: EventFd, log: Arc<DeviceLog>) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            chip: Timed::new(Chip::default()),
            clock,
            irq,
            log,
        });
        let timer = TimerThread::spawn("pit", &shared, |s| &s.chip, raise_due_edges)?;
        Ok(Pit {
            shared,
            _timer: timer,
        })
    }

    /// The device's log.
    pub fn log(&self) -> &Arc<DeviceLog> {
        &self.shared.log
    }

    /// Port B, which sits apart from the PIT's ports: a device of its own on the bus.
    pub fn port_b(self: &Arc<Self>) -> PortB {
        PortB(self.clone())
    }
}

/// The timer's step: pulse IRQ 0 at channel 0's rising edges that are due; the time until
/// the next.
fn raise_due_edges(shared: &Shared, chip: &mut Chip) -> Duration {
    let min_period = ticks(MIN_IRQ_PERIOD);
    loop {
        let now = shared.now();
        match chip.counters[0].next_rising_edge(chip.irq_checked) {
            Some(edge) if edge <= now && now >= chip.irq_not_before => {
                if let Err(e) = shared.irq.write(1) {
                    guest_error!(shared.log, "IRQ 0 lost: {e}");
                }
                chip.irq_checked = now;
                chip.irq_not_before = now.saturating_add(min_period);
            }
            Some(edge) => return duration(edge.max(chip.irq_not_before).saturating_sub(now)),
            None => return IDLE,
        }
    }
}

impl BusDevice for Pit {
    /// A counter's data port reads as its latched status, latched count or count; the
    /// control word cannot be read (the bus floats).
    fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        let (Some(first), Ok(index)) = (data.first_mut(), usize::try_from(offset)) else {
            return;
        };
        let now = self.shared.now();
        if let Some(counter) = self.shared.lock().counters.get_mut(index) {
            *first = counter.read(now);
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let Some(&byte) = data.first() else { return };
        let now = self.shared.now();
        let mut chip = self.shared.lock();
        let channel = if offset == CONTROL {
            control_word(&mut chip.counters, byte, now)
        } else {
            let Some(counter) = usize::try_from(offset)
                .ok()
                .and_then(|i| chip.counters.get_mut(i))
            else {
                return;
            };
            counter.write(byte, now);
            offset
        };
        // Channel 0 reprogrammed: its edges count from now, and the timer sleeps anew.
        if channel == 0 {
            chip.irq_checked = now;
            self.shared.chip.wake();
        }
    }
}

/// A write of the control word (datasheet, "Control Word Format"): a counter's mode, a
/// counter latch, or a read-back command. The channel it programs, or one past the three.
fn control_word(counters: &mut [Counter; 3], byte: u8, now: u64) -> u64 {
    let (select, access, mode, bcd) = (byte >> 6, (byte >> 4) & 3, (byte >> 1) & 7, byte & 1);
    match (select, access) {
        // Read-back: bits 1-3 select counters; bit 5 clear latches counts, bit 4 statuses.
        (3, _) => {
            for (i, counter) in counters.iter_mut().enumerate() {
                if byte & (2 << i) == 0 {
                    continue;
                }
                if byte & 0x10 == 0 {
                    counter.latch_status(now);
                }
                if byte & 0x20 == 0 {
                    counter.latch_count(now);
                }
            }
            3
        }
        (_, 0) => {
            counters[usize::from(select)].latch_count(now);
            3
        }
        _ => {
            counters[usize::from(select)].program(access, mode, bcd == 1);
            select.into()
        }
    }
}

/// Port B: channel 2's gate and the speaker's data bit written; those, the refresh toggle and
/// channel 2's OUT read.
pub struct PortB(Arc<Pit>);

impl BusDevice for PortB {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Some(first) = data.first_mut() else {
            return;
        };
        let shared = &self.0.shared;
        let time = (shared.clock)();
        let now = shared.now();
        let chip = shared.lock();
        let channel2 = &chip.counters[2];
        let refresh = (time.as_nanos() / REFRESH_PERIOD_NS) % 2 == 1;
        let bit = |set: bool, mask: u8| if set { mask } else { 0 };
        *first = bit(channel2.gate, GATE2)
            | bit(chip.speaker_data, SPEAKER_DATA)
            | bit(refresh, REFRESH)
            | bit(channel2.out(now), OUT2);
    }

    fn write(&self, _offset: u64, data: &[u8]) {
        let Some(&byte) = data.first() else { return };
        let shared = &self.0.shared;
        let now = shared.now();
        let mut chip = shared.lock();
        chip.counters[2].set_gate(byte & GATE2 != 0, now);
        chip.speaker_data = byte & SPEAKER_DATA != 0;
    }
}

#[cfg(test)]
mod tests;
