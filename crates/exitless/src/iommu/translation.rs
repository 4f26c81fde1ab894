//! DMA translation for the devices behind the unit (VT-d §3.4, §3.6): one request at a time,
//! or a device's rings as whole guest-physical ranges watched for invalidations, with faults
//! recorded (chapter 7). The unit's own error is converted to the DMA side's where devices
//! meet it, in its [`AccessPlatform`] implementation.

use std::sync::{Arc, RwLockReadGuard, Weak};

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::Iommu;
use super::fault::FaultRecord;
use super::iotlb::{Cached, Caches};
use super::tables::{self, Leaf, PAGE_SHIFT, PAGE_SIZE, Upper};
use crate::dma::{Access, AccessPlatform, DmaError, RingArea, RingWatch, Translation};

/// Why the unit did not translate.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum TranslationError {
    /// The unit blocked the access and recorded the fault (§7.1): the device completes the
    /// request with nothing transferred and goes on.
    #[error("the IOMMU blocked an access at bus address {addr:#x} (fault reason {reason:#x})")]
    Fault {
        /// The bus address.
        addr: u64,
        /// The fault reason (`VTD_FR_*`).
        reason: u8,
    },
    /// A ring whose pages are not one range of guest-physical memory.
    #[error("the ring of {len:#x} bytes at bus address {addr:#x} is not physically contiguous")]
    Discontiguous {
        /// The ring's bus address.
        addr: u64,
        /// The ring's size in bytes.
        len: u64,
    },
    /// A ring that wraps the bus address space, or translates to a range that is not
    /// (entirely) guest RAM.
    #[error("{len:#x} bytes at {addr:#x} are outside guest memory")]
    OutsideMemory {
        /// The ring's bus address.
        addr: u64,
        /// The ring's size in bytes.
        len: usize,
    },
}

impl From<TranslationError> for DmaError {
    fn from(e: TranslationError) -> Self {
        match e {
            TranslationError::Fault { addr, reason } => DmaError::Fault { addr, reason },
            TranslationError::Discontiguous { addr, len } => DmaError::Discontiguous { addr, len },
            TranslationError::OutsideMemory { addr, len } => DmaError::OutsideMemory { addr, len },
        }
    }
}

/// The pages a [`RingWatch`] stands for.
#[derive(Debug)]
pub(super) struct Watched {
    watch: Weak<RingWatch>,
    pub(super) source: u16,
    /// `None` while translation is off.
    pub(super) domain: Option<u16>,
    /// IOVA page numbers.
    pub(super) pages: Vec<u64>,
}

/// What device threads share: translation state, caches, ring watches.
#[derive(Debug, Default)]
pub(super) struct Remapping {
    /// GSTS.TES.
    pub(super) enabled: bool,
    /// The root table latched by SRTP.
    pub(super) root_table: u64,
    pub(super) caches: Caches,
    /// Page-table walks (IOTLB misses that reached the tables).
    pub(super) walks: u64,
    watched: Vec<Watched>,
}

impl Remapping {
    /// The context of `source` and the translation of `iova`'s page, from the caches or the
    /// tables (then cached).
    fn lookup(
        &mut self,
        mem: &GuestMemoryMmap,
        source: u16,
        iova: u64,
        access: Access,
    ) -> Result<(u16, Leaf), u8> {
        let context = match self.caches.context(source) {
            Some(c) => c,
            None => {
                let c = tables::context(mem, self.root_table, source)?;
                self.caches.insert_context(source, c);
                c
            }
        };
        let page = iova >> PAGE_SHIFT;
        if let Some(c) = self.caches.translation(context.domain, page) {
            return Ok((context.domain, c.leaf));
        }
        self.walks += 1;
        let leaf = match self.caches.directory(&context, iova) {
            Some(d) => tables::leaf(mem, &d, iova, access)?,
            None => match tables::upper(mem, &context, iova, access)? {
                Upper::Table(d) => {
                    self.caches.insert_directory(context.domain, iova, d);
                    tables::leaf(mem, &d, iova, access)?
                }
                Upper::Large(leaf) => leaf,
            },
        };
        let cached = Cached {
            leaf,
            page_table: context.page_table,
        };
        self.caches.insert_translation(context.domain, page, cached);
        Ok((context.domain, leaf))
    }

    /// The translation of `iova` for `source`, and of the pages after it while they follow it
    /// in guest memory, up to `want` bytes: a buffer translated once per contiguous run.
    /// Only `iova`'s page can fault; the run ends quietly before a page that would (the
    /// device faults there when it gets that far, with a translation of its own).
    fn run(
        &mut self,
        mem: &GuestMemoryMmap,
        source: u16,
        iova: u64,
        want: u64,
        access: Access,
    ) -> Result<Translation, u8> {
        let (_, leaf) = self.lookup(mem, source, iova, access)?;
        let address = leaf.allows(iova, access)?;
        let mut len = leaf.rest(iova);
        while len < want {
            let Some(next) = iova.checked_add(len) else {
                break;
            };
            match self.lookup(mem, source, next, access) {
                Ok((_, leaf)) if leaf.allows(next, access) == Ok(address.wrapping_add(len)) => {
                    len += leaf.rest(next);
                }
                _ => break,
            }
        }
        Ok(Translation { address, len })
    }

    /// Mark stale the ring watches `covers` picks; forget the watches whose device is gone.
    pub(super) fn mark_stale(&mut self, covers: impl Fn(&Watched) -> bool) {
        self.watched.retain(|w| match w.watch.upgrade() {
            Some(watch) => {
                if covers(w) {
                    watch.mark_stale();
                }
                true
            }
            None => false,
        });
    }
}

impl Iommu {
    /// The guest-physical address of `iova` for a request of `source`, or the fault (then
    /// recorded, and signalled if the fault event is unmasked). Untranslated while
    /// translation is off.
    pub fn translate(
        &self,
        source: u16,
        iova: u64,
        access: Access,
    ) -> Result<u64, TranslationError> {
        Ok(self.translate_run(source, iova, 1, access)?.address)
    }

    /// [`Iommu::translate`] for a buffer of `want` bytes at `iova`: the translation's length
    /// covers the pages that follow while they are contiguous in guest memory (at least to
    /// the end of `iova`'s page, at most to the end of the page, 4 KiB or 2 MiB, where `want`
    /// ends).
    pub fn translate_run(
        &self,
        source: u16,
        iova: u64,
        want: u64,
        access: Access,
    ) -> Result<Translation, TranslationError> {
        let result = {
            let mut remap = self.remap.lock().unwrap();
            if !remap.enabled {
                return Ok(Translation {
                    address: iova,
                    len: want.max(PAGE_SIZE - iova % PAGE_SIZE),
                });
            }
            remap.run(&self.mem, source, iova, want, access)
        };
        result.map_err(|reason| self.fault(source, iova, access, reason))
    }

    /// The guest-physical addresses of `rings` for `source`, each a physically contiguous
    /// range of guest RAM (virtio-queue walks rings by guest-physical address), and `watch`
    /// set to stand for their pages. Faults are recorded as for [`Iommu::translate`].
    pub fn map_rings(
        &self,
        source: u16,
        watch: &Arc<RingWatch>,
        rings: &[RingArea],
    ) -> Result<Vec<u64>, TranslationError> {
        let mut remap = self.remap.lock().unwrap();
        let mut watched = Watched {
            watch: Arc::downgrade(watch),
            source,
            domain: None,
            pages: Vec::new(),
        };
        let mut found = Vec::with_capacity(rings.len());
        for ring in rings {
            let outside = TranslationError::OutsideMemory {
                addr: ring.address,
                len: usize::try_from(ring.len).unwrap_or(usize::MAX),
            };
            let end = ring.address.checked_add(ring.len).ok_or(outside.clone())?;
            let mut start = None;
            let mut page = ring.address & !(PAGE_SIZE - 1);
            while page < end {
                let at = page.max(ring.address);
                let gpa = if remap.enabled {
                    let translated = remap.lookup(&self.mem, source, at, ring.access).and_then(
                        |(domain, leaf)| {
                            watched.domain = Some(domain);
                            leaf.allows(at, ring.access)
                        },
                    );
                    match translated {
                        Ok(gpa) => gpa,
                        Err(reason) => {
                            drop(remap);
                            return Err(self.fault(source, at, ring.access, reason));
                        }
                    }
                } else {
                    at
                };
                watched.pages.push(page >> PAGE_SHIFT);
                let first = *start.get_or_insert(gpa);
                if gpa != first.wrapping_add(at - ring.address) {
                    return Err(TranslationError::Discontiguous {
                        addr: ring.address,
                        len: ring.len,
                    });
                }
                page = page.saturating_add(PAGE_SIZE);
            }
            let gpa = start.unwrap_or(ring.address);
            if !self.mem.check_range(
                GuestAddress(gpa),
                usize::try_from(ring.len).unwrap_or(usize::MAX),
            ) {
                return Err(outside);
            }
            found.push(gpa);
        }
        // One entry per live watch: a device reset many times leaves none behind.
        remap
            .watched
            .retain(|w| w.watch.strong_count() > 0 && !w.watch.ptr_eq(&watched.watch));
        remap.watched.push(watched);
        watch.mark_current();
        Ok(found)
    }

    /// Record a fault and send the fault event if due; the error for the device.
    fn fault(&self, source: u16, address: u64, access: Access, reason: u8) -> TranslationError {
        let due = self.faults.lock().unwrap().record(FaultRecord {
            source,
            reason,
            address,
            access,
        });
        self.send("fault", due);
        TranslationError::Fault {
            addr: address,
            reason,
        }
    }

    /// Change how DMA is translated; when the status reads back, no device round still uses
    /// the old way and every device translates its rings again.
    pub(super) fn retranslate(&self, change: impl FnOnce(&mut Remapping)) {
        {
            let mut remap = self.remap.lock().unwrap();
            change(&mut remap);
            remap.mark_stale(|_| true);
        }
        self.drain();
    }
}

/// How the devices behind the unit see it: its translations, a contiguous run at a time, and
/// its faults as DMA errors.
impl AccessPlatform for Iommu {
    fn translate(&self, source: u16, iova: u64, access: Access) -> Result<Translation, DmaError> {
        Ok(Iommu::translate_run(self, source, iova, 1, access)?)
    }

    fn translate_run(
        &self,
        source: u16,
        iova: u64,
        want: u64,
        access: Access,
    ) -> Result<Translation, DmaError> {
        Ok(Iommu::translate_run(self, source, iova, want, access)?)
    }

    fn map_rings(
        &self,
        source: u16,
        watch: &Arc<RingWatch>,
        rings: &[RingArea],
    ) -> Result<Vec<u64>, DmaError> {
        Ok(Iommu::map_rings(self, source, watch, rings)?)
    }

    fn round(&self) -> RwLockReadGuard<'_, ()> {
        self.dma_round()
    }
}
