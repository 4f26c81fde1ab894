//! The RTC's date and time registers (MC146818A datasheet, "Address map" and table 3): seconds
//! since the epoch to the bytes the guest reads, in BCD or binary and in 12- or 24-hour mode,
//! and back. The calendar is written here (H. Hinnant's `days_from_civil` and
//! `civil_from_days`, "chrono-Compatible Low-Level Date Algorithms"): glibc's `gmtime_r` and
//! `timegm` load the time zone files on their first call, which a vCPU thread's seccomp
//! filter forbids, and no crate the project uses does UTC dates.

/// Register B data-mode bits (MC146818A "Register B").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mode {
    /// DM: binary (true) or BCD (false).
    pub binary: bool,
    /// 24/12: 24-hour (true) or 12-hour with the PM flag in bit 7 of the hour (false).
    pub hours24: bool,
}

/// The hour byte's PM flag in 12-hour mode.
const PM: u8 = 0x80;

/// The time registers, in register order: seconds, minutes, hours, day of week (1 = Sunday),
/// day of month, month, year within the century; then the century (CMOS byte 0x32).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fields {
    /// Registers 0, 2, 4, 6, 7, 8, 9 in that order (the alarm bytes sit between them).
    pub time: [u8; 7],
    /// The century byte.
    pub century: u8,
}

/// Indices into [`Fields::time`].
pub const SEC: usize = 0;
/// Minutes.
pub const MIN: usize = 1;
/// Hours.
pub const HOUR: usize = 2;
const MDAY: usize = 4;
const MONTH: usize = 5;
const YEAR: usize = 6;

impl Mode {
    /// `v` (0..=99) as the guest reads it.
    pub fn encode(self, v: u8) -> u8 {
        if self.binary {
            v
        } else {
            ((v / 10) << 4) | (v % 10)
        }
    }

    /// A byte the guest wrote, as a number; a BCD byte with digits above 9 decodes as its
    /// nibbles say (the calendar then normalizes it), as no valid byte does.
    pub fn decode(self, b: u8) -> u8 {
        if self.binary {
            b
        } else {
            (b >> 4).saturating_mul(10).saturating_add(b & 0xf)
        }
    }

    /// Hours 0..=23 as the guest reads them: 12-hour mode counts 12, 1..11 with PM in bit 7.
    pub fn encode_hour(self, h: u8) -> u8 {
        if self.hours24 {
            return self.encode(h);
        }
        let pm = if h >= 12 { PM } else { 0 };
        let h12 = match h % 12 {
            0 => 12,
            h => h,
        };
        self.encode(h12) | pm
    }

    /// An hour byte the guest wrote, as 0..=23.
    pub fn decode_hour(self, b: u8) -> u8 {
        if self.hours24 {
            return self.decode(b);
        }
        let h12 = self.decode(b & !PM) % 12;
        if b & PM != 0 { h12 + 12 } else { h12 }
    }

    /// The registers at `secs` seconds since the epoch (UTC).
    pub fn fields(self, secs: i64) -> Fields {
        let (days, tod) = (secs.div_euclid(SECS_PER_DAY), secs.rem_euclid(SECS_PER_DAY));
        let (year, month, day) = civil_from_days(days);
        let byte = |v: i64| u8::try_from(v.rem_euclid(100)).expect("below 100");
        // 1970-01-01 was a Thursday: 5 in the RTC's count from Sunday = 1.
        let weekday = (days + 4).rem_euclid(7) + 1;
        let [sec, min, hour] = self.time_of_day(u32::try_from(tod).expect("below a day"));
        Fields {
            time: [
                sec,
                min,
                hour,
                self.encode(byte(weekday)),
                self.encode(byte(day)),
                self.encode(byte(month)),
                self.encode(byte(year)),
            ],
            century: self.encode(byte(year.div_euclid(100))),
        }
    }

    /// Seconds since the epoch of the time `fields` hold (the day of week is not used: the
    /// date gives it). Out-of-range values carry over (a 31st of April is the 1st of May).
    pub fn seconds(self, fields: &Fields) -> i64 {
        let f = |i: usize| i64::from(self.decode(fields.time[i]));
        let year = i64::from(self.decode(fields.century)) * 100 + f(YEAR);
        // Months past 12 carry into the year; month 0 is December of the year before.
        let months = year * 12 + f(MONTH) - 1;
        let days =
            days_from_civil(months.div_euclid(12), months.rem_euclid(12) + 1, 1) + f(MDAY) - 1;
        let hour = i64::from(self.decode_hour(fields.time[HOUR]));
        days * SECS_PER_DAY + hour * 3600 + f(MIN) * 60 + f(SEC)
    }

    /// Seconds into the day, as the alarm compares them: the hour, minute and second bytes.
    pub fn time_of_day(self, secs_of_day: u32) -> [u8; 3] {
        let byte = |v: u32| u8::try_from(v).expect("below 60");
        [
            self.encode(byte(secs_of_day % 60)),
            self.encode(byte(secs_of_day / 60 % 60)),
            self.encode_hour(byte(secs_of_day / 3600 % 24)),
        ]
    }
}

const SECS_PER_DAY: i64 = 86_400;

/// Days since 1970-01-01 of a proleptic Gregorian date (`month` 1..=12).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date (year, month 1..=12, day 1..=31) `days` after 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_dates_round_trip_across_leap_years_and_centuries() {
        for (date, days) in [
            ((1970, 1, 1), 0),
            ((2000, 2, 29), 11_016),
            ((2000, 3, 1), 11_017),
            ((2100, 3, 1), 47_541),
            ((1969, 12, 31), -1),
        ] {
            assert_eq!(days_from_civil(date.0, date.1, date.2), days, "{date:?}");
            assert_eq!(civil_from_days(days), date);
        }
    }
}
