//! virtio-queue's ring reader as the reference for the host-mapped one ([`crate::virtio::queue::split`],
//! issue 20): a [`RingScenario`] is a queue (size, EVENT_IDX, positions, translated or not)
//! over guest memory with a hole, and rounds of driver writes (raw stores anywhere in the
//! rings and tables, or chains published the way a driver does) each followed by one
//! `serve_chains` pass, with a scripted server that takes or declines chains, completes them
//! or stops on a pause, a fault or a fatal error, and the notification decision after it.
//! [`RingScenario::compare`] runs it through `serve_chains` and through the loop it replaced,
//! which walks the rings through virtio-queue, and says where they differ: each pass's result
//! and the chains served, the positions, the notification decisions, and guest memory after.

use std::sync::{Arc, RwLock, RwLockReadGuard};

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::dma::{Access, AccessPlatform, DmaContext, DmaError, RingArea, RingWatch, Translation};
use crate::virtio::device::{ChainServer, ChainsServed, DeviceError, serve_chains};
use crate::virtio::queue::chain::{self, Chain, ChainError};
use crate::virtio::queue::split::{ServedQueue, refers_to_indirect};

/// Two 32 KiB regions with a 32 KiB hole between them: buffers and indirect tables may lie
/// in either, across the hole or outside memory.
const REGIONS: [(u64, usize); 2] = [(0, 0x8000), (0x1_0000, 0x8000)];
const DESC: u64 = 0x0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
/// Bytes from `DESC` that the driver's raw writes land in: the three rings.
const RINGS: u64 = 0x3000;

/// What a driver does before a pass.
#[derive(Clone, Debug)]
enum DriverWrite {
    /// Store a 16-bit value at this guest address.
    Store(u64, u16),
    /// Put these heads in the available ring and move its index past them.
    Publish(Vec<u16>),
}

/// What the server does with the chain it is given.
#[derive(Clone, Copy, Debug)]
enum Action {
    /// Complete it with this many bytes written.
    Used(u32),
    /// Bus Master Enable closed: put it back and stop.
    Pause,
    /// The IOMMU refused a buffer: complete it with nothing written.
    Fault,
    /// A fatal error: the device breaks.
    Fatal,
}

/// A queue, its memory and the rounds run on it (see the module's comment).
#[derive(Clone, Debug)]
pub struct RingScenario {
    size: u16,
    event_idx: bool,
    translated: bool,
    next_avail: u16,
    next_used: u16,
    /// The first bytes of guest memory (descriptor table first).
    image: Vec<u8>,
    rounds: Vec<Vec<DriverWrite>>,
    /// Per round: whether the server wants another chain, then what it does with each.
    script: Vec<(bool, Action)>,
}

/// One way of serving the queue.
#[derive(Clone, Copy, Debug)]
enum Reader {
    /// `serve_chains` over the host mapping.
    Host,
    /// The replaced loop, through virtio-queue.
    VirtioQueue,
}

/// One pass: its result (errors as their message: `DeviceError` has no equality), then
/// whether a notification is due.
type Pass = (Result<(bool, bool), String>, Result<bool, String>);

/// What a run produced, to compare.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    passes: Vec<Pass>,
    /// The chains the server was given, in order.
    served: Vec<Chain>,
    positions: (u16, u16),
    memory: Vec<u8>,
}

/// A unit that maps every bus address to the same guest-physical one, pages at a time.
#[derive(Debug, Default)]
struct Identity(RwLock<()>);

impl AccessPlatform for Identity {
    fn translate(&self, _: u16, iova: u64, _: Access) -> Result<Translation, DmaError> {
        Ok(Translation {
            address: iova,
            len: 0x1000 - (iova & 0xfff),
        })
    }

    fn map_rings(
        &self,
        _: u16,
        _: &Arc<RingWatch>,
        rings: &[RingArea],
    ) -> Result<Vec<u64>, DmaError> {
        Ok(rings.iter().map(|r| r.address).collect())
    }

    fn round(&self) -> RwLockReadGuard<'_, ()> {
        self.0.read().unwrap()
    }
}

/// The scripted server, shared by both readers.
struct Script<'a> {
    steps: &'a [(bool, Action)],
    at: usize,
    served: &'a mut Vec<Chain>,
}

impl ChainServer for &mut Script<'_> {
    fn wants_chain(&mut self) -> bool {
        self.steps.get(self.at).is_some_and(|s| s.0)
    }

    fn serve(&mut self, chain: &Chain) -> Result<u32, DeviceError> {
        self.served.push(chain.clone());
        let action = self.steps.get(self.at).map_or(Action::Used(0), |s| s.1);
        self.at += 1;
        match action {
            Action::Used(len) => Ok(len),
            Action::Pause => Err(DmaError::NotMaster(crate::dma::Requester::Pci(8)).into()),
            Action::Fault => Err(DmaError::Fault { addr: 0, reason: 5 }.into()),
            Action::Fatal => Err(DmaError::OutsideMemory { addr: 0, len: 1 }.into()),
        }
    }
}

/// `serve_chains` as it was before the host-mapped reader, through virtio-queue.
fn serve_through_virtio_queue(
    q: &mut Queue,
    dma: &DmaContext,
    chain: &mut Chain,
    mut server: impl ChainServer,
) -> Result<ChainsServed, DeviceError> {
    let mem = dma.memory()?;
    let mut done = ChainsServed::default();
    q.disable_notification(mem)?;
    for _ in 0..usize::from(q.size()) {
        if !server.wants_chain() {
            return Ok(done);
        }
        let Some(desc) = q.iter(mem)?.next() else {
            if q.enable_notification(mem)? {
                q.disable_notification(mem)?;
                continue;
            }
            return Ok(done);
        };
        let head = desc.head_index();
        let read = |i: u16| {
            let at = q.desc_table().checked_add(u64::from(i) * 16)?;
            mem.read_obj(GuestAddress(at)).ok()
        };
        let served = if dma.translated() && refers_to_indirect(q.size(), head, read) {
            Err(ChainError::Indirect(head).into())
        } else {
            chain::check(head, desc, dma, chain)
                .map_err(DeviceError::from)
                .and_then(|()| server.serve(chain))
        };
        match served {
            Ok(len) => {
                q.add_used(mem, head, len)?;
                done.used = true;
            }
            Err(e) if e.is_pause() => {
                q.go_to_previous_position();
                return Ok(done);
            }
            Err(e) if e.is_fault() => {
                q.add_used(mem, head, 0)?;
                done.used = true;
            }
            Err(e) => return Err(e),
        }
    }
    done.more = true;
    Ok(done)
}

impl RingScenario {
    /// The queue as the driver configured it, at the scenario's positions.
    fn queue(&self) -> Queue {
        let mut q = Queue::new(256).expect("a valid maximum");
        q.set_size(self.size);
        for (set, at) in [
            (
                Queue::try_set_desc_table_address as fn(&mut Queue, _) -> _,
                DESC,
            ),
            (Queue::try_set_avail_ring_address, AVAIL),
            (Queue::try_set_used_ring_address, USED),
        ] {
            set(&mut q, GuestAddress(at)).expect("aligned");
        }
        q.set_event_idx(self.event_idx);
        q.set_next_avail(self.next_avail);
        q.set_next_used(self.next_used);
        q.set_ready(true);
        q
    }

    /// Carry out the driver's writes of one round.
    fn drive(mem: &GuestMemoryMmap, size: u16, writes: &[DriverWrite]) {
        for w in writes {
            match w {
                DriverWrite::Store(at, value) => {
                    let _ = mem.write_obj(*value, GuestAddress(*at));
                }
                DriverWrite::Publish(heads) => {
                    let idx: u16 = mem.read_obj(GuestAddress(AVAIL + 2)).expect("in memory");
                    for (k, head) in (0u16..).zip(heads) {
                        let slot = u64::from(idx.wrapping_add(k) % size);
                        let at = GuestAddress(AVAIL + 4 + 2 * slot);
                        mem.write_obj(*head, at).expect("in memory");
                    }
                    let n = u16::try_from(heads.len()).expect("a few");
                    mem.write_obj(idx.wrapping_add(n), GuestAddress(AVAIL + 2))
                        .expect("in memory");
                }
            }
        }
    }

    fn run(&self, reader: Reader) -> Outcome {
        let ranges = REGIONS.map(|(start, len)| (GuestAddress(start), len));
        let mem = GuestMemoryMmap::from_ranges(&ranges).expect("disjoint regions");
        mem.write_slice(&self.image, GuestAddress(0))
            .expect("inside the first region");
        let mut dma = DmaContext::pci(mem.clone(), 0x8);
        dma.bus_master().set(true);
        if self.translated {
            dma = dma.behind(Arc::new(Identity::default()));
        }
        let mut served = Vec::new();
        let mut script = Script {
            steps: &self.script,
            at: 0,
            served: &mut served,
        };
        let (mut q, mut host) = (self.queue(), ServedQueue::new(self.queue()));
        let mut chain = Chain::default();
        let mut passes = Vec::new();
        for writes in &self.rounds {
            Self::drive(&mem, self.size, writes);
            let (done, notify) = match reader {
                Reader::Host => (
                    serve_chains(&mut host, &dma, &mut chain, &mut script),
                    host.needs_notification(&mem),
                ),
                Reader::VirtioQueue => (
                    serve_through_virtio_queue(&mut q, &dma, &mut chain, &mut script),
                    q.needs_notification(&mem),
                ),
            };
            passes.push((
                done.map(|d| (d.used, d.more)).map_err(|e| e.to_string()),
                notify.map_err(|e| e.to_string()),
            ));
            // The step after a pass: a broken device is not served again.
            if passes.last().is_some_and(|p| p.0.is_err()) {
                break;
            }
        }
        let q = match reader {
            Reader::Host => host.queue(),
            Reader::VirtioQueue => &q,
        };
        let mut memory = vec![0; REGIONS[0].1];
        mem.read_slice(&mut memory, GuestAddress(0))
            .expect("inside");
        Outcome {
            passes,
            served,
            positions: (q.next_avail(), q.next_used()),
            memory,
        }
    }

    /// A scenario made from arbitrary bytes (zeros past their end).
    pub fn from_bytes(data: &[u8]) -> Self {
        let mut input = Input(data);
        let config = input.byte();
        let size = 1u16 << (config % 9);
        let (next_avail, next_used) = (input.word(), input.word());
        let mut image = table(&mut input, size);
        // The driver's ring starts where the device is, the device's where it left it,
        // used_event near the used idx (where the decision turns) and avail_event anywhere.
        let near = next_used
            .wrapping_add(u16::from(input.byte() % 8))
            .wrapping_sub(3);
        for (at, value) in [
            (AVAIL + 2, next_avail),
            (USED + 2, next_used),
            (AVAIL + 4 + 2 * u64::from(size), near),
            (USED + 4 + 8 * u64::from(size), input.word()),
        ] {
            let at = usize::try_from(at).expect("small");
            image[at..at + 2].copy_from_slice(&value.to_le_bytes());
        }
        let rounds = (0..1 + input.byte() % 6)
            .map(|_| {
                (0..input.byte() % 4)
                    .map(|_| driver_write(&mut input, size))
                    .collect()
            })
            .collect();
        let script = (0..64)
            .map(|_| {
                let b = input.byte();
                let action = match b >> 5 {
                    0 => Action::Pause,
                    1 => Action::Fault,
                    2 => Action::Fatal,
                    _ => Action::Used(u32::from(input.word())),
                };
                (b & 0x1f != 0, action)
            })
            .collect();
        RingScenario {
            size,
            event_idx: config & 0x10 != 0,
            translated: config & 0x20 != 0,
            next_avail,
            next_used,
            image,
            rounds,
            script,
        }
    }

    /// Serve the queue both ways and say how they differ, if they do.
    pub fn compare(&self) -> Result<(), String> {
        let (host, reference) = (self.run(Reader::Host), self.run(Reader::VirtioQueue));
        if host == reference {
            Ok(())
        } else {
            let first = host
                .memory
                .iter()
                .zip(&reference.memory)
                .position(|(a, b)| a != b);
            Err(format!(
                "the host-mapped ring reader and virtio-queue's differ on {self:?}:\nhost {:?} \
                 {:?} {:?}\nvirtio-queue {:?} {:?} {:?}\nfirst memory difference at {first:?}",
                host.passes,
                host.served,
                host.positions,
                reference.passes,
                reference.served,
                reference.positions
            ))
        }
    }
}

/// Arbitrary bytes, read in order (zeros past their end).
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }

    fn word(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }
}

/// The first `RINGS` bytes of guest memory, the descriptor table first: mostly buffers
/// inside the first region after the rings, some anywhere in the first 0x2_0000 bytes (either
/// region, the hole, past the end) and of any length (chains past 4 GiB); any flags (indirect
/// ones rarer, their tables mostly in this one) and links, a few outside the table. The rings
/// are zeros.
fn table(input: &mut Input<'_>, size: u16) -> Vec<u8> {
    let mut image = Vec::new();
    for _ in 0..size {
        let [shape, bits] = [input.byte(), input.byte()];
        let indirect = if bits & 0x38 == 0 { 4 } else { 0 };
        let (addr, len) = if indirect != 0 && shape & 3 != 0 {
            // An indirect table inside this one (its entries may be indirect too), of a
            // whole number of descriptors or not.
            let first = u64::from(input.byte()) % u64::from(size);
            (
                DESC + 16 * first,
                16 * u32::from(1 + shape % 4) + u32::from(shape >> 6 & 1),
            )
        } else if shape & 3 == 0 {
            let len = u32::from(input.word()) << 16 | u32::from(input.word());
            (u64::from(input.word()) * 2, len)
        } else {
            let addr = RINGS + u64::from(input.word()) % 0x4000;
            (addr, u32::from(input.word() % 0x800))
        };
        let flags = u16::from(bits & 3 | indirect);
        let link = u16::from(input.byte()) % (size + u16::from(shape >> 7));
        image.extend(addr.to_le_bytes());
        image.extend(len.to_le_bytes());
        image.extend(flags.to_le_bytes());
        image.extend(link.to_le_bytes());
    }
    image.resize(usize::try_from(RINGS).expect("small"), 0);
    image
}

/// One driver write before a pass: mostly chains published (up to a ring's worth, heads
/// sometimes past the table), sometimes a raw store anywhere in the rings.
fn driver_write(input: &mut Input<'_>, size: u16) -> DriverWrite {
    let w = input.word();
    if w & 7 == 0 {
        DriverWrite::Store((u64::from(w) % RINGS) & !1, input.word())
    } else {
        let n = ((w >> 3) % (size + 1)).min(8);
        DriverWrite::Publish((0..n).map(|_| input.word() % (size + 1)).collect())
    }
}
