//! The DMA context of a device: every guest-memory access a device makes (rings, buffers) goes
//! through it. It names the requester, applies the Bus Master Enable gate (PCI 3.0 §6.2.2: a
//! function whose command register has bit 2 clear may not issue memory requests) and holds
//! the memory view the device sees: guest-physical memory, or, for a PCI function behind the
//! machine's IOMMU whose driver negotiated VIRTIO_F_ACCESS_PLATFORM, bus addresses translated
//! by the unit with the access's permission, one contiguous run at a time (a buffer may span
//! pages that are not contiguous in guest memory). Buffers are checked here at access time, not only when a
//! chain is parsed, so a gate closed in between is honoured and a page unmapped in between
//! faults. The unit is seen only through [`AccessPlatform`].
//!
//! Two ways in: [`DmaContext::read`] and [`DmaContext::write`] copy (the reference, and what
//! small accesses use), and [`DmaContext::resolve`] turns a range into the host pieces behind
//! it, checked once, for a backend to use in place ([`Segments`]).

mod platform;
mod segments;

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLockReadGuard};

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

pub use platform::{Access, AccessPlatform, RingArea, RingWatch, Translation};
use segments::RegionMap;
pub use segments::{IOV_MAX, Segments};

/// Who issues a device's memory requests: a PCI bus/device/function, or a platform device
/// (virtio-mmio) that has no requester ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requester {
    /// A PCI function: bus << 8 | device << 3 | function (PCIe 4.0 §2.2.6.2).
    Pci(u16),
    /// A platform device, always allowed to master.
    Platform,
}

/// Why a device may not make an access.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum DmaError {
    /// Bus mastering is off.
    #[error("{0:?} has bus mastering disabled")]
    NotMaster(Requester),
    /// The range is not (entirely) guest memory.
    #[error("{len:#x} bytes at {addr:#x} are outside guest memory")]
    OutsideMemory {
        /// The address the device asked for.
        addr: u64,
        /// How many bytes from there.
        len: usize,
    },
    /// The IOMMU blocked the access and recorded the fault: the device completes the
    /// request with nothing transferred and goes on.
    #[error("the IOMMU blocked an access at bus address {addr:#x} (fault reason {reason:#x})")]
    Fault {
        /// The bus address.
        addr: u64,
        /// The fault reason (`VTD_FR_*`).
        reason: u8,
    },
    /// A ring that is not one range of guest-physical memory (virtio-queue needs it to be).
    #[error("the ring of {len:#x} bytes at bus address {addr:#x} is not physically contiguous")]
    Discontiguous {
        /// The ring's bus address.
        addr: u64,
        /// The ring's size in bytes.
        len: u64,
    },
}

/// The Bus Master Enable bit as the device sees it, shared with the function's command
/// register.
#[derive(Clone, Debug)]
pub struct BusMaster(Arc<AtomicBool>);

impl BusMaster {
    /// Set or clear the gate (the guest wrote the command register).
    pub fn set(&self, enabled: bool) {
        self.0.store(enabled, Ordering::SeqCst);
    }

    /// Whether the device may master.
    pub fn enabled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// What a device uses to reach guest memory.
#[derive(Clone, Debug)]
pub struct DmaContext {
    requester: Requester,
    master: BusMaster,
    mem: GuestMemoryMmap,
    /// Where `mem`'s regions are, for bounds checks and for resolving buffers.
    regions: RegionMap,
    /// The unit that translates this PCI function's requests, if any.
    platform: Option<Arc<dyn AccessPlatform>>,
}

impl DmaContext {
    /// A PCI function's context; it may not master until its Bus Master Enable is set, as at
    /// reset (PCI 3.0 §6.2.2: the command register resets to 0).
    pub fn pci(mem: GuestMemoryMmap, requester_id: u16) -> Self {
        DmaContext {
            requester: Requester::Pci(requester_id),
            master: BusMaster(Arc::new(AtomicBool::new(false))),
            regions: RegionMap::of(&mem),
            mem,
            platform: None,
        }
    }

    /// The same function with its requests translated by `unit` (the machine's IOMMU), by its
    /// requester ID as source-id. A platform device has no source-id and stays untranslated.
    pub fn behind(mut self, unit: Arc<dyn AccessPlatform>) -> Self {
        if let Requester::Pci(_) = self.requester {
            self.platform = Some(unit);
        }
        self
    }

    /// The same device without translation: its driver did not negotiate
    /// VIRTIO_F_ACCESS_PLATFORM, so it gives guest-physical addresses (virtio 1.2 §6.1).
    pub fn untranslated(&self) -> Self {
        DmaContext {
            platform: None,
            ..self.clone()
        }
    }

    /// Whether addresses are bus addresses translated by an IOMMU.
    pub fn translated(&self) -> bool {
        self.platform.is_some()
    }

    /// A round of DMA (one round of queue work) while translated: the IOMMU completes no
    /// invalidation until it is dropped ([`AccessPlatform::round`]).
    pub fn round(&self) -> Option<RwLockReadGuard<'_, ()>> {
        self.platform.as_ref().map(|unit| unit.round())
    }

    /// The guest-physical addresses of a translated device's `rings`, each physically
    /// contiguous; `watch` then stands for their pages. Untranslated, the addresses as given.
    pub fn map_rings(
        &self,
        watch: &Arc<RingWatch>,
        rings: &[RingArea],
    ) -> Result<Vec<GuestAddress>, DmaError> {
        let found = match (&self.platform, self.requester) {
            (Some(unit), Requester::Pci(source)) => unit.map_rings(source, watch, rings)?,
            _ => rings.iter().map(|r| r.address).collect(),
        };
        Ok(found.into_iter().map(GuestAddress).collect())
    }

    /// A platform device's context: always allowed to master.
    pub fn platform(mem: GuestMemoryMmap) -> Self {
        DmaContext {
            requester: Requester::Platform,
            master: BusMaster(Arc::new(AtomicBool::new(true))),
            regions: RegionMap::of(&mem),
            mem,
            platform: None,
        }
    }

    /// The Bus Master Enable gate, for the function's command register.
    pub fn bus_master(&self) -> &BusMaster {
        &self.master
    }

    /// The memory view for ring accesses (virtio-queue walks rings through a `GuestMemory`),
    /// if the device may master now.
    pub fn memory(&self) -> Result<&GuestMemoryMmap, DmaError> {
        if self.master.enabled() {
            Ok(&self.mem)
        } else {
            Err(DmaError::NotMaster(self.requester))
        }
    }

    /// Check that the device may access `len` bytes at `addr` now. Translated addresses are
    /// checked when the device accesses them: an unmapped page faults there.
    pub fn check(&self, addr: GuestAddress, len: usize) -> Result<(), DmaError> {
        self.memory()?;
        if len == 0 || self.translated() || self.regions.contains(addr.0, len as u64) {
            Ok(())
        } else {
            Err(DmaError::OutsideMemory { addr: addr.0, len })
        }
    }

    /// Call `copy` with the guest-physical address of each piece of the `len` bytes at `addr`
    /// and the piece's range in them: one piece untranslated, one per translation (a
    /// contiguous run) translated. The gate is checked first; bounds are `copy`'s to check.
    fn pieces(
        &self,
        addr: GuestAddress,
        len: usize,
        access: Access,
        mut copy: impl FnMut(GuestAddress, Range<usize>) -> bool,
    ) -> Result<(), DmaError> {
        self.memory()?;
        let outside = || DmaError::OutsideMemory { addr: addr.0, len };
        let (Some(unit), Requester::Pci(source)) = (&self.platform, self.requester) else {
            return copy(addr, 0..len).then_some(()).ok_or_else(outside);
        };
        let mut done = 0;
        while done < len {
            let iova = addr.0.checked_add(done as u64).ok_or_else(outside)?;
            let at = unit.translate_run(source, iova, (len - done) as u64, access)?;
            let piece = usize::try_from(at.len).map_or(len - done, |n| n.min(len - done));
            if !copy(GuestAddress(at.address), done..done + piece) {
                return Err(outside());
            }
            done += piece;
        }
        Ok(())
    }

    /// Append the host pieces of the `len` bytes at `addr` to `out`, for an access of kind
    /// `access`: the gate, the bounds and (translated) the unit's permission are checked once,
    /// here; on an error nothing is appended. The pieces may be used until `out` is cleared;
    /// the caller holds the round of DMA ([`DmaContext::round`]) while it uses them, so no
    /// invalidation completes in between.
    pub fn resolve(
        &self,
        addr: GuestAddress,
        len: usize,
        access: Access,
        out: &mut Segments,
    ) -> Result<(), DmaError> {
        out.bind(&self.mem, &self.regions);
        let mark = out.pieces();
        let resolved = self.pieces(addr, len, access, |at, piece| {
            out.push_guest(at.0, piece.len())
        });
        if resolved.is_err() {
            out.truncate(mark);
        }
        resolved
    }

    /// Read `buf.len()` bytes at `addr`.
    pub fn read(&self, addr: GuestAddress, buf: &mut [u8]) -> Result<(), DmaError> {
        let len = buf.len();
        self.check(addr, len)?;
        self.pieces(addr, len, Access::Read, |at, piece| {
            self.mem.read_slice(&mut buf[piece], at).is_ok()
        })
    }

    /// Write `data` at `addr`.
    pub fn write(&self, addr: GuestAddress, data: &[u8]) -> Result<(), DmaError> {
        self.check(addr, data.len())?;
        self.pieces(addr, data.len(), Access::Write, |at, piece| {
            self.mem.write_slice(&data[piece], at).is_ok()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap()
    }

    #[test]
    fn a_pci_function_masters_only_with_bus_master_enable() {
        let dma = DmaContext::pci(memory(), 0x18);
        let mut b = [0u8; 4];
        assert_eq!(
            dma.read(GuestAddress(0), &mut b),
            Err(DmaError::NotMaster(Requester::Pci(0x18)))
        );
        assert!(dma.write(GuestAddress(0), &[1]).is_err());
        dma.bus_master().set(true);
        dma.write(GuestAddress(0x10), &[7, 8]).unwrap();
        dma.read(GuestAddress(0x10), &mut b[..2]).unwrap();
        assert_eq!(&b[..2], &[7, 8]);
        dma.bus_master().set(false);
        assert!(dma.memory().is_err(), "the gate is checked at every access");
    }

    #[test]
    fn accesses_outside_guest_memory_are_refused() {
        let dma = DmaContext::platform(memory());
        let mut b = [0u8; 8];
        assert!(matches!(
            dma.read(GuestAddress(0xffc), &mut b),
            Err(DmaError::OutsideMemory { .. })
        ));
        assert!(dma.write(GuestAddress(u64::MAX - 2), &[0; 4]).is_err());
        assert!(dma.check(GuestAddress(0x5000), 0).is_ok(), "empty is fine");
    }
}
