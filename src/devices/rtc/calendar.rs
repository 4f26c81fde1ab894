//! The RTC's date and time registers (MC146818A datasheet, "Address map" and table 3): seconds
//! since the epoch to the bytes the guest reads, in BCD or binary and in 12- or 24-hour mode,
//! and back. The calendar itself is glibc's (`gmtime_r`, `timegm`: UTC, no time zone files).

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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
const DAY: usize = 4;
const MONTH: usize = 5;
const YEAR: usize = 6;

impl Mode {
    /// `v` (0..=99) as the guest reads it.
    pub fn encode(self, v: u8) -> u8 {
        if self.binary {
            v
        } else {
            (v / 10) << 4 | v % 10
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
        let tm = gmtime(secs);
        let byte = |v: libc::c_int| u8::try_from(v.rem_euclid(100)).expect("below 100");
        let year = tm.tm_year + 1900;
        Fields {
            time: [
                self.encode(byte(tm.tm_sec)),
                self.encode(byte(tm.tm_min)),
                self.encode_hour(byte(tm.tm_hour)),
                self.encode(byte(tm.tm_wday + 1)),
                self.encode(byte(tm.tm_mday)),
                self.encode(byte(tm.tm_mon + 1)),
                self.encode(byte(year)),
            ],
            century: self.encode(byte(year.div_euclid(100))),
        }
    }

    /// Seconds since the epoch of the time `fields` hold (the day of week is not used: the
    /// date gives it). Out-of-range values carry over, as `timegm` normalizes them.
    pub fn seconds(self, fields: &Fields) -> i64 {
        let f = |i: usize| libc::c_int::from(self.decode(fields.time[i]));
        let year = libc::c_int::from(self.decode(fields.century)) * 100 + f(YEAR);
        // SAFETY: an all-zero tm is a valid value (every field an integer, tm_zone null).
        let mut tm: libc::tm = unsafe { std::mem::zeroed() };
        tm.tm_sec = f(SEC);
        tm.tm_min = f(MIN);
        tm.tm_hour = libc::c_int::from(self.decode_hour(fields.time[HOUR]));
        tm.tm_mday = f(DAY);
        tm.tm_mon = f(MONTH) - 1;
        tm.tm_year = year - 1900;
        // SAFETY: timegm reads and normalizes the tm it is given, and touches nothing else.
        i64::from(unsafe { libc::timegm(&mut tm) })
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

/// `secs` broken down in UTC.
fn gmtime(secs: i64) -> libc::tm {
    // SAFETY: an all-zero tm is a valid value; gmtime_r writes only the tm it is given.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let t = libc::time_t::from(secs);
    // SAFETY: both pointers are to live locals; gmtime_r reads no time zone data.
    let ok = !unsafe { libc::gmtime_r(&t, &mut tm) }.is_null();
    debug_assert!(ok, "a 64-bit time_t always converts");
    tm
}
