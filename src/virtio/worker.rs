//! The device thread: sleeps on the queue eventfds (signalled by ioeventfds in the kernel or by
//! the transport after an exit) and on the line's resample eventfd, and does the device's work
//! off the vCPU thread.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::device::VirtioState;
use super::interrupt::Interrupts;

/// A running device thread; dropping it stops and joins the thread.
pub struct Worker {
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Start the thread for `state`, woken by `queue_events`.
    pub fn spawn(
        name: String,
        state: Arc<Mutex<VirtioState>>,
        interrupts: Arc<Interrupts>,
        queue_events: Vec<EventFd>,
    ) -> std::io::Result<Self> {
        let stop = EventFd::new(EFD_NONBLOCK)?;
        let epoll = Epoll::new()?;
        let queues = queue_events.len();
        let (resample_token, stop_token) = (queues as u64, queues as u64 + 1);
        for (i, e) in queue_events.iter().enumerate() {
            epoll.ctl(
                ControlOperation::Add,
                e.as_raw_fd(),
                EpollEvent::new(EventSet::IN, i as u64),
            )?;
        }
        if let Some(r) = interrupts.resample_fd() {
            epoll.ctl(
                ControlOperation::Add,
                r.as_raw_fd(),
                EpollEvent::new(EventSet::IN, resample_token),
            )?;
        }
        epoll.ctl(
            ControlOperation::Add,
            stop.as_raw_fd(),
            EpollEvent::new(EventSet::IN, stop_token),
        )?;
        let thread = thread::Builder::new().name(name).spawn(move || {
            let mut events = vec![EpollEvent::default(); queues + 2];
            loop {
                let n = match epoll.wait(-1, &mut events) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        eprintln!("exitless: device thread stopped: epoll: {e}");
                        return;
                    }
                };
                // A resample left over from the previous interrupt's EOI goes first: handled after
                // new work it would see that work's status bit and assert the line a second time.
                let ready = &mut events[..n];
                ready.sort_by_key(|ev| ev.data() != resample_token);
                for ev in ready.iter() {
                    let token = ev.data();
                    if token == stop_token {
                        return;
                    } else if token == resample_token {
                        interrupts.resample();
                    } else if let Some((q, e)) = usize::try_from(token)
                        .ok()
                        .and_then(|q| Some((q, queue_events.get(q)?)))
                    {
                        let _ = e.read();
                        let due = state.lock().unwrap().process(q);
                        for n in due {
                            interrupts.notify(n);
                        }
                    }
                }
            }
        })?;
        Ok(Worker {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
