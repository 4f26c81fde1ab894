//! The vocabulary every virtio device and both of its sides share, whatever its transport
//! (virtio 1.2 §2): what a device type is to the transport ([`VirtioDevice`]), the queue work
//! it runs on the device thread ([`QueueHandler`], with [`serve_chains`], the one bounded loop
//! over a ring), why a device stops ([`DeviceError`]), what it tells the driver
//! ([`Notification`]), and the one state both sides write ([`DeviceHealth`]).
//!
//! The register side is [`super::state`], the device-thread side [`super::engine`]; both
//! import this file, and it imports neither.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use vm_memory::GuestMemoryMmap;

use super::queue::chain::{self, Chain, ChainError};
use super::queue::split::{Ring, ServedQueue};
use crate::dma::{DmaContext, DmaError};
use crate::guest_error;
use crate::logging::{DeviceLog, Tally};

/// Why a device stopped: it sets DEVICE_NEEDS_RESET and waits for the driver to reset it.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A malformed descriptor chain.
    #[error(transparent)]
    Chain(#[from] ChainError),
    /// A ring the device could not access, or an available index more than the queue size
    /// ahead of the device (virtio 1.2 §2.7.6 lets the driver be at most a ring ahead).
    #[error("queue access failed: {0}")]
    Queue(#[from] virtio_queue::Error),
    /// Guest memory the device could not access.
    #[error("guest memory access failed: {0}")]
    Memory(#[from] vm_memory::GuestMemoryError),
    /// A buffer the device may not access now.
    #[error(transparent)]
    Dma(#[from] DmaError),
}

impl DeviceError {
    /// The device may not master the bus now: not an error but a pause, until Bus Master
    /// Enable is set again (PCI 3.0 §6.2.2).
    pub fn is_pause(&self) -> bool {
        matches!(
            self,
            DeviceError::Dma(DmaError::NotMaster(_))
                | DeviceError::Chain(ChainError::Dma(DmaError::NotMaster(_)))
        )
    }

    /// The IOMMU blocked an access and recorded the fault (VT-d §7): not the device's error.
    /// The chain completes with nothing written, or the rings wait for the next kick.
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            DeviceError::Dma(DmaError::Fault { .. })
                | DeviceError::Chain(ChainError::Dma(DmaError::Fault { .. }))
        )
    }
}

/// A device type as the transport sees it: identity, features, queues, configuration space.
pub trait VirtioDevice: Send {
    /// Virtio device ID (virtio 1.2 §5).
    fn device_type(&self) -> u32;
    /// Device-specific feature bits offered (the transport adds its own).
    fn features(&self) -> u64;
    /// Largest size of each queue.
    fn queue_max_sizes(&self) -> Vec<u16>;
    /// Read device configuration space; bytes past its end read zero.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Write device configuration space (ignored where it is read-only).
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
}

/// Copy bytes `offset..` of a device's configuration space `config` into `data`, as a driver's
/// read sees them: bytes past its end read zero.
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    for (i, b) in data.iter_mut().enumerate() {
        *b = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(i))
            .and_then(|o| config.get(o))
            .copied()
            .unwrap_or(0);
    }
}

/// What one call of [`QueueHandler::process_queue`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Queues that got used buffers.
    pub used: QueueSet,
    /// The handler stopped at its budget with work left: call it again (after other events).
    pub more: bool,
}

impl Progress {
    /// Add `queue` to the used queues if `used`.
    pub fn mark(&mut self, queue: usize, used: bool) {
        if used {
            self.used.insert(queue);
        }
    }
}

/// A set of queue indexes, held inline (a 256-bit bitmap) so that a kick allocates nothing. A device has at most
/// [`QueueSet::CAPACITY`] queues: virtio-pci's MSI-X table, of 256 vectors, bounds them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueSet([u64; 4]);

impl QueueSet {
    /// Queue indexes the set holds: 0 to this, exclusive.
    pub const CAPACITY: usize = 256;

    /// Add `queue` (an index past the capacity, which no device has, is not held).
    pub fn insert(&mut self, queue: usize) {
        debug_assert!(
            queue < Self::CAPACITY,
            "queue {queue} past the set's capacity"
        );
        if let Some(word) = self.0.get_mut(queue / 64) {
            *word |= 1 << (queue % 64);
        }
    }

    /// The queues, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(k, &word)| {
            // Each set bit, lowest first.
            std::iter::successors((word != 0).then_some(word), |w| {
                let rest = w & (w - 1);
                (rest != 0).then_some(rest)
            })
            .map(move |w| 64 * k + w.trailing_zeros() as usize)
        })
    }
}

/// The queue work of a device type, run on the device thread. Its loops over a ring go through
/// [`serve_chains`], which bounds them: a driver that keeps adding buffers cannot keep the
/// thread from its other events (reset, stop).
pub trait QueueHandler: Send {
    /// The driver made buffers available on queue `index` (or the device may make progress on
    /// it). Guest errors that do not break the device (a frame dropped) are counted on `log`.
    fn process_queue(
        &mut self,
        index: usize,
        queues: &mut [ServedQueue],
        dma: &DmaContext,
        log: &DeviceLog,
    ) -> Result<Progress, DeviceError>;
    /// The driver set DRIVER_OK (or a restored device is activated) with these `features`
    /// negotiated, before any queue is served.
    fn activate(&mut self, _features: u64) {}
    /// Forget all in-flight state (the driver reset the device).
    fn reset(&mut self);
    /// Files from outside the guest whose readiness means work on a queue: (file, queue
    /// index). The device thread watches them edge-triggered, as it watches the doorbells.
    fn wake_sources(&self) -> Vec<(RawFd, usize)> {
        Vec::new()
    }
    /// What the handler holds that the driver would lose across a snapshot (`crate::persist`;
    /// asked while the device thread is paused): None when it holds nothing.
    fn save(&self) -> Option<serde_json::Value> {
        None
    }
    /// Take what [`QueueHandler::save`] wrote, into this freshly built handler before its
    /// queues are handed over; the error says what is wrong with it.
    fn restore(&mut self, _state: serde_json::Value) -> Result<(), String> {
        Err("state for a device that keeps none".into())
    }
}

/// What a handler does with the chains [`serve_chains`] takes for it.
pub trait ChainServer {
    /// Whether there is anything to do with a chain now (a receive path needs a frame to
    /// deliver), asked before each chain is taken: when there is not, no chain is taken and
    /// notifications are not re-enabled (the device will not need a kick for it).
    fn wants_chain(&mut self) -> bool {
        true
    }
    /// Serve one checked chain; returns the bytes written into it, for the used ring.
    fn serve(&mut self, chain: &Chain) -> Result<u32, DeviceError>;
    /// Whether the chain just served holds only a part of something that needs more chains
    /// (a frame over mergeable receive buffers, virtio 1.2 §5.1.6.4.2). The next chain is
    /// then given without asking [`ChainServer::wants_chain`], and the parts' used entries
    /// are published together with the chain that completes it.
    fn more_chains(&self) -> bool {
        false
    }
    /// The parts taken so far went back to the ring (it ran dry, the budget ran out, Bus
    /// Master closed, or a buffer faulted): forget them. `hopeless`: the ring, whole, cannot
    /// hold what they were for.
    fn parts_returned(&mut self, _hopeless: bool) {}
    /// Whether the chain just served started work that is still in flight (a request whose
    /// I/O was submitted): its used entry waits for [`ChainServer::settle`], and the
    /// [`ChainServer::serve`] return value is not used.
    fn in_flight(&self) -> bool {
        false
    }
    /// Finish all the work in flight and give each such chain's head and used length to
    /// `complete` (in any order): called once at the end of a pass that left any, before its
    /// used entries are published together.
    fn settle(&mut self, _complete: &mut dyn FnMut(u16, u32)) {}
}

impl<F: FnMut(&Chain) -> Result<u32, DeviceError>> ChainServer for F {
    fn serve(&mut self, chain: &Chain) -> Result<u32, DeviceError> {
        self(chain)
    }
}

/// What [`serve_chains`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ChainsServed {
    /// Chains were put in the used ring.
    pub used: bool,
    /// The budget ran out with chains left: come back for them.
    pub more: bool,
}

/// Take the available chains of `q`, check each through `dma` and give it to `server`: the one
/// loop over a ring that every handler uses. It is bounded: a ring's worth of attempts per
/// call, re-reads of the ring included, so a driver that keeps adding buffers (or toggles the
/// available index) cannot hold the device thread; `more` then asks to be called again. Ring
/// errors (an available index more than a ring ahead, virtio 1.2 §2.7.6) are device errors.
/// Notifications stay off while chains are being taken and are re-enabled when the ring runs
/// dry, looking once more for buffers added meanwhile (§2.7.10). If Bus Master Enable closes
/// in the middle of a chain, the chain goes back to the ring and the loop stops: a pause, not
/// an error; the transport looks at the queues again when it opens. The used-ring write that
/// completes a chain already served is not gated again. A chain whose buffer the IOMMU
/// refused is completed with used length 0 (the fault is the unit's to report); behind an
/// IOMMU a chain with an indirect descriptor is refused outright (its table would be read
/// untranslated). The rings are reached through their host mapping ([`super::queue::split`]);
/// `chain` is the queue's scratch, refilled for each chain.
///
/// A server may leave a chain's work in flight ([`ChainServer::in_flight`]) and finish it with
/// the others at the end of the pass ([`ChainServer::settle`]): however the pass ends, their
/// used entries are then written and published together, one notification for the batch.
///
/// A server may take several chains for one thing ([`ChainServer::more_chains`]): their used
/// entries are published together when it is complete. If the loop stops before that, the
/// parts go back to the ring, in order, to be taken again; a fault completes them all with
/// length 0 (a driver drops each as too short); a thing the whole ring cannot hold is given
/// up, its chains back to the ring.
///
/// What the pass carried is added to the queue's counters ([`ServedQueue::counters`]).
pub fn serve_chains(
    q: &mut ServedQueue,
    dma: &DmaContext,
    chain: &mut Chain,
    server: impl ChainServer,
) -> Result<ChainsServed, DeviceError> {
    let mut tally = Tally::default();
    let served = serve_ring(q, dma, chain, server, &mut tally);
    q.counters().add(&tally);
    served
}

/// [`serve_chains`]' loop, counting on `tally` what it completes.
fn serve_ring(
    q: &mut ServedQueue,
    dma: &DmaContext,
    chain: &mut Chain,
    mut server: impl ChainServer,
    tally: &mut Tally,
) -> Result<ChainsServed, DeviceError> {
    let Ok(mem) = dma.memory() else {
        return Ok(ChainsServed::default());
    };
    let mut ring = q.ring(mem)?;
    let mut in_flight = 0;
    let taken = take_chains(
        &mut ring,
        mem,
        dma,
        chain,
        &mut server,
        tally,
        &mut in_flight,
    );
    if in_flight == 0 {
        return taken;
    }
    // Whatever ended the pass (a dry ring, the budget, a pause, a broken chain), the chains
    // whose work is in flight are finished and completed first.
    let mut written = Ok(());
    server.settle(&mut |head, len| {
        if written.is_ok() {
            written = ring.put_used(head, len);
        }
        tally.completed += 1;
        tally.bytes_written += u64::from(len);
    });
    ring.publish_used();
    written?;
    taken.map(|done| ChainsServed { used: true, ..done })
}

/// [`serve_chains`]' loop proper, on `ring`; `in_flight` counts the chains served whose used
/// entries wait for [`ChainServer::settle`].
fn take_chains(
    ring: &mut Ring<'_>,
    mem: &GuestMemoryMmap,
    dma: &DmaContext,
    chain: &mut Chain,
    server: &mut impl ChainServer,
    tally: &mut Tally,
    in_flight: &mut u16,
) -> Result<ChainsServed, DeviceError> {
    let mut done = ChainsServed::default();
    let mut parts = Parts::default();
    ring.disable_notification();
    for _ in 0..ring.size() {
        if parts.is_empty() && !server.wants_chain() {
            return Ok(done);
        }
        let Some(head) = ring.pop()? else {
            if ring.enable_notification() {
                // Buffers arrived meanwhile: take them, notifications off again.
                ring.disable_notification();
                continue;
            }
            parts.go_back(ring, server, false);
            return Ok(done);
        };
        let translated = dma.translated();
        let mut checked = chain::check(head, ring.descriptors(mem, head, !translated), dma, chain);
        // Translated, the walk stops at an indirect descriptor: such a chain is refused for
        // that, whatever else is wrong with it.
        if checked.is_err() && translated && ring.refers_to_indirect(head) {
            checked = Err(ChainError::Indirect(head));
        }
        match checked
            .map_err(DeviceError::from)
            .and_then(|()| server.serve(chain))
        {
            Ok(_) if server.in_flight() => {
                *in_flight += 1;
                tally.bytes_read += chain.readable_len();
            }
            Ok(len) if server.more_chains() => {
                if !parts.push(head, len, ring.size()) {
                    parts.go_back(ring, server, true);
                }
            }
            Ok(len) => {
                for (part, len) in parts.take() {
                    ring.put_used(part, len)?;
                    tally.bytes_written += u64::from(len);
                }
                ring.put_used(head, len)?;
                ring.publish_used();
                done.used = true;
                tally.completed += 1;
                tally.bytes_written += u64::from(len);
                tally.bytes_read += chain.readable_len();
            }
            Err(e) if e.is_pause() => {
                ring.go_back(1);
                parts.go_back(ring, server, false);
                return Ok(done);
            }
            Err(e) if e.is_fault() => {
                for (part, _) in parts.take() {
                    ring.put_used(part, 0)?;
                }
                ring.put_used(head, 0)?;
                ring.publish_used();
                server.parts_returned(false);
                done.used = true;
                tally.completed += 1;
                tally.iommu_faults += 1;
            }
            Err(e) => return Err(e),
        }
    }
    parts.go_back(ring, server, false);
    done.more = true;
    Ok(done)
}

/// The chains a server took for one thing that needs more ([`ChainServer::more_chains`]),
/// with the bytes written into each, their used entries not yet written: held inline, so
/// serving allocates nothing.
struct Parts {
    taken: [(u16, u32); Parts::CAPACITY],
    len: usize,
}

impl Default for Parts {
    fn default() -> Self {
        Parts {
            taken: [(0, 0); Parts::CAPACITY],
            len: 0,
        }
    }
}

impl Parts {
    /// The most chains one thing may take: the largest queue any device here offers.
    const CAPACITY: usize = 256;

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Hold chain `head`; false if that fills a whole ring of `size` (or the capacity) with
    /// parts: what they are for cannot be held by this ring.
    fn push(&mut self, head: u16, len: u32, size: u16) -> bool {
        self.taken[self.len] = (head, len);
        self.len += 1;
        self.len < usize::from(size).min(Self::CAPACITY)
    }

    /// The parts, in the order taken, forgotten here.
    fn take(&mut self) -> impl Iterator<Item = (u16, u32)> + '_ {
        let len = std::mem::take(&mut self.len);
        self.taken[..len].iter().copied()
    }

    /// Put the parts back in the ring, in order, and tell the server (if there were any).
    fn go_back(&mut self, ring: &mut Ring<'_>, server: &mut impl ChainServer, hopeless: bool) {
        if self.len > 0 {
            ring.go_back(u16::try_from(self.len).expect("at most a ring"));
            self.len = 0;
            server.parts_returned(hopeless);
        }
    }
}

/// The one state both the register side and the device thread write: DEVICE_NEEDS_RESET and
/// the configuration generation it bumps, and the device's log.
#[derive(Debug)]
pub struct DeviceHealth {
    needs_reset: AtomicBool,
    config_generation: AtomicU32,
    log: Arc<DeviceLog>,
}

impl DeviceHealth {
    /// A healthy device logging to `log`.
    pub fn new(log: Arc<DeviceLog>) -> Self {
        DeviceHealth {
            needs_reset: AtomicBool::new(false),
            config_generation: AtomicU32::new(0),
            log,
        }
    }

    /// The device's log.
    pub fn log(&self) -> &Arc<DeviceLog> {
        &self.log
    }

    /// Mark the device broken (virtio 1.2 §2.1.2), a guest error. Returns whether it was
    /// newly broken.
    pub fn fail(&self, why: &dyn std::fmt::Display) -> bool {
        guest_error!(self.log, "{why}; the device needs a reset");
        let newly = !self.needs_reset.swap(true, Ordering::SeqCst);
        if newly {
            self.config_generation.fetch_add(1, Ordering::SeqCst);
        }
        newly
    }

    /// Whether the device is broken.
    pub fn needs_reset(&self) -> bool {
        self.needs_reset.load(Ordering::SeqCst)
    }

    /// The configuration generation: bumped each time the device newly breaks, so a driver
    /// re-reading the configuration sees the change (virtio 1.2 §2.5.1).
    pub fn config_generation(&self) -> u32 {
        self.config_generation.load(Ordering::SeqCst)
    }

    /// The driver reset the device: DEVICE_NEEDS_RESET clears with the rest of the status
    /// (virtio 1.2 §2.1).
    pub(super) fn clear(&self) {
        self.needs_reset.store(false, Ordering::SeqCst);
    }
}

/// A notification the device sends the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notification {
    /// Used buffers on this queue.
    Queue(usize),
    /// The configuration (or the status: DEVICE_NEEDS_RESET) changed.
    Config,
}

/// Where the device is in a queue: the next available ring entry it will take and the next
/// used ring entry it will fill (virtio 1.2 §2.7.6, §2.7.8). What a snapshot keeps of a live
/// queue beside the driver's registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueuePosition {
    /// The device's next index into the available ring.
    pub next_avail: u16,
    /// The device's next index into the used ring.
    pub next_used: u16,
}
