//! A device's buffers resolved once to the host memory that backs them, for backends to use in
//! place: [`Segments`], filled by [`super::DmaContext::resolve`], is the list of host pieces
//! (as `iovec`s, for `readv`/`writev`/`preadv`/`pwritev`, or as vm-memory `VolatileSlice`s)
//! that a range of guest memory is made of. One is kept per queue and reused for every chain,
//! so the data path allocates nothing once it has grown to the longest chain.
//!
//! The region lookup is cached too. A DMA context takes a snapshot of its guest memory's
//! regions (guest start, length, host address: [`RegionMap`]) when it is made, and checks
//! bounds against it; the scratch shares the snapshot of the context it last resolved through
//! and remembers the region hit last, so a buffer in the same region as the previous one costs
//! two comparisons. Guest memory is fixed for the machine's life today; should a device ever
//! be handed another memory map, it comes with another context and so another snapshot, which
//! [`Segments::bind`] tells by identity on every resolution and takes instead. The scratch
//! holds a clone of the memory it points into, so its pointers stay mapped for as long as it
//! lives, whatever happens to the device's own context.

use std::io;
use std::sync::Arc;

use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, VolatileSlice};

/// Most `iovec`s one vectored system call (or io_uring request) takes (Linux's UIO_MAXIOV).
pub const IOV_MAX: usize = 1024;

/// One guest-memory region as the host maps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Region {
    start: u64,
    len: u64,
    host: usize,
}

/// The regions of a guest memory, sorted and disjoint, as the host maps them: a snapshot
/// taken when a DMA context is made (memory is fixed for the machine's life).
#[derive(Clone, Debug, Default)]
pub(super) struct RegionMap(Arc<[Region]>);

impl RegionMap {
    /// The snapshot of `mem`.
    pub(super) fn of(mem: &GuestMemoryMmap) -> Self {
        RegionMap(
            mem.iter()
                .map(|r| Region {
                    start: r.start_addr().0,
                    len: r.len(),
                    host: r.as_ptr() as usize,
                })
                .collect(),
        )
    }

    /// Call `piece` with the host address and length of each piece of the `len` bytes at
    /// `addr`, one per region they cross, starting the search at region `*last` and leaving
    /// there the last one found; false if they are not all guest memory (pieces before the
    /// hole were given).
    fn walk(
        &self,
        last: &mut usize,
        addr: u64,
        len: u64,
        mut piece: impl FnMut(usize, u64),
    ) -> bool {
        let (mut at, mut left) = (addr, len);
        while left > 0 {
            let Some(r) = self.lookup(last, at) else {
                return false;
            };
            let offset = at - r.start;
            let n = left.min(r.len - offset);
            piece(
                r.host + usize::try_from(offset).expect("inside a mapping"),
                n,
            );
            at += n;
            left -= n;
        }
        true
    }

    /// Whether the `len` bytes at `addr` are all guest memory (adjacent regions included).
    pub(super) fn contains(&self, addr: u64, len: u64) -> bool {
        self.walk(&mut 0, addr, len, |_, _| {})
    }

    /// The region holding `addr`: region `*last`, or found by binary search.
    fn lookup(&self, last: &mut usize, addr: u64) -> Option<Region> {
        let hit = |r: &Region| addr >= r.start && addr - r.start < r.len;
        if let Some(r) = self.0.get(*last).filter(|r| hit(r)) {
            return Some(*r);
        }
        let k = self.0.partition_point(|r| r.start <= addr).checked_sub(1)?;
        let r = *self.0.get(k).filter(|r| hit(r))?;
        *last = k;
        Some(r)
    }
}

/// The host pieces of a resolved guest range, and the region cache (see the module's comment).
#[derive(Debug, Default)]
pub struct Segments {
    iov: Vec<libc::iovec>,
    /// Bytes in `iov`.
    len: usize,
    /// The memory the pieces point into, held so they stay mapped.
    mem: Option<GuestMemoryMmap>,
    regions: RegionMap,
    /// The region the last lookup found.
    last: usize,
}

// SAFETY: the pointers in `iov` point into the guest memory held in `mem`, which is itself
// shared between threads (`GuestMemoryMmap` is Send and Sync); nothing here is tied to the
// thread that resolved them.
unsafe impl Send for Segments {}

impl Segments {
    /// Forget the pieces (the cache stays).
    pub fn clear(&mut self) {
        self.iov.clear();
        self.len = 0;
    }

    /// Total bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Make `mem`, of which `regions` is the snapshot, the memory the pieces point into, if
    /// it is not already (never while memory is fixed, but once).
    pub(super) fn bind(&mut self, mem: &GuestMemoryMmap, regions: &RegionMap) {
        if !Arc::ptr_eq(&self.regions.0, &regions.0) {
            self.iov.clear();
            self.len = 0;
            self.regions = regions.clone();
            self.mem = Some(mem.clone());
            self.last = 0;
        }
    }

    /// Append the `len` guest-physical bytes at `addr`, a piece per region they cross; false,
    /// with nothing appended, if they are not all guest memory.
    pub(super) fn push_guest(&mut self, addr: u64, len: usize) -> bool {
        let mark = self.iov.len();
        let (iov, total) = (&mut self.iov, &mut self.len);
        let inside = self
            .regions
            .walk(&mut self.last, addr, len as u64, |host, n| {
                let n = usize::try_from(n).expect("at most len");
                iov.push(libc::iovec {
                    iov_base: host as *mut libc::c_void,
                    iov_len: n,
                });
                *total += n;
            });
        if !inside {
            self.truncate(mark);
        }
        inside
    }

    /// Drop the first `n` bytes (all of them if there are fewer).
    pub fn skip(&mut self, mut n: usize) {
        let whole = self.iov.iter().take_while(|p| {
            let take = p.iov_len <= n;
            if take {
                n -= p.iov_len;
            }
            take
        });
        let whole = whole.count();
        self.truncate_front(whole);
        if let Some(piece) = self.iov.first_mut().filter(|_| n > 0) {
            // SAFETY: `n` < the piece's length here: the result stays inside it.
            piece.iov_base = unsafe { piece.iov_base.cast::<u8>().add(n) }.cast();
            piece.iov_len -= n;
            self.len -= n;
        }
    }

    /// Drop the first `k` pieces.
    fn truncate_front(&mut self, k: usize) {
        for piece in self.iov.drain(..k) {
            self.len -= piece.iov_len;
        }
    }

    /// Drop the pieces from index `mark` on.
    pub(super) fn truncate(&mut self, mark: usize) {
        for piece in self.iov.drain(mark..) {
            self.len -= piece.iov_len;
        }
    }

    /// How many pieces there are (a mark for [`Segments::truncate`]).
    pub(super) fn pieces(&self) -> usize {
        self.iov.len()
    }

    /// The pieces, as `iovec`s.
    pub fn iovecs(&self) -> &[libc::iovec] {
        &self.iov
    }

    /// The pieces, as vm-memory slices.
    pub fn slices(&self) -> impl Iterator<Item = VolatileSlice<'_>> {
        self.iov.iter().map(|piece| {
            // SAFETY: each piece lies inside one region of `self.mem`, which this scratch
            // holds, so it stays mapped for as long as the borrow of `self`.
            unsafe { VolatileSlice::new(piece.iov_base.cast::<u8>(), piece.iov_len) }
        })
    }

    /// The pieces of bytes `skip..` (their own sub-slices).
    fn slices_from(&self, mut skip: usize) -> impl Iterator<Item = VolatileSlice<'_>> {
        self.slices().filter_map(move |s| {
            let from = skip.min(s.len());
            skip -= from;
            s.subslice(from, s.len() - from)
                .ok()
                .filter(|s| !s.is_empty())
        })
    }

    /// Copy bytes `skip..` into `buf`; returns how many were copied.
    pub fn gather(&self, skip: usize, buf: &mut [u8]) -> usize {
        let mut done = 0;
        for s in self.slices_from(skip) {
            if done == buf.len() {
                break;
            }
            done += s.copy_to(&mut buf[done..]);
        }
        done
    }

    /// Copy `data` into bytes `skip..`; returns how many were copied.
    pub fn scatter(&self, skip: usize, data: &[u8]) -> usize {
        let mut done = 0;
        for s in self.slices_from(skip) {
            if done == data.len() {
                break;
            }
            let n = s.len().min(data.len() - done);
            s.subslice(0, n)
                .expect("n ≤ the piece's length")
                .copy_from(&data[done..done + n]);
            done += n;
        }
        done
    }

    /// Move all the bytes with `io`, a vectored system call that transfers from the front of
    /// the `iovec`s it is given and returns how many bytes it moved (`preadv`, `pwritev`), at
    /// most [`IOV_MAX`] pieces at a time, until all are moved: a short transfer goes on from
    /// where it stopped, one of nothing is an error. `io` gets the bytes already moved, for its
    /// file offset. The pieces are used up.
    pub fn transfer(
        &mut self,
        mut io: impl FnMut(&[libc::iovec], u64) -> io::Result<usize>,
    ) -> io::Result<()> {
        let (mut first, mut moved) = (0, 0u64);
        while first < self.iov.len() {
            let window = &self.iov[first..self.iov.len().min(first + IOV_MAX)];
            let mut n = match io(window, moved) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            moved += n as u64;
            while n > 0 && first < self.iov.len() {
                let piece = &mut self.iov[first];
                let step = n.min(piece.iov_len);
                // SAFETY: `step` ≤ the piece's length: the result stays inside it.
                piece.iov_base = unsafe { piece.iov_base.cast::<u8>().add(step) }.cast();
                piece.iov_len -= step;
                n -= step;
                if piece.iov_len == 0 {
                    first += 1;
                }
            }
        }
        self.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
