//! The part of the i8042 keyboard controller a guest uses to reset the machine: command 0xFE
//! ("pulse output line 0", the CPU reset line) written to the command port 0x64. Nothing else
//! of the controller is modelled: its status reads as zero (both buffers empty), so a guest
//! waiting for room to write a command never waits, and other commands are ignored.

use std::sync::Arc;

use crate::bus::BusDevice;
use crate::vm::run_control::{RunControl, StopReason};

/// The command (write) and status (read) port.
pub const I8042_COMMAND_PORT: u16 = 0x64;
/// The command that pulses the reset line.
const CMD_RESET: u8 = 0xfe;

/// The controller's command port.
pub struct I8042 {
    control: Arc<RunControl>,
}

impl I8042 {
    /// A controller whose reset command stops the run through `control`.
    pub fn new(control: Arc<RunControl>) -> Self {
        I8042 { control }
    }
}

impl BusDevice for I8042 {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&self, _offset: u64, data: &[u8]) {
        if data == [CMD_RESET] {
            self.control.stop(StopReason::Reset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn command_0xfe_resets_and_others_do_nothing() {
        let control = Arc::new(RunControl::default());
        let dev = I8042::new(control.clone());
        let mut status = [0xff];
        dev.read(0, &mut status);
        assert_eq!(status, [0], "buffers empty");
        dev.write(0, &[0xad]);
        assert_eq!(control.wait(Duration::ZERO), None);
        dev.write(0, &[CMD_RESET]);
        assert_eq!(control.wait(Duration::ZERO), Some(StopReason::Reset));
    }
}
