//! The ACPI fixed-hardware registers a PC has at its power-management base (ACPI 6.5 §4.8.3):
//! the PM1a event block (status and enable: the RTC alarm and wake status), the PM1a control
//! block (sleep type and enable: S3 suspends to RAM, S5 is an orderly power-off) and the
//! power-management timer (§4.8.3.3), at the addresses of QEMU's q35 machine (the ICH9 PMBASE
//! 0x600), which the FADT gives the guest.

mod facs;
mod persist;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use vm_memory::GuestMemoryMmap;

use crate::bus::BusDevice;
use crate::guest_error;
use crate::logging::DeviceLog;
use crate::vm::run_control::{RunControl, StopReason};

/// First port of the block.
pub const PM_BASE: u16 = 0x600;
/// Offset of PM1a_EVT_BLK: PM1 status (2 bytes) and PM1 enable (2 bytes).
pub const PM1_EVT_OFFSET: u16 = 0;
/// Length of PM1a_EVT_BLK: PM1 status and PM1 enable (ACPI 6.5 §4.8.3.1).
pub const PM1_EVT_LEN: u8 = 4;
/// Offset of PM1a_CNT_BLK: right after the event block.
pub const PM1_CNT_OFFSET: u16 = 4;
/// Length of PM1a_CNT_BLK: the 16-bit PM1 control register (ACPI 6.5 §4.8.3.2).
pub const PM1_CNT_LEN: u8 = 2;
/// Offset of PM_TMR_BLK: port 0x608, as QEMU has it.
pub const PM_TMR_OFFSET: u16 = 8;
/// Length of PM_TMR_BLK: the 32-bit timer register (ACPI 6.5 §4.8.3.3).
pub const PM_TMR_LEN: u8 = 4;
/// Ports the device decodes.
pub const PM_BLOCK_LEN: u16 = PM_TMR_OFFSET + PM_TMR_LEN as u16;

/// The timer's fixed frequency (ACPI 6.5 §4.8.3.3).
pub const PM_TIMER_HZ: u128 = 3_579_545;
/// The timer counts in 24 bits (the FADT leaves TMR_VAL_EXT clear), as QEMU's does.
const TMR_VAL_MASK: u32 = 0xff_ffff;

/// PM1 control bits (ACPI 6.5 §4.8.3.2.1, table 4.16).
const SCI_EN: u16 = 1 << 0;
const SLP_TYP_SHIFT: u16 = 10;
const SLP_TYP_MASK: u16 = 0x7 << SLP_TYP_SHIFT;
const SLP_EN: u16 = 1 << 13;
/// PM1 status and enable bits (ACPI 6.5 §4.8.3.1.1, tables 4.11 and 4.12): the RTC alarm
/// (RTC_STS, and RTC_EN in the enable register: a wake source) and WAK_STS, set when the
/// machine wakes from a sleeping state.
const RTC_STS: u16 = 1 << 10;
const WAK_STS: u16 = 1 << 15;
/// The SLP_TYP of S3 (suspend to RAM), as the DSDT's `\_S3` package gives it: QEMU's value.
pub const S3_SLP_TYP: u16 = 1;
/// The SLP_TYP of S5 (soft off), as the DSDT's `\_S5` package gives it: QEMU's value, so a
/// kernel that powers QEMU off powers exitless off.
pub const S5_SLP_TYP: u16 = 0;

/// The registers the guest can write.
#[derive(Default)]
struct Regs {
    status: u16,
    enable: u16,
    control: u16,
}

/// The power-management block: PM1a event and control registers and the PM timer.
pub struct AcpiPm {
    regs: Mutex<Regs>,
    /// When the timer read 0: it counts from the device's creation (or from where a snapshot
    /// left it).
    start: Mutex<Instant>,
    control: Arc<RunControl>,
    log: Arc<DeviceLog>,
    /// Guest memory and the FACS's address there, where S3 finds the waking vector.
    facs: Option<(GuestMemoryMmap, u64)>,
}

impl AcpiPm {
    /// A block whose S5 request stops the run through `control`.
    pub fn new(control: Arc<RunControl>, log: Arc<DeviceLog>) -> Self {
        AcpiPm {
            regs: Mutex::default(),
            start: Mutex::new(Instant::now()),
            control,
            log,
            facs: None,
        }
    }

    /// The block, with S3 resuming at the waking vector of the FACS at `at` in `memory`.
    pub fn with_facs(self, memory: GuestMemoryMmap, at: u64) -> Self {
        AcpiPm {
            facs: Some((memory, at)),
            ..self
        }
    }

    /// The RTC's alarm fired: RTC_STS is set, and with RTC_EN it wakes the machine from S3
    /// (ACPI 6.5 §4.8.3.1.1).
    pub fn rtc_alarm(&self) {
        let mut regs = self.regs.lock().unwrap_or_else(PoisonError::into_inner);
        regs.status |= RTC_STS;
        if regs.enable & RTC_STS != 0 {
            drop(regs);
            self.control.sleep().wake();
        }
    }

    /// The device's log, for its guest errors.
    pub fn log(&self) -> &Arc<DeviceLog> {
        &self.log
    }

    /// TMR_VAL: ticks of the 3.579545 MHz clock since the device was made, in 24 bits.
    fn timer(&self) -> u32 {
        let start = *self.start.lock().unwrap_or_else(PoisonError::into_inner);
        let ticks = start.elapsed().as_nanos() * PM_TIMER_HZ / 1_000_000_000;
        u32::try_from(ticks & u128::from(TMR_VAL_MASK)).expect("24 bits")
    }

    /// The block as the guest reads it. PM1 status holds RTC_STS and WAK_STS (no SCI is raised
    /// for them: the guest polls, or learns of them on waking). SCI_EN reads set: the machine is in ACPI mode from the
    /// start (the FADT has no SMI_CMD port to switch it). SLP_EN always reads zero.
    fn image(&self) -> [u8; PM_BLOCK_LEN as usize] {
        let regs = self.regs.lock().unwrap_or_else(PoisonError::into_inner);
        let mut image = [0u8; PM_BLOCK_LEN as usize];
        let at = |offset: u16| usize::from(offset);
        let woke = if self.control.sleep().woke() {
            WAK_STS
        } else {
            0
        };
        image[at(PM1_EVT_OFFSET)..at(PM1_EVT_OFFSET) + 2]
            .copy_from_slice(&(regs.status | woke).to_le_bytes());
        image[at(PM1_EVT_OFFSET) + 2..at(PM1_EVT_OFFSET) + 4]
            .copy_from_slice(&regs.enable.to_le_bytes());
        image[at(PM1_CNT_OFFSET)..at(PM1_CNT_OFFSET) + 2]
            .copy_from_slice(&(regs.control | SCI_EN).to_le_bytes());
        drop(regs);
        image[at(PM_TMR_OFFSET)..].copy_from_slice(&self.timer().to_le_bytes());
        image
    }

    /// A write of PM1 control: SLP_EN with S5's sleep type powers off, with S3's suspends;
    /// other sleep states are not supported and the write is ignored, as QEMU ignores the ones
    /// it lacks.
    fn write_control(&self, value: u16) {
        if value & SLP_EN == 0 {
            return;
        }
        match (value & SLP_TYP_MASK) >> SLP_TYP_SHIFT {
            S5_SLP_TYP => self.control.stop(StopReason::PowerOff),
            S3_SLP_TYP => self.suspend(),
            typ => guest_error!(
                self.log,
                "sleep type {typ} requested: only S3 (type {S3_SLP_TYP}) and S5 (type \
                 {S5_SLP_TYP}) are supported; ignored"
            ),
        }
    }

    /// S3 (ACPI 6.5 §16.1.3): the vCPUs stop where they are, memory and devices keep their
    /// state, and a wake event resumes the boot vCPU at the FACS's waking vector, read now
    /// (the OS sets it before it sleeps, §7.4.2.4). An enabled wake event already pending
    /// wakes the machine at once, as on hardware. Without a usable vector the request is
    /// ignored, with a line in the log: firmware would reboot, which is no resume.
    fn suspend(&self) {
        let entry = match &self.facs {
            Some((memory, at)) => facs::waking_entry(memory, *at),
            None => Err(facs::FacsError::NoVector),
        };
        match entry {
            Ok(entry) => {
                let regs = self.regs.lock().unwrap_or_else(PoisonError::into_inner);
                let pending = regs.status & regs.enable & RTC_STS != 0;
                drop(regs);
                self.control.suspend(entry);
                if pending {
                    self.control.sleep().wake();
                }
            }
            Err(e) => guest_error!(self.log, "S3 requested, but {e}; ignored"),
        }
    }
}

impl BusDevice for AcpiPm {
    fn read(&self, offset: u64, data: &mut [u8]) {
        let image = self.image();
        for (i, byte) in data.iter_mut().enumerate() {
            let at = usize::try_from(offset).ok().and_then(|o| o.checked_add(i));
            *byte = at.and_then(|at| image.get(at)).copied().unwrap_or(0xff);
        }
    }

    /// Each byte lands in its register: PM1 status bits are write-one-to-clear, PM1 enable is
    /// kept, PM1 control is kept and acted on, the timer is read-only.
    fn write(&self, offset: u64, data: &[u8]) {
        let mut regs = self.regs.lock().unwrap_or_else(PoisonError::into_inner);
        let mut control = None;
        for (i, &byte) in data.iter().enumerate() {
            let Some(at) = offset.checked_add(i as u64) else {
                break;
            };
            let set_byte = |reg: u16, lane: u64| {
                let mut bytes = reg.to_le_bytes();
                bytes[usize::from(lane == 1)] = byte;
                u16::from_le_bytes(bytes)
            };
            let status = u64::from(PM1_EVT_OFFSET);
            let (enable, cnt) = (status + 2, u64::from(PM1_CNT_OFFSET));
            match at {
                a if (status..status + 2).contains(&a) => {
                    let clear = set_byte(0, a - status);
                    regs.status &= !clear;
                    if clear & WAK_STS != 0 {
                        self.control.sleep().clear_woke();
                    }
                }
                a if (enable..enable + 2).contains(&a) => {
                    regs.enable = set_byte(regs.enable, a - enable)
                }
                a if (cnt..cnt + 2).contains(&a) => {
                    let value = set_byte(control.unwrap_or(regs.control), a - cnt);
                    control = Some(value);
                }
                _ => {}
            }
        }
        if let Some(value) = control {
            regs.control = value & !(SLP_EN | SCI_EN);
            drop(regs);
            self.write_control(value);
        }
    }
}

#[cfg(test)]
mod tests;

impl crate::devices::rtc::RtcEvents for AcpiPm {
    fn alarm(&self) {
        self.rtc_alarm();
    }
}
