//! The console UART: bounded console log, a stalled or live writer, and console input.

use super::*;

fn console(out: ConsoleOutput) -> SerialConsole {
    SerialConsole::new(EventFd::new(0).unwrap(), out, DeviceLog::new("serial")).unwrap()
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

#[test]
fn a_stalled_writer_never_blocks_the_uart() {
    let (open, gate) = mpsc::channel();
    let got = Arc::new(Mutex::new(Vec::new()));
    let serial = Arc::new(console(ConsoleOutput::Writer(Box::new(Gated {
        gate: Some(gate),
        got: got.clone(),
    }))));
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
        // The UART lock is free: a register read still answers.
        let mut lsr = [0];
        s.read(5, &mut lsr);
        let _ = finished.send(());
    });
    wrote
        .recv_timeout(Duration::from_secs(30))
        .expect("the UART wrote through a stalled console");
    guest.join().unwrap();
    let dropped = serial.dropped_bytes();
    assert!(dropped >= CONSOLE_QUEUE_LIMIT as u64, "{dropped} dropped");
    // The terminal recovers; dropping the console writes out everything queued.
    drop(open);
    drop(Arc::into_inner(serial).expect("the only handle"));
    assert_eq!(got.lock().unwrap().len() as u64 + dropped, total as u64);
}

/// A byte the guest reads from the receiver: the data register once LSR says data ready.
fn guest_read(serial: &SerialConsole) -> Option<u8> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut b = [0];
    while std::time::Instant::now() < deadline {
        serial.read(5, &mut b); // LSR
        if b[0] & 1 != 0 {
            serial.read(0, &mut b); // RBR
            return Some(b[0]);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
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
