//! The chipset's Reset Control Register at port 0xCF9 (RST_CNT in Intel's ICH9 datasheet):
//! setting RST_CPU (bit 2) resets the machine; SYS_RST (bit 1) and FULL_RST (bit 3) only choose
//! the kind of reset and are kept, as QEMU's ICH9 keeps them. The FADT names it as the ACPI
//! reset register, so a guest's ACPI reboot comes here.
//!
//! The port sits inside the PCI configuration ports 0xCF8..0xCFF: only dword accesses to 0xCF8
//! are CONFIG_ADDRESS, and the PCI port device hands byte accesses at 0xCF9 to this one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::bus::BusDevice;
use crate::persist::{Persist, StateError, from_state, to_state};
use crate::vm::run_control::{RunControl, StopReason};

/// The port RST_CNT sits at.
pub const RESET_CONTROL_PORT: u16 = 0xcf9;
/// The value the FADT tells the guest to write to reset: SYS_RST | RST_CPU, a hard reset.
pub const RESET_VALUE: u8 = SYS_RST | RST_CPU;

const SYS_RST: u8 = 1 << 1;
const RST_CPU: u8 = 1 << 2;
const FULL_RST: u8 = 1 << 3;

/// The Reset Control Register: its kept bits, and the run it stops on RST_CPU.
pub struct ResetControl {
    value: AtomicU8,
    control: Arc<RunControl>,
}

impl ResetControl {
    /// A register whose reset stops the run through `control`.
    pub fn new(control: Arc<RunControl>) -> Self {
        ResetControl {
            value: AtomicU8::new(0),
            control,
        }
    }
}

impl BusDevice for ResetControl {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(self.value.load(Ordering::Relaxed));
    }

    fn write(&self, _offset: u64, data: &[u8]) {
        let &[value] = data else {
            return;
        };
        if value & RST_CPU != 0 {
            self.control.stop(StopReason::Reset);
        } else {
            self.value
                .store(value & (SYS_RST | FULL_RST), Ordering::Relaxed);
        }
    }
}

/// In a snapshot: the kind bits kept (RST_CPU is never kept: it resets at once).
impl Persist for ResetControl {
    fn save(&self) -> Result<serde_json::Value, StateError> {
        to_state("reset-control", &self.value.load(Ordering::Relaxed))
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), StateError> {
        let value: u8 = from_state("reset-control", state)?;
        if value & !(SYS_RST | FULL_RST) != 0 {
            let why = format!("{value:#x}: only SYS_RST and FULL_RST are kept");
            return Err(StateError::new("reset-control", why));
        }
        self.value.store(value, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rst_cpu_resets_and_the_kind_bits_are_kept() {
        let control = Arc::new(RunControl::default());
        let reg = ResetControl::new(control.clone());
        reg.write(0, &[!RST_CPU]);
        let mut b = [0];
        reg.read(0, &mut b);
        assert_eq!(b, [SYS_RST | FULL_RST]);
        assert_eq!(control.wait(Duration::ZERO), None);
        reg.write(0, &[RESET_VALUE]);
        assert_eq!(control.wait(Duration::ZERO), Some(StopReason::Reset));
    }

    #[test]
    fn the_kind_bits_come_back_and_rst_cpu_is_refused() {
        let reg = ResetControl::new(Arc::new(RunControl::default()));
        reg.write(0, &[FULL_RST]);
        let restored = ResetControl::new(Arc::new(RunControl::default()));
        restored.restore(reg.save().unwrap()).unwrap();
        let mut b = [0];
        restored.read(0, &mut b);
        assert_eq!(b, [FULL_RST]);
        let err = restored.restore(RST_CPU.into()).unwrap_err();
        assert_eq!(err.what, "reset-control");
        restored.read(0, &mut b);
        assert_eq!(b, [FULL_RST], "a refused state changes nothing");
    }
}
