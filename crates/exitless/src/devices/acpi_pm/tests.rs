use super::*;
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress};

use crate::vm::sleep::WakeEntry;

fn device() -> (AcpiPm, Arc<RunControl>) {
    let control = Arc::new(RunControl::default());
    (
        AcpiPm::new(control.clone(), DeviceLog::new("acpi-pm")),
        control,
    )
}

fn read_u32(dev: &AcpiPm, offset: u16) -> u32 {
    let mut b = [0u8; 4];
    dev.read(offset.into(), &mut b);
    u32::from_le_bytes(b)
}

#[test]
fn the_timer_advances_at_its_frequency_in_24_bits() {
    let (dev, _) = device();
    let a = read_u32(&dev, PM_TMR_OFFSET);
    std::thread::sleep(Duration::from_millis(20));
    let b = read_u32(&dev, PM_TMR_OFFSET);
    let ticks = b.wrapping_sub(a) & TMR_VAL_MASK;
    // 20 ms is 71,591 ticks; a loaded host may sleep longer, never shorter.
    assert!((71_000..3_579_545).contains(&ticks), "{ticks} ticks");
    assert_eq!(b & !TMR_VAL_MASK, 0);
}

#[test]
fn s5_powers_off_and_s4_is_ignored() {
    let (dev, control) = device();
    let cnt = u64::from(PM1_CNT_OFFSET);
    let mut b = [0u8; 2];
    dev.read(cnt, &mut b);
    assert_eq!(u16::from_le_bytes(b), SCI_EN, "ACPI mode from the start");
    dev.write(cnt, &(SLP_EN | 2 << SLP_TYP_SHIFT).to_le_bytes());
    assert_eq!(control.wait(Duration::ZERO), None, "S4 is not supported");
    assert_eq!(dev.log().guest_errors(), 1);
    // SLP_TYP and SLP_EN live in the high byte, which a byte write reaches alone.
    dev.write(cnt + 1, &[SLP_EN.to_le_bytes()[1]]);
    assert_eq!(control.wait(Duration::ZERO), Some(StopReason::PowerOff));
}

#[test]
fn enable_is_kept_and_status_and_timer_ignore_writes() {
    let (dev, control) = device();
    dev.write(u64::from(PM1_EVT_OFFSET), &[0xff, 0xff, 0x20, 0x01]);
    let evt = read_u32(&dev, PM1_EVT_OFFSET);
    assert_eq!(evt, 0x0120 << 16, "status clear, enable kept");
    dev.write(u64::from(PM_TMR_OFFSET), &[0; 4]);
    let mut past = [0u8; 2];
    dev.read(u64::from(PM_BLOCK_LEN) - 1, &mut past);
    assert_eq!(past[1], 0xff, "past the block");
    assert_eq!(control.wait(Duration::ZERO), None);
}

const FACS_AT: u64 = 0x1000;

/// A block whose FACS asks to resume in real mode at 0x9000.
fn with_facs() -> (AcpiPm, Arc<RunControl>) {
    let (dev, control) = device();
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x2000)]).unwrap();
    mem.write_slice(b"FACS", GuestAddress(FACS_AT)).unwrap();
    mem.write_obj(0x9000u32, GuestAddress(FACS_AT + 12))
        .unwrap();
    (dev.with_facs(mem, FACS_AT), control)
}

fn read_u16(dev: &AcpiPm, offset: u16) -> u16 {
    let mut b = [0u8; 2];
    dev.read(offset.into(), &mut b);
    u16::from_le_bytes(b)
}

fn sleep_s3(dev: &AcpiPm) {
    let s3 = SLP_EN | S3_SLP_TYP << SLP_TYP_SHIFT;
    dev.write(PM1_CNT_OFFSET.into(), &s3.to_le_bytes());
}

#[test]
fn s3_sleeps_until_an_enabled_rtc_alarm_and_sets_wak_sts() {
    let (dev, control) = with_facs();
    let enable = u64::from(PM1_EVT_OFFSET) + 2;
    sleep_s3(&dev);
    assert!(control.sleep().entering());
    let sleep = std::thread::scope(|s| {
        let parked = s.spawn(|| control.sleep().park(|| false));
        while !control.sleep().asleep() {
            std::thread::yield_now();
        }
        dev.rtc_alarm();
        assert!(control.sleep().asleep(), "RTC_EN clear: no wake");
        assert_eq!(read_u16(&dev, PM1_EVT_OFFSET), RTC_STS);
        dev.write(enable, &RTC_STS.to_le_bytes());
        dev.rtc_alarm();
        parked.join().unwrap()
    });
    assert_eq!(sleep, Some(WakeEntry::Real { cs: 0x900, ip: 0 }));
    assert_eq!(read_u16(&dev, PM1_EVT_OFFSET), RTC_STS | WAK_STS);
    dev.write(PM1_EVT_OFFSET.into(), &WAK_STS.to_le_bytes());
    assert_eq!(
        read_u16(&dev, PM1_EVT_OFFSET),
        RTC_STS,
        "write-one-to-clear"
    );
    // An enabled event still pending wakes the machine as soon as it sleeps.
    sleep_s3(&dev);
    assert_eq!(
        control.sleep().park(|| false),
        Some(WakeEntry::Real { cs: 0x900, ip: 0 })
    );
    assert_eq!(control.wait(Duration::ZERO), None, "the run goes on");
}

#[test]
fn s3_without_a_waking_vector_is_ignored() {
    let (dev, control) = device();
    sleep_s3(&dev);
    assert!(!control.sleep().entering());
    assert_eq!(dev.log().guest_errors(), 1);
    let (dev, control) = with_facs();
    control.sleep().wake();
    assert_eq!(read_u16(&dev, PM1_EVT_OFFSET), 0, "no wake while awake");
    assert!(!control.sleep().entering());
}
