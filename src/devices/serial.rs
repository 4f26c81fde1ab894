//! The console UART (16550A, from vm-superio) on port 0x3F8.

use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::bus::BusDevice;

/// Most bytes of guest console output an in-memory log keeps.
pub const CONSOLE_LOG_LIMIT: usize = 1 << 20;

/// Where guest console output goes.
#[derive(Clone)]
pub enum ConsoleOutput {
    /// The VMM's standard output.
    Stdout,
    /// An in-memory log, for benchmarks and tests.
    Buffer(Arc<Mutex<Vec<u8>>>),
}

impl Write for ConsoleOutput {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            ConsoleOutput::Stdout => io::stdout().write(buf),
            ConsoleOutput::Buffer(b) => {
                // A guest can print forever: keep the first CONSOLE_LOG_LIMIT bytes, drop the rest.
                let mut log = b.lock().unwrap();
                let room = CONSOLE_LOG_LIMIT.saturating_sub(log.len());
                log.extend_from_slice(&buf[..buf.len().min(room)]);
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            ConsoleOutput::Stdout => io::stdout().flush(),
            ConsoleOutput::Buffer(_) => Ok(()),
        }
    }
}

/// Raises the UART's interrupt by signalling an eventfd bound to its GSI with an irqfd.
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// Number of ports a 16550 decodes.
pub const SERIAL_PORT_LEN: u16 = 8;

/// The UART as a bus device.
pub struct SerialConsole {
    uart: Mutex<Serial<IrqTrigger, vm_superio::serial::NoEvents, ConsoleOutput>>,
}

impl SerialConsole {
    /// A UART raising `irq` and writing to `out`.
    pub fn new(irq: EventFd, out: ConsoleOutput) -> Self {
        SerialConsole {
            uart: Mutex::new(Serial::new(IrqTrigger(irq), out)),
        }
    }
}

impl BusDevice for SerialConsole {
    fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        if let (Ok(reg), [byte]) = (u8::try_from(offset), data) {
            *byte = self.uart.lock().unwrap().read(reg);
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        if let (Ok(reg), [byte]) = (u8::try_from(offset), data) {
            // A failed host write (closed stdout) must not stop the guest; the byte is lost.
            let _ = self.uart.lock().unwrap().write(reg, *byte);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_console_log_keeps_a_bounded_prefix() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let serial =
            SerialConsole::new(EventFd::new(0).unwrap(), ConsoleOutput::Buffer(log.clone()));
        for _ in 0..CONSOLE_LOG_LIMIT + 100 {
            serial.write(0, b"x"); // THR, one byte per access as a guest would
        }
        serial.write(0, &[1, 2]); // wrong width: ignored
        assert_eq!(log.lock().unwrap().len(), CONSOLE_LOG_LIMIT);
    }
}
