//! Rate limiting per device, and sinks that stall or never return.

use super::*;

#[test]
fn a_window_admits_a_burst_then_reports_what_it_suppressed() {
    let mut w = Window {
        start: None,
        printed: 0,
        suppressed: 0,
    };
    let t0 = Instant::now();
    for _ in 0..RATE_BURST {
        assert_eq!(w.admit(t0), (true, 0));
    }
    assert_eq!(w.admit(t0), (false, 0));
    assert_eq!(w.admit(t0 + RATE_INTERVAL / 2), (false, 0));
    assert_eq!(w.admit(t0 + RATE_INTERVAL), (true, 2));
}

#[test]
fn devices_are_limited_and_counted_separately() {
    let (a, b) = (DeviceLog::new("a"), DeviceLog::new("b"));
    for i in 0..100 {
        guest_error!(a, "bad access {i}");
    }
    guest_error!(b, "bad access");
    assert_eq!((a.guest_errors(), b.guest_errors()), (100, 1));
    // `a` spent its burst; `b` still has its own.
    assert!(!a.window.lock().unwrap().admit(Instant::now()).0);
    assert!(b.window.lock().unwrap().admit(Instant::now()).0);
    b.warn(format_args!("host-side"));
    assert_eq!(b.guest_errors(), 1, "warn does not count a guest error");
}

/// A sink that blocks every write until `gate` is opened, and keeps what it was given.
struct Gated {
    gate: Arc<(Mutex<bool>, Condvar)>,
    entered: std::sync::mpsc::Sender<()>,
    out: Arc<Mutex<Vec<u8>>>,
}

impl Write for Gated {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = self.entered.send(());
        let (open, cv) = &*self.gate;
        let _open = cv.wait_while(open.lock().unwrap(), |o| !*o).unwrap();
        self.out.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn log_line(w: &mut QueueWriter, i: usize) {
    writeln!(w, "line {i}").unwrap();
    w.flush().unwrap();
}

#[test]
fn a_stalled_sink_drops_records_instead_of_blocking_and_reports_them() {
    let queue = LogQueue::new(4);
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let (entered, entered_rx) = std::sync::mpsc::channel();
    let out = Arc::new(Mutex::new(Vec::new()));
    let sink = Gated {
        gate: gate.clone(),
        entered,
        out: out.clone(),
    };
    queue.spawn_writer(Box::new(sink)).unwrap();
    let mut w = QueueWriter::new(queue.clone());
    log_line(&mut w, 0);
    // The writer took line 0 and is stuck writing it: the queue has all its room again.
    entered_rx.recv().unwrap();
    let start = Instant::now();
    for i in 1..=10 {
        log_line(&mut w, i);
    }
    assert!(start.elapsed() < Duration::from_secs(1), "logging waited");
    assert_eq!(queue.dropped(), 6);
    assert!(
        !queue.flush(Duration::from_millis(10)),
        "the sink is stalled"
    );

    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    assert!(queue.flush(Duration::from_secs(10)));
    log_line(&mut w, 11);
    assert!(queue.flush(Duration::from_secs(10)));
    let out = String::from_utf8(out.lock().unwrap().clone()).unwrap();
    assert_eq!(
        out,
        "line 0\nline 1\nline 2\nline 3\nline 4\n\
         exitless: warn: 6 log lines dropped\nline 11\n"
    );
}

#[test]
fn a_sink_that_never_returns_cannot_block_logging() {
    let queue = LogQueue::new(2);
    let (entered, entered_rx) = std::sync::mpsc::channel();
    let sink = Gated {
        // Never opened: the writer thread stays blocked for the rest of the test run.
        gate: Arc::new((Mutex::new(false), Condvar::new())),
        entered,
        out: Arc::default(),
    };
    queue.spawn_writer(Box::new(sink)).unwrap();
    let mut w = QueueWriter::new(queue.clone());
    log_line(&mut w, 0);
    entered_rx.recv().unwrap();
    for i in 1..=100_000 {
        log_line(&mut w, i);
    }
    assert_eq!(queue.dropped(), 100_000 - 2);
}
