//! The console UART: bounded console log; a stalled writer holds the guest back (or drops,
//! counted); a failing writer is counted; console input.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EFD_NONBLOCK;

use super::*;

const RBR: u64 = 0;
const IIR: u64 = 2;

fn console_with(out: ConsoleOutput, overflow: Overflow) -> (SerialConsole, EventFd) {
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let seen = irq.try_clone().unwrap();
    let serial = SerialConsole::new(irq, out, overflow, DeviceLog::new("serial")).unwrap();
    (serial, seen)
}

fn console(out: ConsoleOutput) -> SerialConsole {
    console_with(out, Overflow::Hold).0
}

fn reg(serial: &SerialConsole, offset: u64) -> u8 {
    let mut b = [0];
    serial.read(offset, &mut b);
    b[0]
}

/// Wait (at most 10 s, so a regression fails instead of hanging) until `ready`.
fn until(mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

#[test]
fn the_console_log_keeps_a_bounded_prefix() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let serial = console(ConsoleOutput::Buffer(log.clone()));
    for _ in 0..CONSOLE_LOG_LIMIT + 100 {
        serial.write(0, b"x"); // THR, one byte per access as a guest would
    }
    serial.write(0, &[1, 2]); // wrong width: ignored
    assert_eq!(log.lock().unwrap().len(), CONSOLE_LOG_LIMIT);
    assert_eq!(serial.log().guest_errors(), 1, "the wide write");
}

/// A writer stuck until its gate's sender is dropped, like a terminal nobody drains.
struct Gated {
    gate: Option<mpsc::Receiver<()>>,
    got: Arc<Mutex<Vec<u8>>>,
}

impl Write for Gated {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(gate) = self.gate.take() {
            let _ = gate.recv();
        }
        self.got.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A console on a stalled writer: the gate that lets it go, and what it got.
fn stalled(
    overflow: Overflow,
) -> (
    SerialConsole,
    EventFd,
    mpsc::Sender<()>,
    Arc<Mutex<Vec<u8>>>,
) {
    let (open, gate) = mpsc::channel();
    let got = Arc::new(Mutex::new(Vec::new()));
    let writer = Gated {
        gate: Some(gate),
        got: got.clone(),
    };
    let (serial, irq) = console_with(ConsoleOutput::Writer(Box::new(writer)), overflow);
    (serial, irq, open, got)
}

/// The byte the `i`th write of a test puts out: a sequence, so order is checked too.
fn nth(i: usize) -> u8 {
    u8::try_from(i % 251).expect("below 251")
}

#[test]
fn a_stalled_writer_holds_the_guest_back_and_room_raises_the_thr_interrupt() {
    let (serial, irq, open, got) = stalled(Overflow::Hold);
    serial.write(1, &[0x02]); // IER: the THR-empty interrupt
    // As a polling driver: write while LSR shows THRE, a byte at a time.
    let mut sent = 0;
    while reg(&serial, 5) & 0x60 == 0x60 {
        assert!(
            sent < 3 * CONSOLE_QUEUE_LIMIT,
            "the transmitter never got busy"
        );
        serial.write(0, &[nth(sent)]);
        sent += 1;
    }
    // Each write raised the interrupt (vm-superio's THR is always taken); acknowledge them.
    let _ = reg(&serial, IIR);
    let _ = irq.read();
    assert!(
        sent >= CONSOLE_QUEUE_LIMIT - TX_FIFO,
        "{sent} bytes before busy"
    );
    // The writer recovers: the queue empties and the interrupt comes, with THRE.
    drop(open);
    assert!(until(|| irq.read().is_ok()), "no THR-empty interrupt");
    assert_eq!(reg(&serial, IIR) & 0x0f, 0x02, "IIR: THR empty");
    assert_eq!(reg(&serial, 5) & 0x60, 0x60, "LSR: THRE and TEMT");
    assert_eq!(serial.lost(), Lost::default());
    drop(serial); // waits for the writer
    let want: Vec<u8> = (0..sent).map(nth).collect();
    assert_eq!(*got.lock().unwrap(), want, "every byte, in order");
}

#[test]
fn a_guest_that_ignores_thre_loses_bytes_counted_as_overrun() {
    let (serial, _irq, open, got) = stalled(Overflow::Hold);
    let total = 3 * CONSOLE_QUEUE_LIMIT;
    for i in 0..total {
        serial.write(0, &[nth(i)]);
    }
    let overrun = serial.lost().overrun;
    assert!(overrun >= CONSOLE_QUEUE_LIMIT as u64, "{overrun} lost");
    assert!(serial.log().guest_errors() > 0);
    drop(open);
    drop(serial);
    assert_eq!(got.lock().unwrap().len() as u64 + overrun, total as u64);
}

#[test]
fn a_stalled_writer_never_blocks_the_uart_with_drop() {
    let (serial, _irq, open, got) = stalled(Overflow::Drop);
    let serial = Arc::new(serial);
    // The console thread takes at most one queue's worth before it stalls, the queue holds
    // another: the third is dropped.
    let total = 3 * CONSOLE_QUEUE_LIMIT;
    // The guest's writes run on their own thread, so a regression fails instead of hanging.
    let (finished, wrote) = mpsc::channel();
    let s = serial.clone();
    let guest = std::thread::spawn(move || {
        for _ in 0..total {
            s.write(0, b"x");
        }
        // The UART lock is free, and the transmitter never shows busy.
        let lsr = reg(&s, 5);
        let _ = finished.send(lsr);
    });
    let lsr = wrote
        .recv_timeout(Duration::from_secs(30))
        .expect("the UART wrote through a stalled console");
    assert_eq!(lsr & 0x60, 0x60);
    guest.join().unwrap();
    let dropped = serial.lost().dropped;
    assert!(dropped >= CONSOLE_QUEUE_LIMIT as u64, "{dropped} dropped");
    // The terminal recovers; dropping the console writes out everything queued.
    drop(open);
    drop(Arc::into_inner(serial).expect("the only handle"));
    assert_eq!(got.lock().unwrap().len() as u64 + dropped, total as u64);
}

/// A file system with room for `room` more bytes.
struct Full {
    room: usize,
    got: Arc<Mutex<Vec<u8>>>,
}

impl Write for Full {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(self.room);
        if n == 0 {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.room -= n;
        self.got.lock().unwrap().extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_write_error_stops_the_writing_and_is_counted() {
    let got = Arc::new(Mutex::new(Vec::new()));
    let full = Full {
        room: 10,
        got: got.clone(),
    };
    let serial = console(ConsoleOutput::Writer(Box::new(full)));
    for i in 0..100 {
        serial.write(0, &[nth(i)]);
    }
    assert!(
        until(|| serial.lost().unwritten == 90),
        "{:?}",
        serial.lost()
    );
    let lost = serial.lost();
    assert!(lost.error.as_deref().unwrap().contains("No space left"));
    assert_eq!(*got.lock().unwrap(), (0..10).map(nth).collect::<Vec<_>>());
    // The guest is not held back by a console that fails: LSR shows THRE.
    assert_eq!(reg(&serial, 5) & 0x60, 0x60);
}

#[test]
fn the_exit_line_says_what_was_lost_and_why() {
    assert_eq!(Lost::default().summary(), None);
    let lost = Lost {
        dropped: 5,
        overrun: 0,
        unwritten: 7,
        error: Some("No space left on device (os error 28)".into()),
    };
    assert_eq!(
        lost.summary().unwrap(),
        "console: 12 bytes of the guest's output lost: 5 dropped while its reader was behind \
         (--console-drop); 7 not written: No space left on device (os error 28)"
    );
}

/// A byte the guest reads from the receiver: the data register once LSR says data ready.
fn guest_read(serial: &SerialConsole) -> Option<u8> {
    until(|| reg(serial, 5) & 1 != 0).then(|| reg(serial, RBR))
}

#[test]
fn input_reaches_the_receiver_in_order_past_the_fifo() {
    let serial = Arc::new(console(ConsoleOutput::Buffer(Arc::default())));
    let (reader, mut writer) = std::io::pipe().unwrap();
    let input = serial.spawn_input(reader).unwrap();
    // More than the 64-byte FIFO: the rest waits until the guest empties it.
    let sent: Vec<u8> = (0..200u8).collect();
    writer.write_all(&sent).unwrap();
    let got: Vec<u8> = (0..sent.len()).map_while(|_| guest_read(&serial)).collect();
    assert_eq!(got, sent);
    assert!(
        serial.spawn_input(std::io::pipe().unwrap().0).is_err(),
        "one input per console"
    );
    drop(writer);
    drop(input);
}

#[test]
fn dropping_the_input_stops_its_thread_while_it_waits() {
    let serial = Arc::new(console(ConsoleOutput::Buffer(Arc::default())));
    let (reader, writer) = std::io::pipe().unwrap();
    let input = serial.spawn_input(reader).unwrap();
    drop(input); // returns: the thread saw the stop while the pipe was open and empty
    drop(writer);
    assert_eq!(
        Arc::strong_count(&serial),
        1,
        "the thread let go of the console"
    );
}

#[test]
fn everything_written_reaches_a_live_writer() {
    let got = Arc::new(Mutex::new(Vec::new()));
    let (open, gate) = mpsc::channel();
    drop(open);
    let serial = console(ConsoleOutput::Writer(Box::new(Gated {
        gate: Some(gate),
        got: got.clone(),
    })));
    for &b in b"hello, console" {
        serial.write(0, &[b]);
    }
    drop(serial);
    assert_eq!(&got.lock().unwrap()[..], b"hello, console");
}
