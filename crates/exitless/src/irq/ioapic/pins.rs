//! The IOAPIC's inputs under a split irqchip: the eventfds devices assert their pins with,
//! bound through [`crate::irq::InterruptRoutes::bind_pin`] as they are to KVM's IOAPIC, and
//! for level-triggered lines the resample eventfds signalled at the EOI that de-asserts the
//! line (the protocol of KVM's irqfd resampler, api.rst §4.75, which KVM offers only with its
//! own IOAPIC). One thread waits on all of them: a pin's eventfd cannot be handed to KVM as an
//! irqfd on its RTE's route, because a level line needs its remote IRR and re-assertion kept
//! here, and an edge line needs its mask honoured without a route commit per mask change.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Mutex;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

/// The token of the stop event in the epoll set.
const STOP: u64 = u64::MAX;

/// One device's input: the pin it drives and its eventfds (duplicates of the device's).
struct Binding {
    pin: u32,
    irqfd: EventFd,
    resample: Option<EventFd>,
}

/// Every pin's inputs, and the epoll set the IOAPIC's thread waits on.
pub struct PinInputs {
    epoll: Epoll,
    stop: EventFd,
    bindings: Mutex<Vec<Binding>>,
}

impl PinInputs {
    /// No inputs yet.
    pub fn new() -> io::Result<Self> {
        let epoll = Epoll::new()?;
        let stop = EventFd::new(EFD_NONBLOCK)?;
        let event = EpollEvent::new(EventSet::IN, STOP);
        epoll.ctl(ControlOperation::Add, stop.as_raw_fd(), event)?;
        Ok(PinInputs {
            epoll,
            stop,
            bindings: Mutex::default(),
        })
    }

    /// Watch `irqfd` as an assertion of `pin`; a level-triggered line's `resample` is
    /// signalled at the EOI that de-asserts it.
    pub fn bind(&self, pin: u32, irqfd: &EventFd, resample: Option<&EventFd>) -> io::Result<()> {
        let binding = Binding {
            pin,
            irqfd: irqfd.try_clone()?,
            resample: resample.map(EventFd::try_clone).transpose()?,
        };
        let mut bindings = self.bindings.lock().unwrap();
        let token = bindings.len() as u64;
        let event = EpollEvent::new(EventSet::IN, token);
        self.epoll
            .ctl(ControlOperation::Add, binding.irqfd.as_raw_fd(), event)?;
        bindings.push(binding);
        Ok(())
    }

    /// Tell `pin`'s level-triggered sources that an EOI de-asserted it: each asserts it again
    /// if its condition still holds.
    pub fn resample(&self, pin: u32) {
        for b in self.bindings.lock().unwrap().iter() {
            if let (true, Some(resample)) = (b.pin == pin, &b.resample) {
                // A full counter (never here: it is read at each resample) only drops a wake-up.
                let _ = resample.write(1);
            }
        }
    }

    /// Wait for asserted pins and put them in `asserted` (consuming the assertions); false
    /// once [`PinInputs::stop`] was called.
    pub fn wait(&self, asserted: &mut Vec<u32>) -> io::Result<bool> {
        let mut events = [EpollEvent::default(); 8];
        let n = match self.epoll.wait(-1, &mut events) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(true),
            other => other?,
        };
        let bindings = self.bindings.lock().unwrap();
        for event in &events[..n] {
            if event.data() == STOP {
                return Ok(false);
            }
            let Some(b) = usize::try_from(event.data())
                .ok()
                .and_then(|i| bindings.get(i))
            else {
                continue;
            };
            // Several writes before the read are one assertion, as on a wire.
            if b.irqfd.read().is_ok() {
                asserted.push(b.pin);
            }
        }
        Ok(true)
    }

    /// Make [`PinInputs::wait`] return false.
    pub fn stop(&self) {
        let _ = self.stop.write(1);
    }
}
