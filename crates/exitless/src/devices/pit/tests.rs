use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

use vmm_sys_util::eventfd::EFD_NONBLOCK;

use super::*;
use crate::persist::Persist;

/// Ticks of a 1 ms period.
const MS: u16 = 1193;

/// A PIT on a clock the test moves (nanoseconds), and its IRQ 0.
fn pit_at(nanos: &Arc<AtomicU64>) -> (Pit, EventFd) {
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let clock_nanos = nanos.clone();
    let clock: Clock = Box::new(move || Duration::from_nanos(clock_nanos.load(Ordering::SeqCst)));
    let pit = Pit::new(clock, irq.try_clone().unwrap(), DeviceLog::new("pit")).unwrap();
    (pit, irq)
}

fn out(dev: &dyn BusDevice, port: u64, byte: u8) {
    dev.write(port, &[byte]);
}

fn inb(dev: &dyn BusDevice, port: u64) -> u8 {
    let mut b = [0];
    dev.read(port, &mut b);
    b[0]
}

/// Nanoseconds `ticks` of the input clock take, rounded up.
fn nanos(ticks: u64) -> u64 {
    (ticks * 1_000_000_000).div_ceil(PIT_HZ)
}

#[test]
fn a_rate_generator_counts_down_and_reloads_as_the_datasheet_says() {
    let mut c = Counter::default();
    c.program(counter::RW_BOTH, 2, false);
    assert_eq!(c.next_rising_edge(0), None, "no count yet");
    c.write(10, 100);
    assert_eq!(c.value(100), 0, "half a count is no count");
    c.write(0, 100);
    assert_eq!(c.value(100), 10);
    assert_eq!(c.value(103), 7);
    // OUT is low for the one clock the count is 1, then it reloads.
    assert!(c.out(108));
    assert!(!c.out(109));
    assert!(c.out(110));
    assert_eq!(c.value(110), 10);
    assert_eq!(c.next_rising_edge(100), Some(110));
    assert_eq!(c.next_rising_edge(110), Some(120));
}

#[test]
fn a_square_wave_is_high_for_the_larger_half_and_rises_each_period() {
    let mut c = Counter::default();
    c.program(counter::RW_LSB, 7, false);
    assert_eq!(c.mode, 3, "mode 7 is mode 3");
    c.write(5, 0);
    let levels: Vec<bool> = (0..5).map(|t| c.out(t)).collect();
    assert_eq!(levels, [true, true, true, false, false]);
    assert_eq!(c.next_rising_edge(3), Some(5));
}

#[test]
fn a_one_shot_interrupt_on_terminal_count_rises_once() {
    let mut c = Counter::default();
    c.program(counter::RW_LSB, 0, false);
    assert!(!c.out(0), "a mode 0 control word sets OUT low");
    c.write(4, 0);
    assert!(!c.out(3));
    assert!(c.out(4));
    assert_eq!(c.next_rising_edge(0), Some(4));
    assert_eq!(c.next_rising_edge(4), None);
    // It goes on counting down through zero.
    assert_eq!(c.value(5), 0xffff);
}

#[test]
fn a_latch_holds_the_count_until_both_bytes_are_read_and_a_second_latch_waits() {
    let nanos_now = Arc::new(AtomicU64::new(0));
    let (pit, _irq) = pit_at(&nanos_now);
    out(&pit, CONTROL, 0x34); // channel 0, LSB then MSB, mode 2
    out(&pit, 0, 0x00);
    out(&pit, 0, 0x10); // 0x1000
    nanos_now.store(nanos(0x100), Ordering::SeqCst);
    out(&pit, CONTROL, 0x00); // latch channel 0
    nanos_now.store(nanos(0x200), Ordering::SeqCst);
    out(&pit, CONTROL, 0x00); // ignored: the first is unread
    assert_eq!(inb(&pit, 0), 0x00);
    assert_eq!(inb(&pit, 0), 0x0f, "0x1000 - 0x100, latched");
    // The live count, a byte at a time.
    assert_eq!(inb(&pit, 0), 0x00);
    assert_eq!(inb(&pit, 0), 0x0e);
}

#[test]
fn read_back_latches_the_status_then_the_count() {
    let nanos_now = Arc::new(AtomicU64::new(0));
    let (pit, _irq) = pit_at(&nanos_now);
    out(&pit, CONTROL, 0x34);
    // Read-back of counter 0's status alone, before its count is written: null count.
    out(&pit, CONTROL, 0xe2);
    assert_eq!(
        inb(&pit, 0),
        0x80 | 0x40 | 0x34,
        "OUT high, null count, RW 3, mode 2"
    );
    out(&pit, 0, 100);
    out(&pit, 0, 0);
    nanos_now.store(nanos(30), Ordering::SeqCst);
    // Status and count together: the status is read first.
    out(&pit, CONTROL, 0xc2);
    assert_eq!(inb(&pit, 0), 0x80 | 0x34);
    assert_eq!(inb(&pit, 0), 70);
    assert_eq!(inb(&pit, 0), 0);
    assert_eq!(inb(&pit, CONTROL), 0xff, "the control word cannot be read");
}

#[test]
fn channel_2_is_gated_and_read_through_port_b_as_linux_calibrates_the_tsc() {
    let nanos_now = Arc::new(AtomicU64::new(0));
    let (pit, _irq) = pit_at(&nanos_now);
    let pit = Arc::new(pit);
    let port_b = pit.port_b();
    // arch/x86/kernel/tsc.c: the gate high, the speaker off; channel 2 in mode 0 at 0xffff.
    out(&port_b, 0, (inb(&port_b, 0) & !SPEAKER_DATA) | GATE2);
    out(&*pit, CONTROL, 0xb0);
    out(&*pit, 2, 0xff);
    out(&*pit, 2, 0xff);
    assert_eq!(
        inb(&port_b, 0) & (GATE2 | OUT2),
        GATE2,
        "OUT low while it counts"
    );
    nanos_now.store(nanos(0x100), Ordering::SeqCst);
    assert_eq!(inb(&*pit, 2), 0xff);
    assert_eq!(inb(&*pit, 2), 0xfe, "0xffff - 0x100");
    nanos_now.store(nanos(0xffff), Ordering::SeqCst);
    assert_eq!(inb(&port_b, 0) & OUT2, OUT2, "terminal count");
    // The refresh bit toggles every 15.085 µs.
    nanos_now.store(0, Ordering::SeqCst);
    let before = inb(&port_b, 0) & REFRESH;
    nanos_now.store(15_100, Ordering::SeqCst);
    assert_ne!(inb(&port_b, 0) & REFRESH, before);
}

/// The IRQ's count once it is nonzero, waiting up to ten seconds.
fn raised(irq: &EventFd) -> u64 {
    for _ in 0..1000 {
        if let Ok(n) = irq.read() {
            return n;
        }
        thread::sleep(Duration::from_millis(10));
    }
    0
}

#[test]
fn channel_0_raises_irq_0_at_its_edges_once_for_the_ones_the_timer_slept_through() {
    let nanos_now = Arc::new(AtomicU64::new(0));
    let (pit, irq) = pit_at(&nanos_now);
    out(&pit, CONTROL, 0x34);
    let [lsb, msb] = MS.to_le_bytes();
    out(&pit, 0, lsb);
    out(&pit, 0, msb);
    // Ten periods go by at once (the timer, asleep until the first edge's time, wakes to
    // find them gone): one edge is raised for them.
    nanos_now.store(10_000_000 + 1, Ordering::SeqCst);
    assert_eq!(raised(&irq), 1);
    // A one-shot raises its terminal count once.
    out(&pit, CONTROL, 0x30);
    out(&pit, 0, lsb);
    out(&pit, 0, msb);
    nanos_now.store(30_000_000, Ordering::SeqCst);
    assert_eq!(raised(&irq), 1);
    thread::sleep(Duration::from_millis(50));
    assert!(irq.read().is_err(), "a one-shot rises once");
}

#[test]
fn a_snapshot_keeps_each_counters_phase_across_clocks_and_checks_what_it_takes() {
    let nanos_now = Arc::new(AtomicU64::new(0));
    let (pit, _irq) = pit_at(&nanos_now);
    out(&pit, CONTROL, 0x34);
    out(&pit, 0, 100);
    out(&pit, 0, 0);
    // Deep into its run: 1,000,030 ticks, 30 into a period.
    nanos_now.store(nanos(1_000_030), Ordering::SeqCst);
    pit.pause().unwrap();
    let state = pit.save().unwrap();
    pit.resume();

    // A new process's clock starts again at 0.
    let later = Arc::new(AtomicU64::new(0));
    let (restored, _irq) = pit_at(&later);
    restored.restore(state.clone()).unwrap();
    restored.resume();
    out(&restored, CONTROL, 0x00);
    assert_eq!(inb(&restored, 0), 70);
    assert_eq!(inb(&restored, 0), 0);

    let mut bad = state.clone();
    bad["counters"][0]["mode"] = 6.into();
    let err = restored.restore(bad).unwrap_err();
    assert_eq!(err.what, "pit.counters[0].mode");
    let mut bad = state;
    bad["counters"][1]["count"] = 0x1_0001.into();
    assert_eq!(
        restored.restore(bad).unwrap_err().what,
        "pit.counters[1].count"
    );
}
