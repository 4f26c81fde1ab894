use super::cmos::{AIE, IRQF, PIE, REG_A, REG_B, REG_C, REG_D, SET, UIE};
use super::*;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// 2026-11-25 20:21:08 UTC, a Wednesday.
const NOW: u64 = 1_795_638_068;
const SECOND: u64 = 1_000_000_000;
/// Register B's reset value: BCD, 24-hour.
const B_24H: u8 = 0x02;
const B_BINARY: u8 = 0x04;
/// Register A with the normal divider and no periodic rate.
const NO_PERIODIC: u8 = 0x20;

#[derive(Default)]
struct Alarms(AtomicUsize);
impl RtcEvents for Alarms {
    fn alarm(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

struct Bench {
    rtc: Rtc,
    nanos: Arc<AtomicU64>,
    irq: EventFd,
    alarms: Arc<Alarms>,
}

impl Bench {
    fn new() -> Self {
        let nanos = Arc::new(AtomicU64::new(NOW * SECOND));
        let clock_nanos = nanos.clone();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let alarms = Arc::new(Alarms::default());
        let rtc = Rtc::new(
            Box::new(move || Duration::from_nanos(clock_nanos.load(Ordering::SeqCst))),
            &memory_bytes(512 << 20, 0),
            irq.try_clone().unwrap(),
            alarms.clone(),
            DeviceLog::new("rtc"),
        )
        .unwrap();
        Bench {
            rtc,
            nanos,
            irq,
            alarms,
        }
    }

    fn advance(&self, nanos: u64) {
        self.nanos.fetch_add(nanos, Ordering::SeqCst);
    }

    fn get(&self, index: u8) -> u8 {
        self.rtc.write(0, &[index]);
        let mut b = [0];
        self.rtc.read(1, &mut b);
        b[0]
    }

    fn set(&self, index: u8, value: u8) {
        self.rtc.write(0, &[index]);
        self.rtc.write(1, &[value]);
    }

    /// Seconds, minutes, hours, day of week, day, month, year, century.
    fn time(&self) -> [u8; 8] {
        [0, 2, 4, 6, 7, 8, 9, CENTURY_INDEX].map(|i| self.get(i))
    }

    /// IRQ 8 pulses since the last look.
    fn irqs(&self) -> u64 {
        self.irq.read().unwrap_or(0)
    }
}

#[test]
fn the_time_is_the_hosts_utc_in_bcd_or_binary() {
    let b = Bench::new();
    assert_eq!(b.time(), [0x08, 0x21, 0x20, 4, 0x25, 0x11, 0x26, 0x20]);
    b.set(REG_B, B_24H | B_BINARY);
    assert_eq!(b.time(), [8, 21, 20, 4, 25, 11, 26, 20]);
    assert_eq!(b.get(REG_D), 0x80, "VRT: the battery is good");
}

#[test]
fn twelve_hour_mode_puts_pm_in_bit_7() {
    let b = Bench::new();
    b.set(REG_B, 0);
    assert_eq!(b.get(4), 0x88, "8 PM in BCD");
    b.set(REG_B, B_BINARY);
    assert_eq!(b.get(4), 0x88, "8 PM in binary");
    // Half past midnight reads 12 AM.
    b.advance((3 * 3600 + 39 * 60) * SECOND);
    assert_eq!(b.get(4), 12);
    b.set(REG_B, 0);
    assert_eq!(b.get(4), 0x12);
    b.set(4, 0x81);
    b.set(REG_B, B_24H);
    assert_eq!(b.get(4), 0x13, "1 PM written in 12-hour mode");
}

#[test]
fn set_halts_the_clock_and_what_the_guest_writes_runs_on_from_there() {
    let b = Bench::new();
    b.set(REG_B, B_24H | SET);
    b.set(9, 0x30);
    b.set(0, 0x50);
    b.advance(5 * SECOND);
    assert_eq!(b.get(0), 0x50, "held while SET");
    assert_eq!(b.get(REG_A) & 0x80, 0, "no update in progress while SET");
    b.set(REG_B, B_24H);
    b.advance(12 * SECOND);
    assert_eq!(b.time(), [0x02, 0x22, 0x20, 2, 0x25, 0x11, 0x30, 0x20]);
}

#[test]
fn uip_reads_set_just_before_each_update() {
    let b = Bench::new();
    assert_eq!(b.get(REG_A), 0x26, "the reset divider and rate");
    b.advance(SECOND - 100_000);
    assert_eq!(b.get(REG_A), 0xa6);
    b.advance(200_000);
    assert_eq!(b.get(REG_A), 0x26);
}

#[test]
fn the_alarm_with_dont_care_bytes_fires_and_register_c_clears_on_read() {
    let b = Bench::new();
    b.set(REG_A, NO_PERIODIC);
    // Any hour, any minute, second 10.
    for (i, v) in [(1, 0x10), (3, 0xc0), (5, 0xff)] {
        b.set(i, v);
    }
    b.set(REG_B, B_24H | AIE);
    assert_eq!(b.get(REG_C), 0);
    b.advance(SECOND);
    assert_eq!(b.get(REG_C), UIE, "second 9: UF, no alarm");
    b.advance(SECOND);
    assert_eq!(b.get(REG_C), IRQF | AIE | UIE, "second 10 (UF rises too)");
    assert_eq!(b.get(REG_C), 0, "cleared by the read");
    assert_eq!(b.irqs(), 1);
    assert_eq!(b.alarms.0.load(Ordering::SeqCst), 1, "a wake event");
    // An hour later, at the same second, again.
    b.advance(3600 * SECOND);
    assert_eq!(b.get(REG_C), IRQF | AIE | UIE);
}

#[test]
fn a_flag_without_its_enable_raises_no_interrupt() {
    let b = Bench::new();
    b.advance(SECOND);
    assert_eq!(
        b.get(REG_C),
        UIE | PIE,
        "UF and PF (the reset rate), no IRQF"
    );
    assert_eq!(b.irqs(), 0);
    b.set(REG_B, B_24H | UIE);
    b.advance(SECOND);
    assert_eq!(b.get(REG_C), IRQF | UIE | PIE);
    assert_eq!(b.irqs(), 1);
    assert_eq!(b.alarms.0.load(Ordering::SeqCst), 0);
}

#[test]
fn the_periodic_interrupt_follows_the_rate() {
    let b = Bench::new();
    b.set(REG_A, 0x26);
    b.set(REG_B, B_24H | PIE);
    b.advance(SECOND / 1024);
    assert_eq!(b.get(REG_C), IRQF | PIE, "1024 Hz");
    b.set(REG_A, NO_PERIODIC);
    b.advance(SECOND / 2);
    assert_eq!(b.get(REG_C), 0, "rate 0: none");
}

#[test]
fn the_index_ignores_the_nmi_bit_and_memory_sizes_are_in_cmos() {
    let b = Bench::new();
    b.rtc.write(0, &[0x80 | 0x15]);
    let mut byte = [0];
    b.rtc.read(1, &mut byte);
    assert_eq!(byte[0], 0x80, "640 KiB of base memory, low byte");
    // 512 MiB: 511 MiB extended (capped at 65535 KiB), 496 MiB above 16 MiB.
    assert_eq!([b.get(0x17), b.get(0x18)], [0xff, 0xff]);
    assert_eq!(u16::from_le_bytes([b.get(0x34), b.get(0x35)]), 496 * 16);
    let high = memory_bytes(0, 2 << 30);
    assert!(
        high.contains(&(0x5c, 0x80)),
        "2 GiB above 4 GiB: 0x8000 units"
    );
    b.set(0x40, 0x5a);
    assert_eq!(b.get(0x40), 0x5a, "plain CMOS bytes keep what is written");
    b.rtc.read(0, &mut byte);
    assert_eq!(byte[0], 0xff, "the index port is write-only");
}

#[test]
fn the_timer_thread_raises_an_enabled_interrupt_on_its_own() {
    let b = Bench::new();
    // The write notifies the thread, which sleeps until the next update; no access follows.
    b.set(REG_B, B_24H | UIE);
    b.advance(SECOND);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while b.irqs() == 0 {
        assert!(std::time::Instant::now() < deadline, "no interrupt");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Every CMOS byte but the clock's as the guest reads them, then the clock.
fn cmos_image(b: &Bench) -> Vec<u8> {
    let mut image: Vec<u8> = (0..128).filter(|&i| i != REG_C).map(|i| b.get(i)).collect();
    image.extend(b.time());
    image
}

#[test]
fn a_restored_rtc_keeps_its_bytes_its_flags_and_its_offset_from_the_host() {
    use crate::persist::Persist;
    let b = Bench::new();
    b.set(0x40, 0x5a); // a CMOS byte of the guest's
    b.set(REG_A, NO_PERIODIC);
    b.set(9, 0x31); // the guest's clock: 2031
    b.set(REG_B, B_24H | UIE);
    b.advance(SECOND); // an update: UF and IRQF, unread
    b.get(0x40);
    assert_eq!(b.irqs(), 1);
    let state = b.rtc.save().unwrap();

    let restored = Bench::new();
    restored.advance(3601 * SECOND); // restored an hour later
    // Let its timer thread go to sleep with nothing enabled, as a fresh machine's has.
    std::thread::sleep(Duration::from_millis(50));
    restored.rtc.restore(state).unwrap();
    assert_eq!(restored.irqs(), 0, "nothing before the resume");
    restored.rtc.resume();
    assert_eq!(restored.irqs(), 1, "IRQF was set: IRQ 8 pulsed again");
    b.advance(3600 * SECOND);
    assert_eq!(
        cmos_image(&restored),
        cmos_image(&b),
        "the clock an hour on, as the host's"
    );
    assert_eq!(restored.time()[6], 0x31);
    assert_eq!(restored.get(REG_C), IRQF | UIE, "the unread update flag");
    // The timer thread was re-armed for the update interrupt the guest enabled.
    restored.advance(SECOND);
    let pulsed = (0..1000).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        restored.irqs() > 0
    });
    assert!(pulsed, "IRQ 8 at the next update");
}

#[test]
fn a_corrupted_rtc_state_is_refused_naming_the_field() {
    use crate::persist::Persist;
    let b = Bench::new();
    b.set(0x40, 0x5a);
    let good = b.rtc.save().unwrap();
    let corrupt = |field: &str, value: serde_json::Value| {
        let mut state = good.clone();
        state[field] = value;
        b.rtc.restore(state).unwrap_err().what
    };
    assert_eq!(corrupt("index", serde_json::json!(128)), "rtc.index");
    assert_eq!(corrupt("ram", serde_json::json!(vec![0; 4])), "rtc.ram");
    assert_eq!(corrupt("reg_c", serde_json::json!(0x0f)), "rtc.reg_c");
    assert_eq!(corrupt("offset", serde_json::json!(i64::MAX)), "rtc.offset");
    let held = serde_json::json!({"time": vec![0; 7], "century": 0x20});
    assert_eq!(corrupt("held", held), "rtc.held");
    let mut set_and_uie = good["ram"].clone();
    set_and_uie[usize::from(REG_B)] = (SET | UIE).into();
    assert_eq!(corrupt("ram", set_and_uie), "rtc.ram");
    assert_eq!(b.get(0x40), 0x5a, "a refused state changes nothing");
}

#[test]
fn a_paused_rtc_raises_nothing_until_it_resumes() {
    use crate::persist::Persist;
    let b = Bench::new();
    b.set(REG_B, B_24H | UIE);
    b.rtc.pause().unwrap();
    b.advance(SECOND);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(b.irqs(), 0, "the update came while paused");
    assert_eq!(
        b.rtc.save().unwrap()["reg_c"],
        0,
        "no flag taken while paused"
    );
    b.rtc.resume();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while b.irqs() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no interrupt after resume"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}
