//! One counter of an 8254 (Intel 8254 Programmable Interval Timer datasheet, 231164-005): its
//! control word, count register, latches and gate, and its count and OUT worked out from the
//! ticks elapsed since counting started, without threads. Time is in ticks of the PC's
//! 1.193182 MHz input clock.

use serde::{Deserialize, Serialize};

/// The count a write of 0 loads: the counter's full range (datasheet, "Counter Loading").
pub const FULL_COUNT: u32 = 0x1_0000;

/// RW bits of the control word: which bytes of the count a read or write moves.
pub const RW_LSB: u8 = 1;
pub const RW_MSB: u8 = 2;
pub const RW_BOTH: u8 = 3;

/// A count as the counter's 16 bits hold it: 65536 is 0.
fn as_read(count: u64) -> u16 {
    u16::try_from(count % u64::from(FULL_COUNT)).expect("below 65536")
}

/// One counter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counter {
    /// The mode, 0 to 5 (6 and 7 are written as 2 and 3).
    pub mode: u8,
    /// RW_LSB, RW_MSB or RW_BOTH.
    pub access: u8,
    /// The BCD bit, kept for the status byte; counting is binary (as QEMU's i8254).
    pub bcd: bool,
    /// The gate input (channel 2's is port 0x61 bit 0; channels 0 and 1 are tied high).
    pub gate: bool,
    /// The count last loaded, 1 to 65536; `None` from a control word until a count is written
    /// (the datasheet's "null count").
    pub count: Option<u32>,
    /// When counting started: the count was loaded, or (modes 1, 2, 3, 5) the gate rose.
    pub started_at: u64,
    /// Modes 1 and 5 count only after a rising gate edge triggers them.
    pub triggered: bool,
    /// The low byte of an RW_BOTH count written, awaiting its high byte.
    pub pending_lsb: Option<u8>,
    /// For RW_BOTH reads of the live count: the high byte comes next.
    pub read_msb_next: bool,
    /// A latched count, and whether its high byte comes next.
    pub latched: Option<(u16, bool)>,
    /// A latched status byte (read-back command), read before any latched count.
    pub status: Option<u8>,
}

impl Default for Counter {
    /// As after power-on: mode 0, LSB then MSB, no count, gate high.
    fn default() -> Self {
        Counter {
            mode: 0,
            access: RW_BOTH,
            bcd: false,
            gate: true,
            count: None,
            started_at: 0,
            triggered: false,
            pending_lsb: None,
            read_msb_next: false,
            latched: None,
            status: None,
        }
    }
}

impl Counter {
    /// A control word with RW bits `access` (not 0: that is a latch), mode bits and BCD.
    pub fn program(&mut self, access: u8, mode: u8, bcd: bool) {
        // Modes 6 and 7 are 2 and 3 (the datasheet's "X1X").
        let mode = if mode > 5 { mode - 4 } else { mode };
        *self = Counter {
            mode,
            access,
            bcd,
            gate: self.gate,
            ..Counter::default()
        };
    }

    /// Ticks counted at `now`, or `None` while the counter does not count.
    fn elapsed(&self, now: u64) -> Option<(u64, u64)> {
        let count = u64::from(self.count?);
        if matches!(self.mode, 1 | 5) && !self.triggered {
            return None;
        }
        Some((now.saturating_sub(self.started_at), count))
    }

    /// The counting element at `now`, as a read shows it (65536 reads as 0).
    pub fn value(&self, now: u64) -> u16 {
        let Some((d, count)) = self.elapsed(now) else {
            return self.count.map_or(0, |c| as_read(c.into()));
        };
        let v = match self.mode {
            2 => count - d % count,
            // Mode 3 decrements by two each clock (datasheet, Mode 3).
            3 => count - (2 * d) % count,
            // Modes 0, 1, 4, 5 wrap past zero and go on counting down.
            _ => (count + FULL_COUNT as u64 - d % FULL_COUNT as u64) % FULL_COUNT as u64,
        };
        as_read(v)
    }

    /// The OUT pin at `now`.
    pub fn out(&self, now: u64) -> bool {
        let Some((d, count)) = self.elapsed(now) else {
            // Mode 0 sets OUT low at its control word; every other mode, high.
            return self.mode != 0;
        };
        match self.mode {
            0 | 1 => d >= count,
            // Low for the one clock the count is 1, then reloaded.
            2 => d % count != count - 1,
            // High for the first half of the period (the larger one when odd), low for the rest.
            3 => d % count < count.div_ceil(2),
            // Low for one clock at terminal count.
            _ => d != count,
        }
    }

    /// The first rising edge of OUT after `after`, or `None` if none is to come without the
    /// guest doing something. Channel 0's rising edges are IRQ 0's.
    pub fn next_rising_edge(&self, after: u64) -> Option<u64> {
        let (d, count) = self.elapsed(after)?;
        let start = self.started_at;
        match self.mode {
            0 | 1 => (d < count).then_some(start + count),
            // Each period ends with OUT rising as the count reloads.
            2 | 3 => Some(start + (d / count + 1) * count),
            _ => (d < count + 1).then_some(start + count + 1),
        }
    }

    /// Load `value` (0 is 65536) at `now`: counting starts (modes 1 and 5 wait for a trigger).
    fn load(&mut self, value: u16, now: u64) {
        self.count = Some(if value == 0 { FULL_COUNT } else { value.into() });
        self.started_at = now;
        self.triggered = false;
    }

    /// A write to the counter's data port at `now`.
    pub fn write(&mut self, byte: u8, now: u64) {
        match self.access {
            RW_LSB => self.load(byte.into(), now),
            RW_MSB => self.load(u16::from(byte) << 8, now),
            _ => match self.pending_lsb.take() {
                Some(lsb) => self.load(u16::from_le_bytes([lsb, byte]), now),
                None => self.pending_lsb = Some(byte),
            },
        }
    }

    /// A read of the counter's data port at `now`: a latched status, else a latched count,
    /// else the live count, a byte at a time as the RW bits say.
    pub fn read(&mut self, now: u64) -> u8 {
        if let Some(status) = self.status.take() {
            return status;
        }
        // A latch holds until each byte of it was read.
        if let Some((value, msb_next)) = self.latched {
            let [lsb, msb] = value.to_le_bytes();
            return match self.access {
                RW_LSB => {
                    self.latched = None;
                    lsb
                }
                RW_BOTH if !msb_next => {
                    self.latched = Some((value, true));
                    lsb
                }
                _ => {
                    self.latched = None;
                    msb
                }
            };
        }
        let [lsb, msb] = self.value(now).to_le_bytes();
        match self.access {
            RW_LSB => lsb,
            RW_MSB => msb,
            _ => {
                self.read_msb_next = !self.read_msb_next;
                if self.read_msb_next { lsb } else { msb }
            }
        }
    }

    /// The counter latch command: the count at `now` holds for reading; a second latch before
    /// the first was read is ignored (datasheet, "Counter Latch Command").
    pub fn latch_count(&mut self, now: u64) {
        if self.latched.is_none() {
            self.latched = Some((self.value(now), false));
        }
    }

    /// The read-back command's status latch: OUT, null count, RW, mode, BCD (datasheet,
    /// "Status Byte"); a second before the first was read is ignored.
    pub fn latch_status(&mut self, now: u64) {
        if self.status.is_none() {
            self.status = Some(
                u8::from(self.out(now)) << 7
                    | u8::from(self.count.is_none()) << 6
                    | self.access << 4
                    | self.mode << 1
                    | u8::from(self.bcd),
            );
        }
    }

    /// The gate input at `now`. A rising edge starts modes 1 and 5 and restarts 2 and 3 from
    /// their count; in modes 0 and 4 a low gate would suspend counting, which is not
    /// modelled (as in QEMU's i8254): no PC guest gates those modes.
    pub fn set_gate(&mut self, high: bool, now: u64) {
        if high && !self.gate && self.count.is_some() && matches!(self.mode, 1 | 2 | 3 | 5) {
            self.started_at = now;
            self.triggered = true;
        }
        self.gate = high;
    }
}
