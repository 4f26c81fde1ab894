//! The console UART (16550A, from vm-superio) on port 0x3F8.
//!
//! A vCPU writing the transmit register must never wait on the host's terminal: output that
//! goes to stdout (or any writer) passes through a bounded queue to a console thread
//! ([`output`]), so a stalled stdout holds neither the vCPU nor the UART lock. When that thread
//! falls behind, the UART holds the guest back as QEMU's does, by showing its transmitter busy
//! (or, with [`Overflow::Drop`], drops and counts). The in-memory log of tests and benchmarks
//! cannot stall and is written in place.
//!
//! vm-superio's `Serial` shows the transmitter always empty (LSR THRE and TEMT set) and has no
//! way to say otherwise, so this device wraps it at the bus: an LSR read clears THRE and TEMT
//! while the queue is full, and the THR-empty interrupt is raised when room comes back by
//! writing IER again with its value, which makes `Serial` raise it if the guest enabled it (its
//! `thr_empty_interrupt`). Everything else (the FIFO, IIR, loopback, the divisor latch) stays
//! vm-superio's; a UART of our own would copy all of it for these two bits.
//!
//! Input (stdin for `exitless run`) comes the other way through a console input thread
//! ([`input`], [`SerialConsole::spawn_input`]).

mod input;
mod output;
mod persist;

use std::io::{self, Write};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};

use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::bus::BusDevice;
use crate::guest_error;
use crate::logging::DeviceLog;

pub use input::{ConsoleInput, InputRoom};
pub use output::{CONSOLE_FLUSH_TIMEOUT, CONSOLE_QUEUE_LIMIT, Lost, Overflow, TX_FIFO};
use output::{ConsoleThread, Queue};

/// Most bytes of guest console output an in-memory log keeps.
pub const CONSOLE_LOG_LIMIT: usize = 1 << 20;

/// Number of ports a 16550 decodes.
pub const SERIAL_PORT_LEN: u16 = 8;

/// The registers and bits this device looks at (PC16550D datasheet, Table II): IER, LCR's
/// divisor latch bit, MCR's loopback bit, and LSR's THRE (bit 5) and TEMT (bit 6).
const IER: u8 = 1;
const LCR: u8 = 3;
const MCR: u8 = 4;
const LSR: u8 = 5;
const LCR_DLAB: u8 = 0x80;
const MCR_LOOP: u8 = 0x10;
const LSR_THRE: u8 = 0x20;
const LSR_TEMT: u8 = 0x40;

/// Where guest console output goes.
pub enum ConsoleOutput {
    /// An in-memory log, for benchmarks and tests.
    Buffer(Arc<Mutex<Vec<u8>>>),
    /// Any writer (stdout, a file, a pipe), through the console thread. Give it the
    /// descriptor itself, not std's line-buffered `Stdout`: each write must reach it or fail,
    /// so that what is lost can be counted.
    Writer(Box<dyn Write + Send>),
}

/// The UART's writer: the in-memory log, or the console thread's queue.
#[derive(Clone)]
enum Sink {
    Buffer(Arc<Mutex<Vec<u8>>>),
    Queue(Arc<Queue>, Arc<DeviceLog>),
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::Buffer(b) => {
                // A guest can print forever: keep the first CONSOLE_LOG_LIMIT bytes, drop the rest.
                let mut log = b.lock().unwrap_or_else(PoisonError::into_inner);
                let room = CONSOLE_LOG_LIMIT.saturating_sub(log.len());
                log.extend_from_slice(&buf[..buf.len().min(room)]);
            }
            Sink::Queue(q, log) => {
                // The transmitter showed busy and its FIFO is full: as on a real UART, the
                // byte is lost (counted, and said at exit). With Overflow::Drop the guest was
                // never told to wait: only the count at exit says so.
                if q.push(buf) > 0 && q.overflow() == Overflow::Hold {
                    guest_error!(
                        log,
                        "THR written while the transmitter was busy (LSR.THRE clear): byte lost"
                    );
                }
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        // The console thread flushes after each batch; a vCPU never waits for it.
        Ok(())
    }
}

/// Raises the UART's interrupt by signalling an eventfd bound to its GSI with an irqfd
/// (shared, so that a restored UART signals the same one).
#[derive(Clone)]
pub struct IrqTrigger(pub Arc<EventFd>);

impl Trigger for IrqTrigger {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

type Uart = Serial<IrqTrigger, InputRoom, Sink>;

/// The UART as a bus device.
pub struct SerialConsole {
    // Dropped before `output`, whose thread holds only a weak reference to raise interrupts.
    uart: Arc<Mutex<Uart>>,
    /// The console thread, if output goes through it.
    output: Option<ConsoleThread>,
    log: Arc<DeviceLog>,
    /// Restored from a snapshot: its pending interrupt is raised again at resume.
    restored: AtomicBool,
}

impl SerialConsole {
    /// A UART raising `irq` and writing to `out`; a writer gets a console thread, which holds
    /// the guest back or drops as `overflow` says when it is behind.
    pub fn new(
        irq: EventFd,
        out: ConsoleOutput,
        overflow: Overflow,
        log: Arc<DeviceLog>,
    ) -> io::Result<Self> {
        let writer = match out {
            ConsoleOutput::Buffer(b) => return Ok(Self::build(irq, Sink::Buffer(b), None, log)),
            ConsoleOutput::Writer(w) => w,
        };
        let queue = Arc::new(Queue::new(overflow));
        let sink = Sink::Queue(queue.clone(), log.clone());
        let console = Self::build(irq, sink, None, log);
        let uart = Arc::downgrade(&console.uart);
        let kick = Box::new(move || {
            if let Some(uart) = uart.upgrade() {
                raise_thr_empty(&mut uart.lock().unwrap_or_else(PoisonError::into_inner));
            }
        });
        Ok(SerialConsole {
            output: Some(ConsoleThread::spawn(writer, queue, kick)?),
            ..console
        })
    }

    fn build(irq: EventFd, sink: Sink, output: Option<ConsoleThread>, log: Arc<DeviceLog>) -> Self {
        let uart = Serial::with_events(IrqTrigger(Arc::new(irq)), InputRoom::default(), sink);
        SerialConsole {
            uart: Arc::new(Mutex::new(uart)),
            output,
            log,
            restored: AtomicBool::new(false),
        }
    }

    /// Bytes of guest output lost so far, by why.
    pub fn lost(&self) -> Lost {
        self.output
            .as_ref()
            .map_or_else(Lost::default, ConsoleThread::lost)
    }

    /// The device's log, for its guest errors.
    pub fn log(&self) -> &Arc<DeviceLog> {
        &self.log
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Uart> {
        self.uart.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// LSR as the guest reads it: THRE and TEMT clear while the console thread is a queue's
    /// worth behind, unless loopback (MCR bit 4) turns the transmitter back into the receiver.
    fn line_status(&self, uart: &mut Uart) -> u8 {
        let lsr = uart.read(LSR);
        let loopback = uart.read(MCR) & MCR_LOOP != 0;
        match &self.output {
            Some(out) if !loopback && !out.queue().transmitter_empty() => {
                lsr & !(LSR_THRE | LSR_TEMT)
            }
            _ => lsr,
        }
    }
}

/// Raise the THR-empty interrupt if the guest enabled it (IER bit 1; IIR then reads 0b0010):
/// vm-superio's `Serial` raises it on an IER write, unless it is pending already.
fn raise_thr_empty(uart: &mut Uart) {
    // With DLAB set, offset 1 is the divisor latch's high byte, not IER.
    let lcr = uart.read(LCR);
    let _ = uart.write(LCR, lcr & !LCR_DLAB);
    let ier = uart.read(IER);
    // An interrupt that cannot be signalled is lost, as any other of this UART's.
    let _ = uart.write(IER, ier);
    let _ = uart.write(LCR, lcr);
}

impl BusDevice for SerialConsole {
    fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        match (u8::try_from(offset), data) {
            (Ok(LSR), [byte]) => {
                let mut uart = self.lock();
                *byte = self.line_status(&mut uart);
            }
            (Ok(reg), [byte]) => *byte = self.lock().read(reg),
            (_, data) => guest_error!(
                self.log,
                "{}-byte read at offset {offset}: the registers are bytes",
                data.len()
            ),
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        match (u8::try_from(offset), data) {
            (Ok(reg), [byte]) => {
                // The sink never fails; an interrupt that cannot be signalled is lost.
                let _ = self.lock().write(reg, *byte);
            }
            _ => guest_error!(
                self.log,
                "{}-byte write at offset {offset}: the registers are bytes",
                data.len()
            ),
        }
    }
}

#[cfg(test)]
mod tests;
