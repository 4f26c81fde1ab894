//! The IQT doorbell: a tail write that does not exit. While the guest runs queued invalidation
//! on a 256-entry queue (IQA.QS = 0, 128-bit descriptors: VT-d §10.4.23), one datamatch
//! ioeventfd per possible tail value (dword and qword writes: Linux writes 4 bytes, the probe
//! 8) catches the IQT write in the kernel, and the unit's thread takes the tail and runs the
//! queue exactly as the write's exit would. Strict stays strict: the guest waits on the wait
//! descriptor's status in RAM (§6.5.2.8), which the queue writes only after the invalidations
//! before it took effect and the device rounds before them ended (`crate::iommu`).
//!
//! A larger queue keeps the exit path: KVM holds at most 1000 ioeventfds per bus, and 256 × 2
//! already takes half. A write that matches no doorbell (an offset past the queue, junk in
//! the upper dword) exits as before.

use std::io;
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

use kvm_ioctls::{IoEventAddress, VmFd};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::Iommu;
use super::register_file::Registers;
use super::regs::*;
use crate::guest_error;
use crate::seccomp::{self, ThreadKind};

/// Tail values a doorbell is registered for: the entries of a queue with IQA.QS = 0.
pub const DOORBELL_TAILS: usize = 256;

/// The epoll token of the stop event (the tails' tokens are their slots).
const STOP: u64 = DOORBELL_TAILS as u64;

/// A tail write a doorbell matches: its width and value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TailWrite {
    /// A 4-byte write of IQT's low dword.
    Dword(u32),
    /// An 8-byte write of IQT.
    Qword(u64),
}

/// Where the tail doorbells are registered: KVM's `KVM_IOEVENTFD` for a VM; a recorder in tests.
pub trait TailRegistrar: Send + Sync {
    /// Make `write` at guest-physical `address` signal `fd` in the kernel, without an exit.
    fn register(
        &self,
        fd: &EventFd,
        address: u64,
        write: TailWrite,
    ) -> Result<(), kvm_ioctls::Error>;
    /// Undo [`TailRegistrar::register`].
    fn unregister(
        &self,
        fd: &EventFd,
        address: u64,
        write: TailWrite,
    ) -> Result<(), kvm_ioctls::Error>;
}

impl TailRegistrar for VmFd {
    fn register(
        &self,
        fd: &EventFd,
        address: u64,
        write: TailWrite,
    ) -> Result<(), kvm_ioctls::Error> {
        let at = IoEventAddress::Mmio(address);
        match write {
            TailWrite::Dword(v) => self.register_ioevent(fd, &at, v),
            TailWrite::Qword(v) => self.register_ioevent(fd, &at, v),
        }
    }

    fn unregister(
        &self,
        fd: &EventFd,
        address: u64,
        write: TailWrite,
    ) -> Result<(), kvm_ioctls::Error> {
        let at = IoEventAddress::Mmio(address);
        match write {
            TailWrite::Dword(v) => self.unregister_ioevent(fd, &at, v),
            TailWrite::Qword(v) => self.unregister_ioevent(fd, &at, v),
        }
    }
}

/// The two writes of tail slot `slot` a doorbell catches.
fn writes(slot: usize) -> [TailWrite; 2] {
    let tail = slot as u64 * VTD_QI_DESC_SIZE;
    [TailWrite::Dword(tail as u32), TailWrite::Qword(tail)]
}

/// The unit's doorbells: an eventfd per tail slot, whether they are registered, and the
/// thread that takes them.
pub(super) struct Doorbells {
    registrar: Arc<dyn TailRegistrar>,
    /// IQT's guest-physical address.
    address: u64,
    tails: Vec<EventFd>,
    stop: EventFd,
    /// The tails and the stop event, level-triggered; shared with the thread.
    epoll: Arc<Epoll>,
    /// Registered now (changed with the unit's `regs` held).
    armed: Mutex<bool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Doorbells {
    /// Whether the doorbells are registered.
    pub(super) fn armed(&self) -> bool {
        *self.armed.lock().unwrap()
    }

    /// Register (`on`) or remove every doorbell; a registration KVM refuses leaves them all
    /// removed, and the tail writes exit.
    fn arm(&self, unit: &Iommu, on: bool) {
        let mut armed = self.armed.lock().unwrap();
        if *armed == on {
            return;
        }
        *armed = false;
        if !on {
            self.unregister_all();
            return;
        }
        let mut done = Vec::new();
        for (slot, fd) in self.tails.iter().enumerate() {
            for w in writes(slot) {
                if let Err(e) = self.registrar.register(fd, self.address, w) {
                    unit.log.warn(format_args!(
                        "cannot register the IQT doorbells ({e}); tail writes exit"
                    ));
                    for &(fd, w) in &done {
                        let _ = self.registrar.unregister(fd, self.address, w);
                    }
                    return;
                }
                done.push((fd, w));
            }
        }
        *armed = true;
    }

    /// Remove every doorbell.
    fn unregister_all(&self) {
        for (slot, fd) in self.tails.iter().enumerate() {
            for w in writes(slot) {
                let _ = self.registrar.unregister(fd, self.address, w);
            }
        }
    }

    /// The slots signalled now, with how many writes each, nearest the head first (so that
    /// tails a guest wrote without waiting run in the order it wrote them). Asks epoll which
    /// are ready rather than reading all 256: a system call costs a microsecond here.
    fn take(&self, regs: &Registers) -> Vec<(u64, u64)> {
        let mut events = [EpollEvent::default(); DOORBELL_TAILS + 1];
        let ready = self.epoll.wait(0, &mut events).unwrap_or(0);
        let head = regs.queue.head();
        let mut tails: Vec<(u64, u64)> = events[..ready]
            .iter()
            .filter_map(|e| {
                let count = self.tails.get(e.data() as usize)?.read().ok()?;
                Some((e.data() * VTD_QI_DESC_SIZE, count))
            })
            .collect();
        let size = DOORBELL_TAILS as u64 * VTD_QI_DESC_SIZE;
        tails.sort_by_key(|&(tail, _)| tail.wrapping_sub(head) % size);
        tails
    }
}

impl Drop for Doorbells {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        let thread = self.thread.get_mut().unwrap().take();
        // The last reference may go on the thread itself, which then just returns.
        if let Some(t) = thread.filter(|t| t.thread().id() != std::thread::current().id()) {
            let _ = t.join();
        }
        if *self.armed.get_mut().unwrap() {
            self.unregister_all();
        }
    }
}

impl Iommu {
    /// Give the unit its IQT doorbells, registered through `registrar` at `iqt` (IQT's
    /// guest-physical address) whenever the guest's queue allows, and the thread that takes
    /// them.
    pub fn attach_doorbells(
        self: &Arc<Self>,
        registrar: Arc<dyn TailRegistrar>,
        iqt: u64,
    ) -> io::Result<()> {
        let tails = (0..DOORBELL_TAILS)
            .map(|_| EventFd::new(EFD_NONBLOCK))
            .collect::<io::Result<Vec<_>>>()?;
        let stop = EventFd::new(EFD_NONBLOCK)?;
        let epoll = Arc::new(Epoll::new()?);
        let add = |fd: &EventFd, token| {
            let event = EpollEvent::new(EventSet::IN, token);
            epoll.ctl(
                ControlOperation::Add,
                std::os::fd::AsRawFd::as_raw_fd(fd),
                event,
            )
        };
        for (slot, fd) in tails.iter().enumerate() {
            add(fd, slot as u64)?;
        }
        add(&stop, STOP)?;
        let doorbells = Doorbells {
            registrar,
            address: iqt,
            tails,
            stop,
            epoll: epoll.clone(),
            armed: Mutex::new(false),
            thread: Mutex::new(None),
        };
        if self.doorbells.set(doorbells).is_err() {
            return Err(io::Error::other(
                "the unit's doorbells are already attached",
            ));
        }
        let unit = Arc::downgrade(self);
        let thread = seccomp::spawn(ThreadKind::Device, "iommu".into(), move || {
            doorbell_thread(&unit, &epoll);
        })?;
        *self
            .doorbells
            .get()
            .expect("set above")
            .thread
            .lock()
            .unwrap() = Some(thread);
        Ok(())
    }

    /// Register or remove the doorbells as the queue now allows: queued invalidation on, on
    /// a 256-entry queue of 128-bit descriptors. Called with `regs` held after GCMD.QIE or
    /// IQA changes.
    pub(super) fn rearm_doorbells(&self, regs: &Registers) {
        let Some(doorbells) = self.doorbells.get() else {
            return;
        };
        let iqa = regs.queue.address();
        let on = regs.status & VTD_GCMD_QIE != 0 && iqa & (VTD_IQA_QS_MASK | VTD_IQA_DW) == 0;
        doorbells.arm(self, on);
    }

    /// Take the tails the doorbells caught, as IQT writes (same path, same counters).
    pub(super) fn take_doorbells(&self) {
        let Some(doorbells) = self.doorbells.get() else {
            return;
        };
        let mut regs = self.regs.lock().unwrap();
        let tails = doorbells.take(&regs);
        if tails.is_empty() {
            return;
        }
        if !doorbells.armed() {
            // Written before the guest turned the queue off or moved it; software must not
            // do that with descriptors pending (§6.5.2), so they are not run.
            guest_error!(
                self.log,
                "{} IQT doorbell writes raced with the queue being disabled or moved; dropped",
                tails.len()
            );
            return;
        }
        // Several tails at once are no misuse: Linux submits under its queue's lock but waits
        // for its wait descriptor with the lock dropped (qi_submit_sync), so another CPU adds
        // its descriptors and writes its own tail meanwhile. Hardware runs from the head to
        // whatever tail is written last (§6.5.2); every tail caught lies past the head in ring
        // order, so taking them nearest the head first runs the queue as far as the farthest.
        for (tail, count) in tails {
            self.take_tail(&mut regs, tail, count);
        }
    }
}

/// The unit's thread: wait for doorbells, take them (what is ready is asked again with the
/// unit's registers held, so tails written together are taken together), until the stop
/// event or the unit is gone.
fn doorbell_thread(unit: &Weak<Iommu>, epoll: &Epoll) {
    let mut events = [EpollEvent::default(); DOORBELL_TAILS + 1];
    loop {
        let ready = match epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        if events[..ready].iter().any(|e| e.data() == STOP) {
            return;
        }
        let Some(unit) = unit.upgrade() else {
            return;
        };
        unit.take_doorbells();
    }
}

#[cfg(test)]
mod tests;
