//! QEMU's `isa-debug-exit` device: a write of `v` ends the run, and the VMM exits with status
//! `(v << 1) | 1` (QEMU hw/misc/debugexit.c), so a test kernel's status can never read as a
//! clean exit (0). Test suites written for QEMU (kvm-unit-tests among them) end this way.

use std::sync::Arc;

use crate::bus::BusDevice;
use crate::vm::run_control::{RunControl, StopReason};

/// The port test kernels use: `-device isa-debug-exit,iobase=0xf4,iosize=4`.
pub const DEBUG_EXIT_PORT: u16 = 0xf4;
/// Ports it decodes (`iosize=4`): a write of any width at any of them ends the run.
pub const DEBUG_EXIT_LEN: u16 = 4;

/// The process exit status for a write of `value`, as `exit((value << 1) | 1)` leaves it:
/// the kernel keeps the low 8 bits (exit(3)).
pub fn exit_status(value: u64) -> u8 {
    (value << 1 | 1).to_le_bytes()[0]
}

/// The debug-exit port: any write stops the run with [`exit_status`] of the value.
pub struct DebugExit {
    control: Arc<RunControl>,
}

impl DebugExit {
    /// A device that stops the run through `control`.
    pub fn new(control: Arc<RunControl>) -> Self {
        DebugExit { control }
    }
}

impl BusDevice for DebugExit {
    /// Reads as zero, as QEMU's.
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&self, _offset: u64, data: &[u8]) {
        let mut value = [0u8; 8];
        let n = data.len().min(value.len());
        value[..n].copy_from_slice(&data[..n]);
        self.control
            .stop(StopReason::DebugExit(u64::from_le_bytes(value)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_write_ends_the_run_with_the_value() {
        let control = Arc::new(RunControl::default());
        let dev = DebugExit::new(control.clone());
        let mut b = [0xffu8; 4];
        dev.read(0, &mut b);
        assert_eq!(b, [0; 4]);
        dev.write(0, &0x1234u16.to_le_bytes());
        assert_eq!(
            control.wait(Duration::ZERO),
            Some(StopReason::DebugExit(0x1234))
        );
    }

    #[test]
    fn the_status_is_qemus() {
        assert_eq!(exit_status(0), 1);
        assert_eq!(exit_status(0x10), 0x21);
        assert_eq!(exit_status(0x7f), 0xff);
        assert_eq!(exit_status(0x80), 1, "only the low 8 bits reach the parent");
    }
}
