//! QEMU's `pvpanic` ISA device (QEMU docs/specs/pvpanic.rst): one port the guest reads for the
//! events the VMM takes and writes an event to when its kernel panics. Linux's pvpanic-mmio
//! driver finds it through the DSDT (`QEMU0001`) and writes PANICKED from its panic notifier,
//! so a panicked guest ends the run with its own status instead of hanging until `--timeout`.

use std::sync::Arc;

use crate::bus::BusDevice;
use crate::logging::DeviceLog;
use crate::vm::run_control::{RunControl, StopReason};

/// The port QEMU's `-device pvpanic` decodes by default (`ioport=0x505`).
pub const PVPANIC_PORT: u16 = 0x505;
/// It decodes one port.
pub const PVPANIC_LEN: u16 = 1;
/// The ACPI hardware ID of the device (QEMU's vendor prefix), as Linux's driver matches it.
pub const PVPANIC_HID: &str = "QEMU0001";

/// Event bit 0: the guest kernel panicked.
const PANICKED: u8 = 1 << 0;
/// Event bit 1: the guest kernel panicked and is starting its crash kernel (kdump), which it
/// runs next: the run goes on.
const CRASH_LOADED: u8 = 1 << 1;
/// The events the device reports as supported when read (the spec's capability byte).
const SUPPORTED: u8 = PANICKED | CRASH_LOADED;

/// The panic port: a PANICKED write stops the run with [`StopReason::GuestPanicked`].
pub struct PvPanic {
    control: Arc<RunControl>,
    log: Arc<DeviceLog>,
}

impl PvPanic {
    /// A device that stops the run through `control` and notes other events in `log`.
    pub fn new(control: Arc<RunControl>, log: Arc<DeviceLog>) -> Self {
        PvPanic { control, log }
    }
}

impl BusDevice for PvPanic {
    /// Reads as the events it handles (all bytes alike: it decodes one port).
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let Some(first) = data.first_mut() {
            *first = SUPPORTED;
        }
    }

    /// Bits the spec does not define are ignored, as QEMU ignores them.
    fn write(&self, _offset: u64, data: &[u8]) {
        let event = data.first().copied().unwrap_or(0);
        if event & PANICKED != 0 {
            self.control.stop(StopReason::GuestPanicked);
        } else if event & CRASH_LOADED != 0 {
            self.log.warn(format_args!(
                "the guest panicked and starts its crash kernel"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn reads_as_the_events_it_takes() {
        let dev = PvPanic::new(Arc::new(RunControl::default()), DeviceLog::new("pvpanic"));
        let mut b = [0xffu8; 1];
        dev.read(0, &mut b);
        assert_eq!(b, [PANICKED | CRASH_LOADED]);
    }

    #[test]
    fn a_panic_ends_the_run_and_other_events_do_not() {
        let control = Arc::new(RunControl::default());
        let dev = PvPanic::new(control.clone(), DeviceLog::new("pvpanic"));
        dev.write(0, &[CRASH_LOADED]);
        dev.write(0, &[0x80]);
        assert_eq!(control.wait(Duration::ZERO), None);
        dev.write(0, &[PANICKED]);
        assert_eq!(
            control.wait(Duration::ZERO),
            Some(StopReason::GuestPanicked)
        );
    }
}
