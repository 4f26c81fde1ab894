//! An MC146818-compatible real-time clock and CMOS at ports 0x70 (index; bit 7 masks NMIs on a
//! PC and is not part of the index) and 0x71 (data), as PC guests expect (QEMU's mc146818rtc,
//! Cloud Hypervisor's cmos): the host's UTC time, the update cycle, the periodic, alarm and
//! update-ended interrupts on IRQ 8, and the memory-size bytes firmware leaves in CMOS. The
//! alarm is an ACPI wake source ([`RtcEvents::alarm`]).
//!
//! Written here: no rust-vmm crate models this chip (vm-superio's `Rtc` is the ARM PL031).
//! The registers are a state machine without threads ([`cmos`]); a timer thread sleeps until
//! the next interrupt the guest enabled (none: it sleeps until an access changes that).

mod calendar;
mod cmos;
mod persist;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, SystemTime};

use vmm_sys_util::eventfd::EventFd;

use super::timer::{IDLE, Timed, TimerThread};
use crate::bus::BusDevice;
use crate::guest_error;
use crate::logging::DeviceLog;
use cmos::{CMOS_LEN, Cmos, Raised};

pub use cmos::CENTURY as CENTURY_INDEX;

/// The index port; the data port follows.
pub const RTC_PORT: u16 = 0x70;
/// Ports the device decodes.
pub const RTC_PORTS_LEN: u16 = 2;
/// Its ISA IRQ (and GSI, with no override): edge-triggered, active high.
pub const RTC_IRQ: u32 = 8;
/// The index port's NMI-mask bit.
const NMI_MASK: u8 = 0x80;

/// What the RTC tells the rest of the machine.
pub trait RtcEvents: Send + Sync {
    /// The alarm fired with its interrupt enabled (ACPI 6.5 §4.8.3.1.1: RTC_STS).
    fn alarm(&self) {}
}

/// No one listens.
pub struct NoEvents;
impl RtcEvents for NoEvents {}

/// The host's time since the epoch, or a test's.
pub type Clock = Box<dyn Fn() -> Duration + Send + Sync>;

/// The host's UTC time.
pub fn host_clock() -> Clock {
    Box::new(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
    })
}

/// The memory sizes PC firmware leaves in CMOS (as QEMU's pc_cmos_init and SeaBIOS read them):
/// base memory in KiB (0x15/0x16), extended memory above 1 MiB in KiB (0x17/0x18, again at
/// 0x30/0x31, at most 65535), memory above 16 MiB in 64 KiB units (0x34/0x35) and memory above
/// 4 GiB in 64 KiB units (0x5b..0x5d).
pub fn memory_bytes(below_4g: u64, above_4g: u64) -> Vec<(u8, u8)> {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    let clamp16 = |v: u64| u16::try_from(v.min(0xffff)).expect("clamped");
    let base = clamp16(640);
    let extended = clamp16(below_4g.saturating_sub(MIB) / KIB);
    let above_16m = clamp16(below_4g.saturating_sub(16 * MIB) / (64 * KIB));
    let high = u32::try_from((above_4g / (64 * KIB)).min(0xff_ffff)).expect("clamped");
    let mut bytes = Vec::new();
    for (at, v) in [
        (0x15, base),
        (0x17, extended),
        (0x30, extended),
        (0x34, above_16m),
    ] {
        let [lo, hi] = v.to_le_bytes();
        bytes.extend([(at, lo), (at + 1, hi)]);
    }
    let [b0, b1, b2, _] = high.to_le_bytes();
    bytes.extend([(0x5b, b0), (0x5c, b1), (0x5d, b2)]);
    bytes
}

struct Shared {
    /// The index the guest last wrote, then the chip.
    state: Timed<(u8, Cmos)>,
    /// Restored from a snapshot: IRQ 8 is pulsed again at resume while IRQF is set.
    restored: AtomicBool,
    clock: Clock,
    irq: EventFd,
    events: Arc<dyn RtcEvents>,
    log: Arc<DeviceLog>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u8, Cmos)> {
        self.state.lock()
    }

    /// Pulse IRQ 8 and report the alarm, as `raised` says.
    fn deliver(&self, raised: Raised) {
        if raised.irq
            && let Err(e) = self.irq.write(1)
        {
            guest_error!(self.log, "IRQ {RTC_IRQ} lost: {e}");
        }
        if raised.alarm {
            self.events.alarm();
        }
    }
}

/// The RTC and its timer thread (stopped and joined on drop).
pub struct Rtc {
    shared: Arc<Shared>,
    _timer: TimerThread,
}

impl Rtc {
    /// A clock reading `clock`, with the CMOS bytes `bytes`, pulsing `irq` and telling
    /// `events` of the alarm; starts its timer thread.
    pub fn new(
        clock: Clock,
        bytes: &[(u8, u8)],
        irq: EventFd,
        events: Arc<dyn RtcEvents>,
        log: Arc<DeviceLog>,
    ) -> std::io::Result<Self> {
        let cmos = Cmos::new(bytes, clock());
        let shared = Arc::new(Shared {
            state: Timed::new((0, cmos)),
            restored: AtomicBool::new(false),
            clock,
            irq,
            events,
            log,
        });
        let timer = TimerThread::spawn("rtc", &shared, |s| &s.state, raise_due_flags)?;
        Ok(Rtc {
            shared,
            _timer: timer,
        })
    }

    /// The device's log, for its guest errors.
    pub fn log(&self) -> &Arc<DeviceLog> {
        &self.shared.log
    }
}

/// The timer's step: raise the flags that are due; the time until the next enabled one.
fn raise_due_flags(shared: &Shared, state: &mut (u8, Cmos)) -> Duration {
    let now = (shared.clock)();
    shared.deliver(state.1.catch_up(now));
    state
        .1
        .next_deadline(now)
        .map_or(IDLE, |at| at.saturating_sub(now))
}

impl BusDevice for Rtc {
    /// The index port reads as all-ones (it is write-only); the data port reads the byte
    /// the index selects.
    fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        let [byte, ..] = data else { return };
        if offset != 1 {
            return;
        }
        let now = (self.shared.clock)();
        let mut state = self.shared.lock();
        let index = state.0;
        let (value, raised) = state.1.read(index, now);
        *byte = value;
        self.shared.deliver(raised);
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let [byte, ..] = *data else { return };
        let now = (self.shared.clock)();
        let mut state = self.shared.lock();
        match offset {
            0 => state.0 = (byte & !NMI_MASK) % u8::try_from(CMOS_LEN).expect("128"),
            1 => {
                let index = state.0;
                let raised = state.1.write(index, byte, now);
                self.shared.deliver(raised);
                self.shared.state.wake();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
