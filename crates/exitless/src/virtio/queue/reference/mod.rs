//! The copy path as the reference for the zero-copy one (issue 20): a [`Scenario`] is guest
//! memory of one to three regions (adjacent ones, so buffers straddle their boundary, or with
//! holes), a chain of buffers, and optionally an IOMMU mapping ([`PageMap`]: pages mapped to
//! scattered guest pages, unmapped ones, read-only and write-only ones, contiguous runs
//! translated at once) under which Bus Master Enable may close after a number of
//! translations, mid-chain. [`Scenario::run`] reads and writes the chain one way or the other;
//! both must give the same [`Outcome`]. The unit tests and the `zero_copy` fuzz target drive
//! it; [`Scenario::from_bytes`] makes one from arbitrary bytes.

pub mod ring;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use super::chain::{Buffer, Chain};
use crate::dma::{
    Access, AccessPlatform, BusMaster, DmaContext, DmaError, RingArea, RingWatch, Segments,
    Translation,
};

const PAGE: u64 = 0x1000;
const PAGE_BYTES: usize = 0x1000;
/// Pages of bus address space a [`PageMap`] covers.
const IOVA_PAGES: usize = 16;

/// One bus page's mapping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageEntry {
    /// The guest page (a page number), if mapped.
    pub frame: Option<u64>,
    /// Reads allowed.
    pub read: bool,
    /// Writes allowed.
    pub write: bool,
}

/// A stand-in for a remapping unit with an arbitrary page mapping. A translation covers the
/// run of following pages mapped contiguously with the same permission, at most `max_run`
/// pages (so callers cannot assume it stops at a page boundary, nor that it covers the whole
/// run). Faults are recorded in order; with `close_after`, the requester's Bus Master Enable
/// closes once that many translations were made.
#[derive(Debug)]
pub struct PageMap {
    pages: Vec<PageEntry>,
    max_run: usize,
    faults: Mutex<Vec<(u64, Access)>>,
    translations: AtomicUsize,
    close_after: Option<(usize, BusMaster)>,
    round: RwLock<()>,
}

impl PageMap {
    fn allows(entry: &PageEntry, access: Access) -> bool {
        entry.frame.is_some()
            && match access {
                Access::Read => entry.read,
                Access::Write => entry.write,
            }
    }
}

impl AccessPlatform for PageMap {
    fn translate(&self, _source: u16, iova: u64, access: Access) -> Result<Translation, DmaError> {
        let done = self.translations.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some((after, master)) = &self.close_after
            && done >= *after
        {
            master.set(false);
        }
        let page = usize::try_from(iova / PAGE).unwrap_or(usize::MAX);
        let entry = self.pages.get(page).filter(|e| Self::allows(e, access));
        let Some(frame) = entry.and_then(|e| e.frame) else {
            self.faults.lock().unwrap().push((iova, access));
            return Err(DmaError::Fault {
                addr: iova,
                reason: 1,
            });
        };
        let mut run = 1;
        while run < self.max_run
            && self
                .pages
                .get(page + run)
                .is_some_and(|e| Self::allows(e, access) && e.frame == Some(frame + run as u64))
        {
            run += 1;
        }
        Ok(Translation {
            address: frame * PAGE + iova % PAGE,
            len: run as u64 * PAGE - iova % PAGE,
        })
    }

    fn map_rings(&self, _: u16, _: &Arc<RingWatch>, _: &[RingArea]) -> Result<Vec<u64>, DmaError> {
        Err(DmaError::Fault { addr: 0, reason: 1 })
    }

    fn round(&self) -> RwLockReadGuard<'_, ()> {
        self.round.read().unwrap()
    }
}

/// Which way [`Scenario::run`] goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// `Chain::read_all` and `Chain::write_all`: a copy through `DmaContext::read`/`write`.
    Copy,
    /// `Chain::resolve` to host segments, then gathered and scattered in place.
    ZeroCopy,
}

/// A chain over guest memory, maybe behind a [`PageMap`].
#[derive(Clone, Debug, Default)]
pub struct Scenario {
    /// (start, length) of each region, sorted, in bytes.
    pub regions: Vec<(u64, usize)>,
    /// The bus mapping; `None`: the device is untranslated.
    pub pages: Option<Vec<PageEntry>>,
    /// Most pages one translation covers.
    pub max_run: usize,
    /// Bus Master Enable closes after this many translations.
    pub close_after: Option<usize>,
    /// The chain.
    pub chain: Chain,
    /// Bytes written across the writable buffers (at most their total).
    pub write_len: usize,
}

/// What a run did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The readable bytes, or why not.
    pub read: Result<Vec<u8>, DmaError>,
    /// Whether the write went through.
    pub write: Result<(), DmaError>,
    /// Guest memory after the write, when it went through: after a failed one the chain
    /// completes with used length 0, and what either path left in its buffers is not the
    /// driver's to read (virtio 1.2 §2.7.8: the used length bounds what the device wrote).
    pub memory: Option<Vec<u8>>,
    /// The faults the unit recorded, in order.
    pub faults: Vec<(u64, Access)>,
}

/// Byte `i` of guest memory before a run.
fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(31) >> 3).to_le_bytes()[0]
}

impl Scenario {
    /// Read, then write, the chain along `path`.
    pub fn run(&self, path: Path) -> Outcome {
        let ranges: Vec<(GuestAddress, usize)> = self
            .regions
            .iter()
            .map(|&(start, len)| (GuestAddress(start), len))
            .collect();
        let mem = GuestMemoryMmap::from_ranges(&ranges).expect("sorted, disjoint regions");
        for r in mem.iter() {
            let bytes: Vec<u8> = (0..r.len())
                .map(|i| pattern(r.start_addr().0 + i))
                .collect();
            mem.write_slice(&bytes, r.start_addr())
                .expect("inside the region");
        }
        let mut dma = DmaContext::pci(mem.clone(), 0x8);
        dma.bus_master().set(true);
        let unit = self.pages.as_ref().map(|pages| {
            Arc::new(PageMap {
                pages: pages.clone(),
                max_run: self.max_run.max(1),
                faults: Mutex::default(),
                translations: AtomicUsize::new(0),
                close_after: self.close_after.map(|n| (n, dma.bus_master().clone())),
                round: RwLock::default(),
            })
        });
        if let Some(unit) = &unit {
            dma = dma.behind(unit.clone());
        }
        let c = &self.chain;
        let data: Vec<u8> = (0..self.write_len).map(|i| !pattern(i as u64)).collect();
        let mut io = Segments::default();
        let (read, write) = match path {
            Path::Copy => (c.read_all(&dma), c.write_all(&dma, &data)),
            Path::ZeroCopy => {
                let read = c.resolve_readable(&dma, &mut io).map(|()| {
                    let mut buf = vec![0; io.len()];
                    io.gather(0, &mut buf);
                    buf
                });
                let write = c.resolve_writable(&dma, data.len(), &mut io).map(|()| {
                    io.scatter(0, &data);
                });
                (read, write)
            }
        };
        let memory = write.is_ok().then(|| {
            mem.iter()
                .flat_map(|r| {
                    let mut b = vec![0; usize::try_from(r.len()).expect("small")];
                    mem.read_slice(&mut b, r.start_addr()).expect("inside");
                    b
                })
                .collect()
        });
        let faults = unit.map_or_else(Vec::new, |u| u.faults.lock().unwrap().clone());
        Outcome {
            read,
            write,
            memory,
            faults,
        }
    }

    /// A scenario made from arbitrary bytes (zeros past their end).
    pub fn from_bytes(data: &[u8]) -> Self {
        let mut bytes = data.iter().copied().chain(std::iter::repeat(0));
        let mut next = move || bytes.next().unwrap_or(0);
        let mut s = Scenario::default();
        let mut at = 0u64;
        for k in 0..1 + next() % 3 {
            let gap = if k == 0 {
                0
            } else {
                u64::from(next() % 2) * PAGE
            };
            let len = usize::from(1 + next() % 4) * PAGE_BYTES;
            s.regions.push((at + gap, len));
            at += gap + len as u64;
        }
        let span = at / PAGE + 1; // one guest page past the end: outside memory
        let flags = next();
        if flags & 1 == 1 {
            let pages = (0..IOVA_PAGES)
                .map(|_| {
                    let b = next();
                    PageEntry {
                        frame: (b & 3 != 0).then(|| u64::from(next()) % span),
                        read: b & 4 == 0,
                        write: b & 8 == 0,
                    }
                })
                .collect();
            s.pages = Some(pages);
            s.max_run = 1 + usize::from(next() % 4);
            s.close_after = (flags & 2 == 2).then(|| usize::from(next() % 4));
        }
        let space = if s.pages.is_some() {
            IOVA_PAGES as u64 * PAGE
        } else {
            span * PAGE
        };
        let buffer = |next: &mut dyn FnMut() -> u8| {
            let addr = u64::from(u16::from_le_bytes([next(), next()])) * 16 % space;
            let len = u32::from(u16::from_le_bytes([next(), next()])) % (3 * 0x1000);
            Buffer {
                addr: GuestAddress(addr),
                len,
            }
        };
        s.chain.readable = (0..next() % 4).map(|_| buffer(&mut next)).collect();
        s.chain.writable = (0..next() % 4).map(|_| buffer(&mut next)).collect();
        let room = usize::try_from(s.chain.writable_len()).expect("small");
        s.write_len = usize::from(u16::from_le_bytes([next(), next()])) % (room + 1);
        s
    }

    /// Run both paths and say how they differ, if they do.
    pub fn compare(&self) -> Result<(), String> {
        let (copy, zero) = (self.run(Path::Copy), self.run(Path::ZeroCopy));
        if copy == zero {
            Ok(())
        } else {
            Err(format!(
                "copy and zero-copy differ on {self:?}:\ncopy {copy:?}\nzero {zero:?}"
            ))
        }
    }
}

#[cfg(test)]
mod tests;
