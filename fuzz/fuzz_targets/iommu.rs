#![no_main]
//! The VT-d remapping unit alone: register accesses of every width at any offset, guest memory
//! poked between them (root, context and page tables, invalidation descriptors, all built by
//! the input), translations, DMA through a device's context and ring mappings, on guest
//! memory with a hole and the in-memory routing fakes. Beyond "no panic" (and no access
//! outside guest memory, which vm-memory would refuse):
//! - right after a global context-cache and IOTLB invalidation, a translation agrees with a
//!   reference walk of the tables (VT-d §3.4.3, §9): the same page, or the same fault reason;
//!   with translation off, the address itself;
//! - a successful translation lands in guest RAM;
//! - the queue runs to the tail inside the IQT write (IQH = IQT) unless FSTS.IQE stopped it,
//!   and IQH stays a multiple of 16;
//! - FSTS.PPF is set exactly while FRCD0 holds a fault, and no other FSTS bit than PFO, PPF
//!   and IQE is ever set;
//! - every message the unit sends, and every device message it remaps (VT-d §5.1: remappable
//!   requests through IRTEs the input writes, its type-4 invalidations among the descriptors),
//!   is a valid MSI.
//!
//! Each input is at most 256 steps.

use std::sync::Arc;

use exitless::bus::BusDevice;
use exitless::dma::{Access, DmaContext, RingArea, RingWatch};
use exitless::fakes::FakeRoutes;
use exitless::iommu::regs::*;
use exitless::iommu::{Iommu, TranslationError};
use exitless::irq::msi::is_valid_message;
use exitless::logging::DeviceLog;
use libfuzzer_sys::fuzz_target;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

mod common;
use common::Input;

/// Two 32 KiB regions with a 32 KiB hole between them.
const REGIONS: [(GuestAddress, usize); 2] =
    [(GuestAddress(0), 0x8000), (GuestAddress(0x1_0000), 0x8000)];
/// Source-ids most steps use: 00:03.0, 00:00.0 and 01:00.0; the fourth comes from the input.
const SOURCES: [u16; 3] = [0x18, 0x00, 0x100];
const STEPS: usize = 256;

/// The reference walk: the page `iova` translates to for `source`, or the fault reason.
fn reference(
    mem: &GuestMemoryMmap,
    root: u64,
    source: u16,
    iova: u64,
    write: bool,
) -> Result<u64, u8> {
    let read = |at: Option<u64>, reason: u8| {
        at.and_then(|a| mem.read_obj::<u64>(GuestAddress(a)).ok())
            .ok_or(reason)
    };
    let (bus, devfn) = (u64::from(source >> 8), u64::from(source & 0xff));
    let root_entry = read(root.checked_add(16 * bus), VTD_FR_ROOT_TABLE)?;
    if root_entry & 1 == 0 {
        return Err(VTD_FR_ROOT_NOT_PRESENT);
    }
    let contexts = root_entry & !0xfff;
    let low = read(contexts.checked_add(16 * devfn), VTD_FR_CONTEXT_TABLE)?;
    if low & 1 == 0 {
        return Err(VTD_FR_CONTEXT_NOT_PRESENT);
    }
    let high = read(contexts.checked_add(16 * devfn + 8), VTD_FR_CONTEXT_TABLE)?;
    if low & 0xc != 0 || high & 7 != 2 {
        return Err(VTD_FR_CONTEXT_INVALID);
    }
    if iova >= 1 << 48 {
        return Err(VTD_FR_ADDRESS_WIDTH);
    }
    let denied = if write { VTD_FR_WRITE } else { VTD_FR_READ };
    let mut table = low & !0xfff;
    let mut allowed = 3;
    for level in (0..4).rev() {
        let index = (iova >> (12 + 9 * level)) & 0x1ff;
        let entry = read(table.checked_add(8 * index), VTD_FR_PTE)?;
        allowed &= entry & 3;
        if allowed == 0 {
            return Err(denied);
        }
        if level > 0 && entry & 0x80 != 0 {
            return Err(VTD_FR_PTE_RESERVED);
        }
        table = entry & 0x000f_ffff_ffff_f000;
    }
    if !mem.check_range(GuestAddress(table), 0x1000) {
        return Err(VTD_FR_PTE);
    }
    if allowed & if write { 2 } else { 1 } == 0 {
        return Err(denied);
    }
    Ok(table | iova & 0xfff)
}

struct Fuzz {
    mem: GuestMemoryMmap,
    iommu: Arc<Iommu>,
    routes: Arc<FakeRoutes>,
    dma: DmaContext,
}

impl Fuzz {
    fn read(&self, offset: u64, len: usize) -> u64 {
        let mut b = [0u8; 8];
        self.iommu.read(offset, &mut b[..len]);
        u64::from_le_bytes(b)
    }

    fn write(&self, offset: u64, len: usize, value: u64) {
        self.iommu.write(offset, &value.to_le_bytes()[..len]);
    }

    fn source(input: &mut Input) -> u16 {
        let [pick, lo, hi] = input.bytes::<3>();
        SOURCES
            .get(usize::from(pick % 4))
            .copied()
            .unwrap_or(u16::from_le_bytes([lo, hi]))
    }

    /// Translate, then check what can be checked without knowing the caches.
    fn translate(&self, source: u16, iova: u64, write: bool) -> Result<u64, TranslationError> {
        let access = if write { Access::Write } else { Access::Read };
        let got = self.iommu.translate(source, iova, access);
        if let Ok(gpa) = got
            && self.read(VTD_GSTS_REG, 4) & u64::from(VTD_GCMD_TE) != 0
        {
            assert!(
                self.mem.check_range(GuestAddress(gpa & !0xfff), 0x1000),
                "translated to {gpa:#x}, outside guest RAM"
            );
        }
        got
    }

    /// Latch RTADDR, drop every cached context and translation, then translate: the result
    /// must be the reference walk's.
    fn flush_and_compare(&self, source: u16, iova: u64, write: bool) {
        let kept = self.read(VTD_GSTS_REG, 4) & u64::from(VTD_GCMD_TE | VTD_GCMD_QIE);
        self.write(VTD_GCMD_REG, 4, kept | u64::from(VTD_GCMD_SRTP));
        self.write(
            VTD_CCMD_REG,
            8,
            VTD_CCMD_ICC | VTD_GRAN_GLOBAL << VTD_CCMD_CIRG_SHIFT,
        );
        self.write(
            VTD_IOTLB_REG,
            8,
            VTD_IOTLB_IVT | VTD_GRAN_GLOBAL << VTD_IOTLB_IIRG_SHIFT,
        );
        let root = self.read(VTD_RTADDR_REG, 8);
        let got = self.translate(source, iova, write);
        if kept & u64::from(VTD_GCMD_TE) == 0 {
            assert_eq!(got, Ok(iova), "untranslated while translation is off");
            return;
        }
        let expected = reference(&self.mem, root, source, iova, write);
        match (expected, got) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{source:#x} {iova:#x}"),
            (Err(r), Err(TranslationError::Fault { reason, .. })) => {
                assert_eq!(r, reason, "{source:#x} {iova:#x}")
            }
            (e, g) => panic!("{source:#x} {iova:#x} write {write}: reference {e:?}, unit {g:?}"),
        }
    }

    /// The invariants of the register state.
    fn check_status(&self, wrote_tail: bool) {
        let fsts = self.read(VTD_FSTS_REG, 4) as u32;
        assert_eq!(
            fsts & !(VTD_FSTS_PFO | VTD_FSTS_PPF | VTD_FSTS_IQE),
            0,
            "FSTS {fsts:#x}"
        );
        let recorded = self.read(VTD_FRCD_REG + 8, 8) & VTD_FRCD_F != 0;
        assert_eq!(fsts & VTD_FSTS_PPF != 0, recorded, "PPF and FRCD0.F");
        let head = self.read(VTD_IQH_REG, 8);
        assert_eq!(head % 16, 0, "IQH {head:#x}");
        let running = self.read(VTD_GSTS_REG, 4) & u64::from(VTD_GCMD_QIE) != 0;
        if wrote_tail && running && fsts & VTD_FSTS_IQE == 0 {
            assert_eq!(head, self.read(VTD_IQT_REG, 8), "the queue ran to the tail");
        }
        for (address, data) in self.routes.injected() {
            assert!(
                is_valid_message(address, data),
                "sent ({address:#x}, {data:#x})"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let mem = GuestMemoryMmap::from_ranges(&REGIONS).unwrap();
    let routes = Arc::new(FakeRoutes::default());
    let iommu = Arc::new(Iommu::new(
        mem.clone(),
        routes.clone(),
        DeviceLog::new("fuzz"),
    ));
    let dma = DmaContext::pci(mem.clone(), SOURCES[0]).behind(iommu.clone());
    dma.bus_master().set(true);
    let f = Fuzz {
        mem,
        iommu,
        routes,
        dma,
    };
    let watch = Arc::new(RingWatch::default());
    for _ in 0..STEPS {
        if input.0.is_empty() {
            break;
        }
        let [kind, flags] = input.bytes::<2>();
        let write = flags & 1 != 0;
        let mut wrote_tail = false;
        match kind % 8 {
            0 => {
                let offset = u64::from(u16::from_le_bytes(input.bytes::<2>()) & 0xfff);
                let len = [4, 8, 1, 2][usize::from(flags >> 1) % 4];
                let value = u64::from_le_bytes(input.bytes::<8>());
                f.write(offset, len, value);
                wrote_tail = offset == VTD_IQT_REG && len >= 4;
            }
            1 => {
                let offset = u64::from(u16::from_le_bytes(input.bytes::<2>()) & 0xfff);
                f.read(offset, [4, 8, 1, 2][usize::from(flags >> 1) % 4]);
            }
            2 => {
                // A qword of guest memory, in either region.
                let at = u64::from(u16::from_le_bytes(input.bytes::<2>()) & 0xfff8);
                let at = if at < 0x8000 { at } else { at + 0x8000 };
                let value = u64::from_le_bytes(input.bytes::<8>());
                f.mem.write_obj(value, GuestAddress(at)).unwrap();
            }
            3 => {
                let source = Fuzz::source(&mut input);
                let iova = u64::from_le_bytes(input.bytes::<8>());
                let _ = f.translate(source, iova, write);
            }
            4 => {
                let iova = u64::from_le_bytes(input.bytes::<8>());
                let len = usize::from(u16::from_le_bytes(input.bytes::<2>()) % 0x3000);
                let mut buf = vec![0xa5; len];
                let _ = if write {
                    f.dma.write(GuestAddress(iova), &buf)
                } else {
                    f.dma.read(GuestAddress(iova), &mut buf)
                };
            }
            5 => {
                let source = Fuzz::source(&mut input);
                let iova = u64::from_le_bytes(input.bytes::<8>());
                f.flush_and_compare(source, iova, write);
            }
            7 => {
                // A device's message in the interrupt window, remappable or not.
                let source = Fuzz::source(&mut input);
                let low = u32::from_le_bytes(input.bytes::<4>()) & 0xf_ffff;
                let data = u32::from_le_bytes(input.bytes::<4>());
                let routes = f.iommu.interrupt_routes(source);
                let _ = routes.signal_msi(0xfee0_0000 | u64::from(low), data);
            }
            _ => {
                let rings: Vec<RingArea> = (0..1 + flags % 3)
                    .map(|_| RingArea {
                        address: u64::from_le_bytes(input.bytes::<8>()),
                        len: u64::from(u16::from_le_bytes(input.bytes::<2>())),
                        access: if input.bytes::<1>()[0] & 1 != 0 {
                            Access::Write
                        } else {
                            Access::Read
                        },
                    })
                    .collect();
                if let Ok(found) = f.iommu.map_rings(SOURCES[0], &watch, &rings) {
                    for (ring, gpa) in rings.iter().zip(found) {
                        let len = usize::try_from(ring.len).unwrap();
                        assert!(
                            f.mem.check_range(GuestAddress(gpa), len),
                            "ring at {gpa:#x}"
                        );
                    }
                }
            }
        }
        f.check_status(wrote_tail);
    }
});
