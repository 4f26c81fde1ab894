//! The MC146818's registers and CMOS bytes behind its index and data ports, as a state machine
//! with no threads: each access and each timer expiry names the host time (`now`, since the
//! epoch), and the interrupt flags the time since the last look has raised are worked out then
//! (MC146818A datasheet, "Registers", "Interrupts"). The clock runs at the host's UTC plus the
//! offset the guest set.

use std::time::Duration;

use super::calendar::{Fields, HOUR, MIN, Mode, SEC};

/// Register A (MC146818A "Register A"): UIP in bit 7 (read-only), the divider in bits 6..4,
/// the periodic rate in bits 3..0. Its reset value: the 32.768 kHz divider, 1024 Hz rate.
pub const REG_A: u8 = 0x0a;
pub const UIP: u8 = 0x80;
const RATE_MASK: u8 = 0x0f;
const REG_A_RESET: u8 = 0x26;
/// Register B: SET halts the update, then the interrupt enables (periodic, alarm, update
/// ended), the data mode (DM: binary) and 24/12. Its reset value: BCD, 24-hour.
pub const REG_B: u8 = 0x0b;
pub const SET: u8 = 0x80;
pub const PIE: u8 = 0x40;
pub const AIE: u8 = 0x20;
pub const UIE: u8 = 0x10;
const DM: u8 = 0x04;
const HOURS24: u8 = 0x02;
const REG_B_RESET: u8 = HOURS24;
/// Register C: IRQF and the flags (periodic, alarm, update ended); read-only, cleared by a read.
pub const REG_C: u8 = 0x0c;
pub const IRQF: u8 = 0x80;
pub const FLAGS: u8 = PIE | AIE | UIE;
/// Register D: VRT, the battery is good (read-only).
pub const REG_D: u8 = 0x0d;
const VRT: u8 = 0x80;
/// The alarm registers: seconds, minutes, hours; a value 0xC0..=0xFF matches any.
const ALARM: [u8; 3] = [1, 3, 5];
const DONT_CARE: u8 = 0xc0;
/// The time registers, in [`Fields::time`] order.
const TIME: [u8; 7] = [0, 2, 4, 6, 7, 8, 9];
/// The century byte, as the FADT's CENTURY field names it.
pub const CENTURY: u8 = 0x32;
/// How long UIP reads set before each update (MC146818A: t_BUC, 244 µs).
const UIP_LEAD: Duration = Duration::from_micros(244);
/// The periodic interrupt's time base: the 32.768 kHz divider chain.
const BASE_HZ: u64 = 32_768;
const DAY: i64 = 86_400;

/// The CMOS bytes (128, as in PC CMOS; the index port's bit 7 masks NMIs, not an address bit).
pub const CMOS_LEN: usize = 128;

/// What an access or a timer expiry asks of the device around the state.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Raised {
    /// IRQF went from clear to set: pulse IRQ 8.
    pub irq: bool,
    /// The alarm fired with AIE set: an ACPI wake event (RTC_STS).
    pub alarm: bool,
}

/// The chip: the CMOS bytes (which hold the alarm and registers A and B too), register C, and
/// the clock.
pub struct Cmos {
    pub(super) ram: [u8; CMOS_LEN],
    pub(super) reg_c: u8,
    /// The guest's time less the host's, in seconds.
    pub(super) offset: i64,
    /// The time registers while SET halts the updates.
    pub(super) held: Option<Fields>,
    /// Up to when the flags are worked out.
    pub(super) checked: Duration,
}

impl Cmos {
    /// A chip at its reset values, with the CMOS bytes `bytes` (index, value) and the host's
    /// time at `now`.
    pub fn new(bytes: &[(u8, u8)], now: Duration) -> Self {
        let mut ram = [0u8; CMOS_LEN];
        for &(i, v) in bytes {
            ram[usize::from(i) % CMOS_LEN] = v;
        }
        ram[usize::from(REG_A)] = REG_A_RESET;
        ram[usize::from(REG_B)] = REG_B_RESET;
        Cmos {
            ram,
            reg_c: 0,
            offset: 0,
            held: None,
            checked: now,
        }
    }

    fn reg(&self, index: u8) -> u8 {
        self.ram[usize::from(index) % CMOS_LEN]
    }

    fn mode(&self) -> Mode {
        let b = self.reg(REG_B);
        Mode {
            binary: b & DM != 0,
            hours24: b & HOURS24 != 0,
        }
    }

    fn guest_secs(&self, now: Duration) -> i64 {
        i64::try_from(now.as_secs())
            .unwrap_or(i64::MAX)
            .saturating_add(self.offset)
    }

    /// The time registers: held while SET, else the clock's.
    fn fields(&self, now: Duration) -> Fields {
        self.held
            .unwrap_or_else(|| self.mode().fields(self.guest_secs(now)))
    }

    /// Make the clock read `fields` now (or hold them, while SET).
    fn set_fields(&mut self, fields: Fields, now: Duration) {
        if self.held.is_some() {
            self.held = Some(fields);
        } else {
            let host = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
            self.offset = self.mode().seconds(&fields).saturating_sub(host);
        }
    }

    /// The guest reads CMOS byte `index`.
    pub fn read(&mut self, index: u8, now: Duration) -> (u8, Raised) {
        let raised = self.catch_up(now);
        let value = match index {
            REG_A => {
                let updating = self.held.is_none()
                    && Duration::from_secs(1).saturating_sub(UIP_LEAD)
                        <= Duration::from_nanos(now.subsec_nanos().into());
                self.reg(REG_A) & !UIP | if updating { UIP } else { 0 }
            }
            REG_C => std::mem::take(&mut self.reg_c),
            REG_D => VRT,
            CENTURY => self.fields(now).century,
            i => match TIME.iter().position(|&t| t == i) {
                Some(field) => self.fields(now).time[field],
                None => self.reg(i),
            },
        };
        (value, raised)
    }

    /// The guest writes `value` to CMOS byte `index`.
    pub fn write(&mut self, index: u8, value: u8, now: Duration) -> Raised {
        let mut raised = self.catch_up(now);
        match index {
            REG_A => self.ram[usize::from(REG_A)] = value & !UIP,
            REG_B => self.write_b(value, now),
            REG_C | REG_D => {}
            CENTURY => {
                let mut fields = self.fields(now);
                fields.century = value;
                self.set_fields(fields, now);
            }
            i => match TIME.iter().position(|&t| t == i) {
                Some(field) => {
                    let mut fields = self.fields(now);
                    fields.time[field] = value;
                    self.set_fields(fields, now);
                }
                None => self.ram[usize::from(i) % CMOS_LEN] = value,
            },
        }
        raised.irq |= self.update_irqf();
        raised
    }

    /// Register B: SET holds the time registers (and clears UIE, as the datasheet says), and
    /// its clearing starts the clock from what the guest wrote.
    fn write_b(&mut self, value: u8, now: Duration) {
        let was_set = self.held.is_some();
        let value = if value & SET != 0 {
            value & !UIE
        } else {
            value
        };
        if value & SET != 0 && !was_set {
            self.held = Some(self.fields(now));
        }
        self.ram[usize::from(REG_B)] = value;
        if value & SET == 0
            && let Some(fields) = self.held.take()
        {
            self.set_fields(fields, now);
        }
    }

    /// Set IRQF if a flag is set with its enable; whether it went from clear to set.
    fn update_irqf(&mut self) -> bool {
        let pending = self.reg_c & self.reg(REG_B) & FLAGS != 0;
        let raise = pending && self.reg_c & IRQF == 0;
        if pending {
            self.reg_c |= IRQF;
        }
        raise
    }

    /// The periodic interrupt's period, if register A selects one: rates 1 and 2 are those of
    /// 8 and 9 with the 32.768 kHz time base (MC146818A table 5).
    fn period(&self) -> Option<Duration> {
        let rate = match self.reg(REG_A) & RATE_MASK {
            0 => return None,
            r @ 1..=2 => r + 7,
            r => r,
        };
        Some(Duration::from_nanos(
            (1u64 << (rate - 1)) * 1_000_000_000 / BASE_HZ,
        ))
    }

    /// Whether the alarm matches the guest's second `secs`.
    fn alarm_matches(&self, secs: i64) -> bool {
        let tod = u32::try_from(secs.rem_euclid(DAY)).expect("below a day");
        let now = self.mode().time_of_day(tod);
        [SEC, MIN, HOUR].iter().all(|&i| {
            let alarm = self.reg(ALARM[i]);
            alarm >= DONT_CARE || alarm == now[i]
        })
    }

    /// Raise the flags the time from the last look to `now` brought: PF at each period, UF at
    /// each update (none while SET), AF at an update whose time the alarm matches.
    pub fn catch_up(&mut self, now: Duration) -> Raised {
        let from = self.checked;
        if now <= from {
            return Raised::default();
        }
        self.checked = now;
        let before = self.reg_c;
        if let Some(p) = self.period()
            && now.as_nanos() / p.as_nanos() > from.as_nanos() / p.as_nanos()
        {
            self.reg_c |= PIE;
        }
        let (first, last) = (from.as_secs() + 1, now.as_secs());
        if self.held.is_none() && first <= last {
            self.reg_c |= UIE;
            // A day of updates covers every time the alarm can name.
            let first = first.max(last.saturating_sub(DAY as u64 - 1));
            let offset = self.offset;
            let to_guest = |s: u64| i64::try_from(s).unwrap_or(i64::MAX).saturating_add(offset);
            if (first..=last).any(|s| self.alarm_matches(to_guest(s))) {
                self.reg_c |= AIE;
            }
        }
        let alarm = (self.reg_c & !before & AIE != 0) && self.reg(REG_B) & AIE != 0;
        Raised {
            irq: self.update_irqf(),
            alarm,
        }
    }

    /// When the next enabled interrupt is due, if one is: the timer sleeps until then.
    pub fn next_deadline(&self, now: Duration) -> Option<Duration> {
        let enabled = self.reg(REG_B);
        let next_second = Duration::from_secs(now.as_secs() + 1);
        let periodic = self.period().filter(|_| enabled & PIE != 0).map(|p| {
            let n = now.as_nanos() / p.as_nanos() + 1;
            Duration::from_nanos(u64::try_from(n * p.as_nanos()).unwrap_or(u64::MAX))
        });
        let running = self.held.is_none();
        let update = (running && enabled & UIE != 0).then_some(next_second);
        let alarm = (running && enabled & AIE != 0)
            .then(|| {
                let guest = self.guest_secs(now);
                (1..=DAY).find(|k| self.alarm_matches(guest.saturating_add(*k)))
            })
            .flatten()
            .map(|k| next_second + Duration::from_secs(u64::try_from(k - 1).expect("positive")));
        [periodic, update, alarm].into_iter().flatten().min()
    }
}
