//! The ACPI PM block in a snapshot: PM1 status (RTC_STS, and WAK_STS as the guest reads it),
//! PM1 enable, PM1 control (its sleep type; SLP_EN and SCI_EN are not stored, ACPI 6.5
//! §4.8.3.2.1) and the PM timer's count, which goes on from where it stood. The waking vector
//! lives in the FACS, in guest memory, which the snapshot holds.

use std::sync::PoisonError;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{AcpiPm, PM_TIMER_HZ, RTC_STS, SCI_EN, SLP_EN, TMR_VAL_MASK, WAK_STS};
use crate::persist::{Persist, StateError, from_state, to_state};

const ID: &str = "acpi-pm";

#[derive(Serialize, Deserialize)]
struct Saved {
    /// PM1 status: RTC_STS and WAK_STS are the bits this block sets.
    status: u16,
    /// PM1 enable, as written.
    enable: u16,
    /// PM1 control, without SLP_EN and SCI_EN.
    control: u16,
    /// TMR_VAL, 24 bits.
    timer: u32,
}

fn check(s: &Saved) -> Result<(), StateError> {
    let bad = |field: &str, why: String| Err(StateError::new(format!("{ID}.{field}"), why));
    if s.status & !(RTC_STS | WAK_STS) != 0 {
        return bad(
            "status",
            format!("{:#x}: only RTC_STS and WAK_STS are ever set", s.status),
        );
    }
    if s.control & (SLP_EN | SCI_EN) != 0 {
        return bad(
            "control",
            format!("{:#x}: SLP_EN and SCI_EN are not stored", s.control),
        );
    }
    if s.timer > TMR_VAL_MASK {
        return bad("timer", format!("{:#x} is wider than 24 bits", s.timer));
    }
    Ok(())
}

impl Persist for AcpiPm {
    fn save(&self) -> Result<serde_json::Value, StateError> {
        let timer = self.timer();
        let regs = self.regs.lock().unwrap_or_else(PoisonError::into_inner);
        // WAK_STS lives in the run control while the machine runs; a restored block holds
        // it in its status until the guest clears it, which clears both.
        let woke = if self.control.sleep().woke() {
            WAK_STS
        } else {
            0
        };
        let saved = Saved {
            status: regs.status | woke,
            enable: regs.enable,
            control: regs.control,
            timer,
        };
        to_state(ID, &saved)
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), StateError> {
        let saved: Saved = from_state(ID, state)?;
        check(&saved)?;
        let since = u64::try_from(u128::from(saved.timer) * 1_000_000_000 / PM_TIMER_HZ)
            .expect("under 5 s");
        let start = Instant::now()
            .checked_sub(Duration::from_nanos(since))
            .ok_or_else(|| StateError::new(format!("{ID}.timer"), "the host clock is too young"))?;
        let mut regs = self.regs.lock().unwrap_or_else(PoisonError::into_inner);
        regs.status = saved.status;
        regs.enable = saved.enable;
        regs.control = saved.control;
        *self.start.lock().unwrap_or_else(PoisonError::into_inner) = start;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::bus::BusDevice;
    use crate::devices::acpi_pm::{PM_TMR_OFFSET, PM1_CNT_OFFSET, PM1_EVT_OFFSET};
    use crate::logging::DeviceLog;
    use crate::vm::run_control::RunControl;

    fn device() -> AcpiPm {
        AcpiPm::new(Arc::new(RunControl::default()), DeviceLog::new(ID))
    }

    fn read16(dev: &AcpiPm, offset: u16) -> u16 {
        let mut b = [0u8; 2];
        dev.read(offset.into(), &mut b);
        u16::from_le_bytes(b)
    }

    fn timer(dev: &AcpiPm) -> u32 {
        let mut b = [0u8; 4];
        dev.read(PM_TMR_OFFSET.into(), &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn status_enable_control_and_the_timer_come_back() {
        let dev = device();
        dev.write(u64::from(PM1_EVT_OFFSET) + 2, &RTC_STS.to_le_bytes());
        dev.rtc_alarm();
        dev.write(PM1_CNT_OFFSET.into(), &(5u16 << 10).to_le_bytes()); // SLP_TYP 5, no SLP_EN
        std::thread::sleep(Duration::from_millis(50));
        let mut state = dev.save().unwrap();
        assert_eq!(state["status"], RTC_STS, "the alarm fired");
        // Saved after a wake from S3 (the run control's, which takes parked vCPUs to reach).
        state["status"] = json!(RTC_STS | WAK_STS);
        let saved = u32::try_from(state["timer"].as_u64().unwrap()).unwrap();
        // 50 ms is 178,977 ticks (a loaded host sleeps longer, never shorter).
        assert!(saved >= 170_000, "{saved} ticks");

        let restored = device();
        restored.restore(state).unwrap();
        let ahead = timer(&restored).wrapping_sub(saved) & TMR_VAL_MASK;
        // A timer counting from 0 again would be ~16.6 M ticks "ahead" (it wrapped back).
        assert!(
            ahead < 3_579_545,
            "the timer goes on from {saved}: {ahead} ticks ahead"
        );
        assert_eq!(
            read16(&restored, PM1_EVT_OFFSET),
            RTC_STS | WAK_STS,
            "the alarm's status and WAK_STS"
        );
        assert_eq!(read16(&restored, PM1_EVT_OFFSET + 2), RTC_STS);
        assert_eq!(read16(&restored, PM1_CNT_OFFSET), 5 << 10 | SCI_EN);
        restored.write(PM1_EVT_OFFSET.into(), &WAK_STS.to_le_bytes());
        assert_eq!(read16(&restored, PM1_EVT_OFFSET), RTC_STS, "WAK_STS clears");
    }

    #[test]
    fn a_corrupted_state_is_refused_naming_the_field() {
        let dev = device();
        let good = dev.save().unwrap();
        let corrupt = |field: &str, value: serde_json::Value| {
            let mut state = good.clone();
            state[field] = value;
            dev.restore(state).unwrap_err().what
        };
        assert_eq!(corrupt("status", json!(1)), "acpi-pm.status");
        assert_eq!(corrupt("control", json!(SLP_EN)), "acpi-pm.control");
        assert_eq!(corrupt("timer", json!(1 << 24)), "acpi-pm.timer");
        assert_eq!(corrupt("enable", json!(-1)), "acpi-pm");
    }
}
