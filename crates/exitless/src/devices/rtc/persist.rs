//! The RTC and CMOS in a snapshot: the index last written, the 128 CMOS bytes (which hold
//! registers A and B and the alarm), register C's flags, the time registers SET holds, and the
//! clock as the offset of the guest's time from the host's.
//!
//! What a restored clock shows is a choice of time base. Keeping the offset, as QEMU's
//! `-rtc base=` does, makes it show the host's time plus what the guest set: a guest restored an
//! hour later reads a clock an hour on, as a PC's battery-backed clock would after an hour off.
//! The interrupt flags of the time the machine was off are not raised: flags are worked out
//! from the restore on, and the timer thread is woken to sleep until the next enabled one.

use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::Rtc;
use super::calendar::Fields;
use super::cmos::{CMOS_LEN, FLAGS, IRQF, REG_A, REG_B, Raised, SET, UIE, UIP};
use crate::persist::{Persist, StateError, from_state, to_state};

const ID: &str = "rtc";
/// The largest offset kept, in seconds (about 139,000 years): any date a guest can write is
/// well within it, and the calendar's arithmetic stays far from overflow.
const MAX_OFFSET: i64 = 1 << 42;

#[derive(Serialize, Deserialize)]
struct Saved {
    /// The CMOS index the guest last wrote (the index port's bit 7 is not part of it).
    index: u8,
    /// The CMOS bytes.
    ram: Vec<u8>,
    /// Register C: IRQF and the flags, until the guest reads it.
    reg_c: u8,
    /// The guest's time less the host's, in seconds.
    offset: i64,
    /// The time registers while register B's SET holds them.
    held: Option<Fields>,
}

fn check(s: &Saved) -> Result<[u8; CMOS_LEN], StateError> {
    let bad = |field: &str, why: String| Err(StateError::new(format!("{ID}.{field}"), why));
    if usize::from(s.index) >= CMOS_LEN {
        return bad("index", format!("{} is past the {CMOS_LEN} bytes", s.index));
    }
    let Ok(ram) = <[u8; CMOS_LEN]>::try_from(s.ram.as_slice()) else {
        return bad("ram", format!("{} bytes, not {CMOS_LEN}", s.ram.len()));
    };
    if ram[usize::from(REG_A)] & UIP != 0 {
        return bad("ram", "register A's UIP is read-only, never stored".into());
    }
    let b = ram[usize::from(REG_B)];
    if b & SET != 0 && b & UIE != 0 {
        return bad("ram", "register B has SET and UIE: SET clears UIE".into());
    }
    if (b & SET != 0) != s.held.is_some() {
        return bad(
            "held",
            "time registers are held exactly while SET is".into(),
        );
    }
    if s.reg_c & !(IRQF | FLAGS) != 0 {
        return bad(
            "reg_c",
            format!("{:#x} sets bits register C lacks", s.reg_c),
        );
    }
    if !(-MAX_OFFSET..=MAX_OFFSET).contains(&s.offset) {
        return bad("offset", format!("{} s is beyond any date", s.offset));
    }
    Ok(ram)
}

impl Persist for Rtc {
    /// Hold the timer thread: an interrupt raised after the irqchip's state was taken and
    /// before register C's would leave IRQF set with no edge to come, and the guest's RTC
    /// interrupts would stop. Taking the lock waits out a delivery in progress.
    fn pause(&self) -> Result<(), StateError> {
        self.shared.state.pause();
        Ok(())
    }

    /// After a restore, IRQ 8 is an edge the restored interrupt controllers may not hold
    /// (and the userspace IOAPIC, a Persist too, may have been restored after this chip):
    /// pulse it again while IRQF is set, as the chip's IRQ pin stays asserted until register
    /// C is read. A guest that had taken it reads C = 0 once more: a spurious interrupt,
    /// which drivers expect.
    fn resume(&self) {
        self.shared.state.resume(|state| {
            if self.shared.restored.swap(false, Ordering::AcqRel) {
                let irq = state.1.reg_c & IRQF != 0;
                self.shared.deliver(Raised { irq, alarm: false });
            }
        });
    }

    fn save(&self) -> Result<serde_json::Value, StateError> {
        let state = self.shared.lock();
        let (index, cmos) = (&state.0, &state.1);
        let saved = Saved {
            index: *index,
            ram: cmos.ram.to_vec(),
            reg_c: cmos.reg_c,
            offset: cmos.offset,
            held: cmos.held,
        };
        to_state(ID, &saved)
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), StateError> {
        let saved: Saved = from_state(ID, state)?;
        let ram = check(&saved)?;
        let now = (self.shared.clock)();
        let mut state = self.shared.lock();
        state.0 = saved.index;
        let cmos = &mut state.1;
        (cmos.ram, cmos.reg_c, cmos.offset, cmos.held) =
            (ram, saved.reg_c, saved.offset, saved.held);
        cmos.checked = now;
        self.shared.restored.store(true, Ordering::Release);
        drop(state);
        // The timer thread sleeps until the next enabled interrupt it knew of: re-arm it.
        self.shared.state.wake();
        Ok(())
    }
}
