//! A remapping unit on in-memory guest memory and the routing fakes, programmed through its
//! register page as a driver does, for the tests of the unit and of the devices behind it.

use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::regs::*;
use super::tables::build::Tables;
use super::{Iommu, TranslationError};
use crate::bus::BusDevice;
use crate::dma::{Access, DmaContext};
use crate::fakes::FakeRoutes;
use crate::irq::CommitStrategy;
use crate::logging::DeviceLog;

/// Guest RAM, from 0.
pub const RAM: u64 = 0x10_0000;
/// The root table; the other tables follow it.
pub const ROOT: u64 = 0x1_0000;
/// The invalidation queue (one page).
pub const QUEUE: u64 = 0xf_0000;
/// Where wait descriptors write their status.
pub const STATUS: u64 = 0xe_0000;
/// The source-id of 00:03.0.
pub const SID: u16 = 0x18;
/// The fault event's message.
pub const FAULT_MSI: (u64, u32) = (0xfee0_0000, 0x45);
/// The invalidation event's message.
pub const INVALIDATION_MSI: (u64, u32) = (0xfee0_0000, 0x46);
/// Read and write.
pub const RW: u64 = VTD_PTE_R | VTD_PTE_W;

/// A unit, its memory and what it sent.
pub struct Unit {
    pub iommu: Arc<Iommu>,
    pub routes: Arc<FakeRoutes>,
    pub mem: GuestMemoryMmap,
    /// Descriptors submitted so far (the tail, in descriptors).
    submitted: u64,
}

/// A unit at reset.
pub fn unit() -> Unit {
    unit_with(CommitStrategy::default())
}

/// A unit at reset over routes whose owners follow `strategy`.
pub fn unit_with(strategy: CommitStrategy) -> Unit {
    unit_over(RAM, strategy)
}

/// A unit at reset over `ram` bytes of guest RAM from 0.
pub fn unit_of(ram: u64) -> Unit {
    unit_over(ram, CommitStrategy::default())
}

/// A unit translating through tables at `ROOT`, queued invalidation on, `SID` attached to
/// domain 1: the unit, its tables and the device's page table.
pub fn translating() -> (Unit, Tables, u64) {
    let u = unit();
    let mut t = Tables::new(&u.mem, ROOT);
    u.enable();
    u.enable_queue();
    let pt = t.attach(SID, 1);
    (u, t, pt)
}

fn unit_over(ram: u64, strategy: CommitStrategy) -> Unit {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), ram as usize)]).unwrap();
    let routes = Arc::new(FakeRoutes::with_strategy(strategy));
    let iommu = Arc::new(Iommu::new(
        mem.clone(),
        routes.clone(),
        DeviceLog::new("iommu"),
    ));
    Unit {
        iommu,
        routes,
        mem,
        submitted: 0,
    }
}

impl Unit {
    /// A unit at reset over the same guest memory, its driver's place in the queue kept: what
    /// a restore starts from.
    pub fn successor(&self) -> Unit {
        let routes = Arc::new(FakeRoutes::default());
        let log = DeviceLog::new("iommu");
        Unit {
            iommu: Arc::new(Iommu::new(self.mem.clone(), routes.clone(), log)),
            routes,
            mem: self.mem.clone(),
            submitted: self.submitted,
        }
    }

    pub fn r32(&self, reg: u64) -> u32 {
        let mut b = [0u8; 4];
        self.iommu.read(reg, &mut b);
        u32::from_le_bytes(b)
    }

    pub fn r64(&self, reg: u64) -> u64 {
        let mut b = [0u8; 8];
        self.iommu.read(reg, &mut b);
        u64::from_le_bytes(b)
    }

    pub fn w32(&self, reg: u64, value: u32) {
        self.iommu.write(reg, &value.to_le_bytes());
    }

    pub fn w64(&self, reg: u64, value: u64) {
        self.iommu.write(reg, &value.to_le_bytes());
    }

    /// GCMD as Linux writes it: the bits it keeps on, plus `bit`.
    pub fn command(&self, bit: u32) {
        let kept = self.r32(VTD_GSTS_REG) & (VTD_GCMD_TE | VTD_GCMD_QIE);
        self.w32(VTD_GCMD_REG, kept | bit);
    }

    /// Root table at `ROOT`, latched, translation on, the fault event unmasked.
    pub fn enable(&self) {
        self.w32(VTD_FEDATA_REG, FAULT_MSI.1);
        self.w32(VTD_FEADDR_REG, FAULT_MSI.0 as u32);
        self.w32(VTD_FECTL_REG, 0);
        self.w64(VTD_RTADDR_REG, ROOT);
        self.command(VTD_GCMD_SRTP);
        self.command(VTD_GCMD_TE);
    }

    /// Queued invalidation at `QUEUE` (one page: 256 descriptors), its event unmasked.
    pub fn enable_queue(&self) {
        self.w32(VTD_IEDATA_REG, INVALIDATION_MSI.1);
        self.w32(VTD_IEADDR_REG, INVALIDATION_MSI.0 as u32);
        self.w32(VTD_IECTL_REG, 0);
        self.w64(VTD_IQT_REG, 0);
        self.w64(VTD_IQA_REG, QUEUE);
        self.command(VTD_GCMD_QIE);
    }

    /// Put `descriptors` in the queue after those placed before; returns the tail after them.
    pub fn place(&mut self, descriptors: &[[u64; 2]]) -> u64 {
        for d in descriptors {
            let at = QUEUE + 16 * (self.submitted % 256);
            self.mem.write_obj(d[0], GuestAddress(at)).unwrap();
            self.mem.write_obj(d[1], GuestAddress(at + 8)).unwrap();
            self.submitted += 1;
        }
        16 * (self.submitted % 256)
    }

    /// Put `descriptors` in the queue and hand them over with one IQT write.
    pub fn submit(&mut self, descriptors: &[[u64; 2]]) {
        let tail = self.place(descriptors);
        self.w64(VTD_IQT_REG, tail);
    }

    pub fn translate(&self, iova: u64, access: Access) -> Result<u64, TranslationError> {
        self.iommu.translate(SID, iova, access)
    }

    /// The DMA context of the function `SID` behind the unit, mastering.
    pub fn device(&self) -> DmaContext {
        let dma = DmaContext::pci(self.mem.clone(), SID).behind(self.iommu.clone());
        dma.bus_master().set(true);
        dma
    }

    /// FRCD0's reason, if a fault is recorded.
    pub fn fault_reason(&self) -> Option<u8> {
        let high = self.r64(VTD_FRCD_REG + 8);
        (high & VTD_FRCD_F != 0).then_some((high >> VTD_FRCD_FR_SHIFT) as u8)
    }

    /// Free FRCD0 and clear FSTS.
    pub fn clear_faults(&self) {
        self.w32(VTD_FRCD_REG + 12, (VTD_FRCD_F >> 32) as u32);
        self.w32(VTD_FSTS_REG, VTD_FSTS_PFO | VTD_FSTS_IQE);
    }
}

/// A global IOTLB invalidation descriptor.
pub fn iotlb_global() -> [u64; 2] {
    [VTD_QI_IOTLB_TYPE | VTD_GRAN_GLOBAL << VTD_QI_GRAN_SHIFT, 0]
}

/// A domain-selective IOTLB invalidation descriptor.
pub fn iotlb_domain(domain: u16) -> [u64; 2] {
    [
        VTD_QI_IOTLB_TYPE
            | VTD_GRAN_DOMAIN << VTD_QI_GRAN_SHIFT
            | u64::from(domain) << VTD_QI_DID_SHIFT,
        0,
    ]
}

/// A page-selective IOTLB invalidation descriptor: 2^`mask` pages at `address`.
pub fn iotlb_pages(domain: u16, address: u64, mask: u64) -> [u64; 2] {
    [
        VTD_QI_IOTLB_TYPE
            | VTD_GRAN_PAGE << VTD_QI_GRAN_SHIFT
            | u64::from(domain) << VTD_QI_DID_SHIFT,
        address | mask,
    ]
}

/// A device-selective context-cache invalidation descriptor.
pub fn context_device(source: u16) -> [u64; 2] {
    [
        VTD_QI_CC_TYPE
            | VTD_GRAN_DEVICE << VTD_QI_GRAN_SHIFT
            | u64::from(source) << VTD_QI_CC_SID_SHIFT,
        0,
    ]
}

/// A wait descriptor: status data to `STATUS` if given, an interrupt if asked.
pub fn wait(status: Option<u32>, interrupt: bool) -> [u64; 2] {
    let mut low = VTD_QI_WAIT_TYPE;
    if let Some(data) = status {
        low |= VTD_QI_WAIT_SW | u64::from(data) << VTD_QI_WAIT_DATA_SHIFT;
    }
    if interrupt {
        low |= VTD_QI_WAIT_IF;
    }
    [low, STATUS]
}
