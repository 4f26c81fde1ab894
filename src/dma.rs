//! The DMA context of a device: every guest-memory access a device makes (rings, buffers) goes
//! through it. It names the requester, applies the Bus Master Enable gate (PCI 3.0 §6.2.2: a
//! function whose command register has bit 2 clear may not issue memory requests) and holds
//! the memory view the device sees: guest-physical memory today, an IOMMU-translated view once
//! the platform has one. Buffers are checked here at access time, not only when a chain is
//! parsed, so a gate closed in between is honoured.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

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
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DmaError {
    /// Bus mastering is off.
    #[error("{0:?} has bus mastering disabled")]
    NotMaster(Requester),
    /// The range is not (entirely) guest memory.
    #[error("{len:#x} bytes at {addr:#x} are outside guest memory")]
    OutsideMemory {
        /// Start.
        addr: u64,
        /// Length.
        len: usize,
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
}

impl DmaContext {
    /// A PCI function's context; it may not master until its Bus Master Enable is set, as at
    /// reset (PCI 3.0 §6.2.2: the command register resets to 0).
    pub fn pci(mem: GuestMemoryMmap, requester_id: u16) -> Self {
        DmaContext {
            requester: Requester::Pci(requester_id),
            master: BusMaster(Arc::new(AtomicBool::new(false))),
            mem,
        }
    }

    /// A platform device's context: always allowed to master.
    pub fn platform(mem: GuestMemoryMmap) -> Self {
        DmaContext {
            requester: Requester::Platform,
            master: BusMaster(Arc::new(AtomicBool::new(true))),
            mem,
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

    /// Check that the device may access `len` bytes at `addr` now.
    pub fn check(&self, addr: GuestAddress, len: usize) -> Result<(), DmaError> {
        let mem = self.memory()?;
        if len == 0 || mem.check_range(addr, len) {
            Ok(())
        } else {
            Err(DmaError::OutsideMemory { addr: addr.0, len })
        }
    }

    /// Read `buf.len()` bytes at `addr`.
    pub fn read(&self, addr: GuestAddress, buf: &mut [u8]) -> Result<(), DmaError> {
        self.check(addr, buf.len())?;
        self.mem
            .read_slice(buf, addr)
            .map_err(|_| DmaError::OutsideMemory {
                addr: addr.0,
                len: buf.len(),
            })
    }

    /// Write `data` at `addr`.
    pub fn write(&self, addr: GuestAddress, data: &[u8]) -> Result<(), DmaError> {
        self.check(addr, data.len())?;
        self.mem
            .write_slice(data, addr)
            .map_err(|_| DmaError::OutsideMemory {
                addr: addr.0,
                len: data.len(),
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
