#![no_main]
//! The VT-d remapping unit alone: register accesses of every width at any offset, guest memory
//! poked between them (root, context and page tables, invalidation descriptors, all built by
//! the input), translations, DMA through a device's context and ring mappings, on guest
//! memory with a hole and the in-memory routing fakes. Beyond "no panic" (and no access
//! outside guest memory, which vm-memory would refuse):
//! - right after a context-cache and an IOTLB invalidation (global, domain- or page-selective
//!   with IH clear) that follow a translation and a change to an upper-level entry of its
//!   walk, a translation of a run of pages inside what they named agrees with a
//!   reference walk of the tables (VT-d §3.4.3, §9) page by page: the same pages, or the
//!   same fault reason, so neither the IOTLB nor the paging-structure cache kept anything
//!   stale there (§6.5); the run ends where the pages stop following on; with translation
//!   off, the address itself;
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

/// Two 32 KiB regions with a 32 KiB hole between them, and 2 MiB at 2 MiB for a large page.
const REGIONS: [(GuestAddress, usize); 3] = [
    (GuestAddress(0), 0x8000),
    (GuestAddress(0x1_0000), 0x8000),
    (GuestAddress(0x20_0000), 0x20_0000),
];
/// Source-ids most steps use: 00:03.0, 00:00.0 and 01:00.0; the fourth comes from the input.
const SOURCES: [u16; 3] = [0x18, 0x00, 0x100];
const STEPS: usize = 256;

/// The reference context of `source`: its domain and page table, or the fault reason.
fn reference_context(mem: &GuestMemoryMmap, root: u64, source: u16) -> Result<(u16, u64), u8> {
    let (bus, devfn) = (u64::from(source >> 8), u64::from(source & 0xff));
    let root_entry = read(mem, root.checked_add(16 * bus), VTD_FR_ROOT_TABLE)?;
    if root_entry & 1 == 0 {
        return Err(VTD_FR_ROOT_NOT_PRESENT);
    }
    let contexts = root_entry & !0xfff;
    let low = read(mem, contexts.checked_add(16 * devfn), VTD_FR_CONTEXT_TABLE)?;
    if low & 1 == 0 {
        return Err(VTD_FR_CONTEXT_NOT_PRESENT);
    }
    let high = read(
        mem,
        contexts.checked_add(16 * devfn + 8),
        VTD_FR_CONTEXT_TABLE,
    )?;
    if low & 0xc != 0 || high & 7 != 2 {
        return Err(VTD_FR_CONTEXT_INVALID);
    }
    Ok(((high >> 8) as u16, low & !0xfff))
}

/// A qword of guest memory, or `reason` if it is not RAM.
fn read(mem: &GuestMemoryMmap, at: Option<u64>, reason: u8) -> Result<u64, u8> {
    at.and_then(|a| mem.read_obj::<u64>(GuestAddress(a)).ok())
        .ok_or(reason)
}

/// The reference walk: the page `iova` translates to for `source`, or the fault reason.
fn reference(
    mem: &GuestMemoryMmap,
    root: u64,
    source: u16,
    iova: u64,
    write: bool,
) -> Result<u64, u8> {
    let (_, page_table) = reference_context(mem, root, source)?;
    if iova >= 1 << 48 {
        return Err(VTD_FR_ADDRESS_WIDTH);
    }
    let denied = if write { VTD_FR_WRITE } else { VTD_FR_READ };
    let mut table = page_table;
    let mut allowed = 3;
    let mut size = 0x1000;
    for level in (0..4).rev() {
        let index = (iova >> (12 + 9 * level)) & 0x1ff;
        let entry = read(mem, table.checked_add(8 * index), VTD_FR_PTE)?;
        allowed &= entry & 3;
        if allowed == 0 {
            return Err(denied);
        }
        table = entry & 0x000f_ffff_ffff_f000;
        // PS: a 2 MiB page in a PDE (address bits 20:12 reserved), reserved higher up.
        if level > 0 && entry & 0x80 != 0 {
            if level != 1 || table & 0x1f_f000 != 0 {
                return Err(VTD_FR_PTE_RESERVED);
            }
            size = 0x20_0000;
            break;
        }
    }
    if !mem.check_range(GuestAddress(table), size as usize) {
        return Err(VTD_FR_PTE);
    }
    if allowed & if write { 2 } else { 1 } == 0 {
        return Err(denied);
    }
    Ok(table | iova & (size - 1))
}

/// The address of the entry at `level` (3: PML4E .. 1: PDE) on `iova`'s path, if the
/// entries above it lead there.
fn upper_entry(
    mem: &GuestMemoryMmap,
    root: u64,
    source: u16,
    iova: u64,
    level: u32,
) -> Option<u64> {
    let (_, mut table) = reference_context(mem, root, source).ok()?;
    for above in (level + 1..4).rev() {
        let index = (iova >> (12 + 9 * above)) & 0x1ff;
        table = read(mem, table.checked_add(8 * index), 0).ok()? & 0x000f_ffff_ffff_f000;
    }
    table.checked_add(8 * ((iova >> (12 + 9 * level)) & 0x1ff))
}

/// An upper-level entry `flush_and_compare` rewrites after filling the caches.
struct Poke {
    /// 1 (PDE) to 3 (PML4E).
    level: u32,
    value: u64,
}

/// How `flush_and_compare` invalidates before it compares.
#[derive(Clone, Copy, Debug)]
enum Flush {
    /// Global context-cache and IOTLB invalidations.
    Global,
    /// The source's context, then its domain's IOTLB entries and upper-level entries.
    Domain,
    /// The source's context, then the 2^mask pages around the IOVA, IH clear: their
    /// IOTLB entries and the upper-level entries of their regions.
    Pages(u64),
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

    /// Latch RTADDR, invalidate what `flush` names, then translate a run of `want` bytes
    /// inside what was invalidated: every page of the run must be the reference walk's (the
    /// caches kept nothing stale there), the first one's fault its fault, and the run must
    /// end at `want` or at a page that does not follow on. With translation off, the
    /// address itself.
    fn flush_and_compare(
        &self,
        source: u16,
        iova: u64,
        write: bool,
        flush: Flush,
        want: u64,
        poke: Poke,
    ) {
        let kept = self.read(VTD_GSTS_REG, 4) & u64::from(VTD_GCMD_TE | VTD_GCMD_QIE);
        self.write(VTD_GCMD_REG, 4, kept | u64::from(VTD_GCMD_SRTP));
        let root = self.read(VTD_RTADDR_REG, 8);
        // Fill the caches from the source's context as it is now, then change an upper-level
        // entry of the walk behind their back: the invalidation must make the change seen,
        // without the context-cache invalidation unless the change was to the context (a
        // device-selective one drops the domain's upper-level entries as well).
        self.invalidate_context(VTD_GRAN_DEVICE, source);
        let _ = self.translate(source, iova, write);
        let before = reference_context(&self.mem, root, source);
        if let Some(at) = upper_entry(&self.mem, root, source, iova, poke.level) {
            let _ = self.mem.write_obj(poke.value, GuestAddress(at));
        }
        if reference_context(&self.mem, root, source) != before {
            self.invalidate_context(VTD_GRAN_DEVICE, source);
        }
        let want = self.invalidate(root, source, iova, flush, want);
        let access = if write { Access::Write } else { Access::Read };
        let got = self.iommu.translate_run(source, iova, want, access);
        if kept & u64::from(VTD_GCMD_TE) == 0 {
            assert_eq!(got.map(|t| t.address), Ok(iova), "untranslated while off");
            return;
        }
        let expected = reference(&self.mem, root, source, iova, write);
        let run = match (expected, got) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a, b.address, "{source:#x} {iova:#x} {flush:?}");
                b
            }
            (Err(r), Err(TranslationError::Fault { reason, .. })) => {
                assert_eq!(r, reason, "{source:#x} {iova:#x} {flush:?}");
                return;
            }
            (e, g) => {
                panic!("{source:#x} {iova:#x} write {write} {flush:?}: reference {e:?}, unit {g:?}")
            }
        };
        let first = 0x1000 - iova % 0x1000;
        assert!(
            self.mem
                .check_range(GuestAddress(run.address), run.len as usize),
            "{run:x?} is guest RAM"
        );
        assert!(
            run.len >= first && (run.len - first) % 0x1000 == 0,
            "{run:?}"
        );
        assert!(
            run.len == first || run.len - 0x1000 < want + 0x1f_f000,
            "{run:?} for {want:#x}: no page past the one where it ends"
        );
        let mut at = first;
        while at <= run.len && at < want {
            let follows = reference(&self.mem, root, source, iova + at, write);
            assert_eq!(
                follows == Ok(run.address + at),
                at < run.len,
                "{source:#x} {iova:#x}+{at:#x} {flush:?}: {follows:x?} after {run:x?}"
            );
            at += 0x1000;
        }
    }

    /// Invalidate the IOTLB (and for a global flush the context cache) as `flush` says for
    /// `iova` and `source`'s domain (globally when its context is not valid); returns `want`
    /// cut to the pages invalidated.
    fn invalidate(&self, root: u64, source: u16, iova: u64, flush: Flush, want: u64) -> u64 {
        let iotlb = |granularity: u64, domain: u16| {
            VTD_IOTLB_IVT
                | granularity << VTD_IOTLB_IIRG_SHIFT
                | u64::from(domain) << VTD_IOTLB_DID_SHIFT
        };
        let context = reference_context(&self.mem, root, source);
        let (flush, domain) = match context {
            Ok((domain, _)) => (flush, domain),
            Err(_) => (Flush::Global, 0),
        };
        let (iotlb, want) = match flush {
            Flush::Global => {
                self.invalidate_context(VTD_GRAN_GLOBAL, source);
                (iotlb(VTD_GRAN_GLOBAL, 0), want)
            }
            Flush::Domain => (iotlb(VTD_GRAN_DOMAIN, domain), want),
            Flush::Pages(mask) => {
                let end = ((iova >> 12 | ((1 << mask) - 1)) + 1) << 12;
                self.write(VTD_IVA_REG, 8, iova & !0xfff | mask);
                let want = want.min(end.wrapping_sub(iova));
                (iotlb(VTD_GRAN_PAGE, domain), want)
            }
        };
        self.write(VTD_IOTLB_REG, 8, iotlb);
        want
    }

    /// A register-based context-cache invalidation, device-selective for `source` or global.
    fn invalidate_context(&self, granularity: u64, source: u16) {
        self.write(
            VTD_CCMD_REG,
            8,
            VTD_CCMD_ICC
                | granularity << VTD_CCMD_CIRG_SHIFT
                | u64::from(source) << VTD_CCMD_SID_SHIFT,
        );
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
                // Now and then in the large region, to build tables there too.
                let at = if flags & 6 == 6 { at + 0x20_0000 } else { at };
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
                let want = u64::from(u16::from_le_bytes(input.bytes::<2>()));
                let flush = match flags >> 1 & 3 {
                    0 => Flush::Global,
                    1 => Flush::Domain,
                    _ => Flush::Pages(u64::from(flags >> 3) % (VTD_MAMV + 1)),
                };
                let [level, ..] = input.bytes::<1>();
                let poke = Poke {
                    level: 1 + u32::from(level) % 3,
                    value: u64::from_le_bytes(input.bytes::<8>()),
                };
                f.flush_and_compare(source, iova, write, flush, want, poke);
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
