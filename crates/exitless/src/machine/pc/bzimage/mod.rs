//! A Linux bzImage loader: the x86 boot protocol's 64-bit entry (Linux
//! Documentation/arch/x86/boot.rst, "64-bit Boot Protocol").
//!
//! The file is the real-mode setup (`setup_sects` + 1 sectors) followed by the protected-mode
//! kernel, which is loaded at 1 MiB and entered at its `startup_64`, 0x200 bytes in, in long
//! mode on identity-mapping page tables, with RSI = the `boot_params` ("zero page"). The zero
//! page holds the setup header copied from the file (boot.rst: "the setup header ... should be
//! loaded into struct boot_params"), the e820 map, the command line's address, the initrd's.
//!
//! The checks and the placement are written here, not taken from rust-vmm's `linux-loader`:
//! every header field is refused with its own one-line error before anything is written, and
//! the zero page, command line and initrd go where this machine's memory map
//! ([`memmap`](super::memmap)) and the identity page tables leave room. The offsets are
//! linux-loader's translation of bootparam.h.

use std::mem::offset_of;

use linux_loader::bootparam::{
    E820_MAX_ENTRIES_ZEROPAGE, boot_e820_entry, boot_params, setup_header,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::machine::loader::file::{ImageFile, ReadError};
use crate::machine::loader::long_mode;
use crate::machine::loader::{CpuMode, EntryState, LoadError, Loader, MachineInfo};
use crate::machine::pc::boot::{place_initrd, write_acpi};
use crate::machine::pc::memmap::{HIGH_RAM_START, e820};
use crate::vm::boot;

// Offsets in the file's first sector and in `struct boot_params`: the setup header is at the
// same offset in both (boot.rst, "The real-mode kernel header"; arch/x86/include/uapi/asm/
// bootparam.h).
/// The setup header's first byte.
const SETUP_HEADER: usize = offset_of!(boot_params, hdr);
/// A setup header field's offset.
macro_rules! hdr {
    ($field:ident) => {
        SETUP_HEADER + offset_of!(setup_header, $field)
    };
}
const SETUP_SECTS: usize = hdr!(setup_sects);
/// The byte that says where the header ends: the offset of the short jump at 0x200, its
/// second byte; the header ends at 0x202 plus it (boot.rst, "the end of the setup header").
const HEADER_JUMP_OFFSET: usize = hdr!(jump) + 1;
const HEADER_MAGIC_AT: usize = hdr!(header);
/// "HdrS": a kernel with a boot-protocol header (boot.rst, field `header`).
pub const HEADER_MAGIC: [u8; 4] = *b"HdrS";
const VERSION: usize = hdr!(version);
const TYPE_OF_LOADER: usize = hdr!(type_of_loader);
const LOADFLAGS: usize = hdr!(loadflags);
const RAMDISK_IMAGE: usize = hdr!(ramdisk_image);
const RAMDISK_SIZE: usize = hdr!(ramdisk_size);
const CMD_LINE_PTR: usize = hdr!(cmd_line_ptr);
const INITRD_ADDR_MAX: usize = hdr!(initrd_addr_max);
const XLOADFLAGS: usize = hdr!(xloadflags);
const CMDLINE_SIZE: usize = hdr!(cmdline_size);
const INIT_SIZE: usize = hdr!(init_size);
// boot_params fields outside the setup header.
const ACPI_RSDP_ADDR: usize = offset_of!(boot_params, acpi_rsdp_addr);
const E820_ENTRIES: usize = offset_of!(boot_params, e820_entries);
const E820_TABLE: usize = offset_of!(boot_params, e820_table);
/// Where the setup header must end: `boot_params.edd_mbr_sig_buffer` follows it.
const SETUP_HEADER_MAX_END: usize = offset_of!(boot_params, edd_mbr_sig_buffer);
/// `struct boot_params` is one page.
const BOOT_PARAMS_SIZE: usize = size_of::<boot_params>();
/// `struct boot_e820_entry`: addr, size (u64), type (u32), packed.
const E820_ENTRY_SIZE: usize = size_of::<boot_e820_entry>();
// The offsets as boot.rst's table gives them.
const _: () = assert!(
    SETUP_SECTS == 0x1f1
        && HEADER_JUMP_OFFSET == 0x201
        && HEADER_MAGIC_AT == 0x202
        && VERSION == 0x206
        && TYPE_OF_LOADER == 0x210
        && LOADFLAGS == 0x211
        && RAMDISK_IMAGE == 0x218
        && RAMDISK_SIZE == 0x21c
        && CMD_LINE_PTR == 0x228
        && INITRD_ADDR_MAX == 0x22c
        && XLOADFLAGS == 0x236
        && CMDLINE_SIZE == 0x238
        && INIT_SIZE == 0x260
        && ACPI_RSDP_ADDR == 0x070
        && E820_ENTRIES == 0x1e8
        && E820_TABLE == 0x2d0
        && SETUP_HEADER_MAX_END == 0x290
        && BOOT_PARAMS_SIZE == 0x1000
        && E820_ENTRY_SIZE == 20
);

/// loadflags bit 0: the protected-mode code loads at 0x100000.
const LOADED_HIGH: u8 = 1 << 0;
/// xloadflags bit 0: the kernel has the 64-bit entry point at 0x200 (protocol 2.12).
const XLF_KERNEL_64: u16 = 1 << 0;
/// The oldest protocol this loader takes: 2.12 is the first with `xloadflags`, without which
/// nothing says the kernel has a 64-bit entry point (it also has 2.06's `cmdline_size` and
/// 2.10's `init_size`).
const MIN_VERSION: u16 = 0x020c;
/// "Undefined" boot loader: no ID assigned (boot.rst, `type_of_loader`).
const LOADER_UNDEFINED: u8 = 0xff;
/// startup_64's offset in the protected-mode kernel (boot.rst, "64-bit Boot Protocol").
const ENTRY_64_OFFSET: u64 = 0x200;

/// Where the protected-mode kernel goes (LOADED_HIGH).
const KERNEL_ADDR: u64 = HIGH_RAM_START;
/// The zero page: between the identity page tables' PDPT (0x6000) and page directories
/// (0x8000) that `machine::loader::long_mode::write_tables` writes.
const BOOT_PARAMS_ADDR: u64 = 0x7000;
/// The command line, in conventional memory clear of the page tables.
const CMDLINE_ADDR: u64 = 0x2_0000;
/// The most command line the area below the EBDA takes.
const CMDLINE_ROOM: u64 = 0x7_0000;
/// A stack for the entry (startup_64 sets its own at once): below the command line.
const STACK_TOP: u64 = CMDLINE_ADDR;

/// Why a file is not a bzImage this machine can boot.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BzImageError {
    /// Too short for a setup header.
    #[error("the bzImage is {0} bytes: too short for its setup header")]
    Truncated(usize),
    /// No "HdrS".
    #[error("not a bzImage: no \"HdrS\" at offset 0x202")]
    NoMagic,
    /// A protocol older than the 64-bit entry.
    #[error(
        "boot protocol {}.{:02}: exitless needs 2.12 or later (xloadflags, the 64-bit entry)",
        .0 >> 8, .0 & 0xff
    )]
    OldProtocol(u16),
    /// Not loadable at 1 MiB.
    #[error("loadflags {0:#x} lack LOADED_HIGH: a zImage for low memory, not a bzImage")]
    NotLoadedHigh(u8),
    /// No 64-bit entry point.
    #[error("xloadflags {0:#x} lack XLF_KERNEL_64: the kernel has no 64-bit entry point")]
    No64BitEntry(u16),
    /// A header (from the jump at 0x200 to its target) too short for the fields read here.
    #[error(
        "not a kernel exitless boots: its setup header ends at {0:#x}, before the fields of boot protocol 2.12 (to {min:#x})",
        min = INIT_SIZE + 4
    )]
    HeaderTooShort(usize),
    /// The setup header claims more than the file has.
    #[error(
        "the setup ({setup} bytes) or its header (to {header_end:#x}) runs past the {len}-byte file"
    )]
    SetupTruncated {
        /// Bytes of setup: (setup_sects + 1) * 512.
        setup: usize,
        /// One past the header's last byte.
        header_end: usize,
        /// The file's length.
        len: usize,
    },
    /// A command line with a NUL.
    #[error("the command line contains a NUL byte")]
    CmdlineNul,
    /// A command line longer than the kernel takes.
    #[error("the command line is {len} bytes; this kernel takes at most {max} (cmdline_size)")]
    CmdlineTooLong {
        /// Its length.
        len: usize,
        /// The kernel's cmdline_size.
        max: u64,
    },
    /// The kernel and its decompression room do not fit RAM.
    #[error(
        "the kernel needs {need:#x} bytes from {KERNEL_ADDR:#x} (init_size); the machine has \
         {ram} MiB of RAM (--memory)", ram = ram >> 20
    )]
    KernelOutsideRam {
        /// init_size, or the payload if larger.
        need: u64,
        /// Bytes of RAM.
        ram: u64,
    },
    /// No room for the initrd between the kernel and initrd_addr_max.
    #[error(
        "the {size}-byte initrd does not fit between the kernel's end {kernel_end:#x} and \
         {limit:#x} (initrd_addr_max or the end of RAM; --memory)"
    )]
    InitrdNoRoom {
        /// Its size.
        size: u64,
        /// One past the kernel's init_size.
        kernel_end: u64,
        /// The lower of initrd_addr_max + 1 and the end of RAM.
        limit: u64,
    },
}

/// A bzImage, checked and ready to load.
#[derive(Debug)]
pub struct BzImage {
    /// The file's bytes up to the setup header's end.
    header: Vec<u8>,
    /// The protected-mode kernel: the file's bytes after the setup.
    payload: Vec<u8>,
    /// Bytes of real-mode setup before the protected-mode kernel.
    setup_len: usize,
    /// The command line, NUL-terminated.
    cmdline: Vec<u8>,
    initrd: Option<Vec<u8>>,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn put(b: &mut [u8], at: usize, bytes: &[u8]) {
    b[at..at + bytes.len()].copy_from_slice(bytes);
}

/// Whether `image` says it is a bzImage (the magic only; [`BzImage::parse`] checks the rest).
pub fn is_bzimage(image: &[u8]) -> bool {
    image.get(HEADER_MAGIC_AT..HEADER_MAGIC_AT + 4) == Some(&HEADER_MAGIC[..])
}

impl BzImage {
    /// Check `image`'s setup header and make it ready to load with `cmdline` and `initrd`.
    pub fn parse(
        image: Vec<u8>,
        cmdline: &str,
        initrd: Option<Vec<u8>>,
    ) -> Result<Self, BzImageError> {
        let mut kernel = Self::check(&image, image.len() as u64, cmdline, initrd)?;
        kernel.payload = image[kernel.setup_len..].to_vec();
        Ok(kernel)
    }

    /// [`BzImage::parse`] of the kernel in `file`, which starts with `head`
    /// ([`ImageFile::kernel_head`]): the setup header is read from `head`, then only the
    /// protected-mode kernel from the file.
    pub fn read(
        file: &ImageFile,
        head: &[u8],
        cmdline: &str,
        initrd: Option<Vec<u8>>,
    ) -> Result<Self, ReadError<BzImageError>> {
        let mut kernel =
            Self::check(head, file.len(), cmdline, initrd).map_err(ReadError::Format)?;
        kernel.payload = file
            .read(kernel.setup_len as u64..file.len())
            .map_err(ReadError::Io)?;
        Ok(kernel)
    }

    /// The setup header of a `file_len`-byte file that starts with `image` (at least to the
    /// header's end, where the file has that much), checked; the payload not yet read.
    fn check(
        image: &[u8],
        file_len: u64,
        cmdline: &str,
        initrd: Option<Vec<u8>>,
    ) -> Result<Self, BzImageError> {
        if image.len() < INIT_SIZE + 4 {
            return Err(BzImageError::Truncated(image.len()));
        }
        if !is_bzimage(image) {
            return Err(BzImageError::NoMagic);
        }
        let version = u16_at(image, VERSION);
        if version < MIN_VERSION {
            return Err(BzImageError::OldProtocol(version));
        }
        let loadflags = image[LOADFLAGS];
        if loadflags & LOADED_HIGH == 0 {
            return Err(BzImageError::NotLoadedHigh(loadflags));
        }
        let xloadflags = u16_at(image, XLOADFLAGS);
        if xloadflags & XLF_KERNEL_64 == 0 {
            return Err(BzImageError::No64BitEntry(xloadflags));
        }
        // boot.rst: "If this field is 0, the real value is 4."
        let sects = match image[SETUP_SECTS] {
            0 => 4,
            n => usize::from(n),
        };
        let setup_len = (sects + 1) * 512;
        let header_end = HEADER_MAGIC_AT + usize::from(image[HEADER_JUMP_OFFSET]);
        // The 64-bit entry is 0x200 into the protected-mode kernel: it must be in the file.
        if (setup_len as u64) + ENTRY_64_OFFSET >= file_len
            || header_end > SETUP_HEADER_MAX_END.min(setup_len)
        {
            return Err(BzImageError::SetupTruncated {
                setup: setup_len,
                header_end,
                len: usize::try_from(file_len).unwrap_or(usize::MAX),
            });
        }
        // The header the kernel finds in its zero page is the one copied from here: it must
        // hold every field protocol 2.12 has, up to init_size.
        if header_end < INIT_SIZE + 4 {
            return Err(BzImageError::HeaderTooShort(header_end));
        }
        if cmdline.contains('\0') {
            return Err(BzImageError::CmdlineNul);
        }
        let max = u64::from(u32_at(image, CMDLINE_SIZE)).min(CMDLINE_ROOM - 1);
        if cmdline.len() as u64 > max {
            return Err(BzImageError::CmdlineTooLong {
                len: cmdline.len(),
                max,
            });
        }
        let mut cmdline = cmdline.as_bytes().to_vec();
        cmdline.push(0);
        Ok(BzImage {
            header: image[..header_end].to_vec(),
            payload: Vec::new(),
            setup_len,
            cmdline,
            initrd,
        })
    }

    /// One past the memory the kernel needs from [`KERNEL_ADDR`]: its init_size (the
    /// decompressor's room, boot.rst `init_size`), or the payload if that is larger.
    fn kernel_end(&self) -> u64 {
        let init_size = u64::from(u32_at(&self.header, INIT_SIZE));
        KERNEL_ADDR + init_size.max(self.payload.len() as u64)
    }

    /// Where the initrd goes in `ram` bytes of RAM: as high as it fits below initrd_addr_max
    /// (boot.rst: "the initrd should typically be located as high in memory as possible"),
    /// page-aligned, above the kernel.
    fn initrd_addr(&self, initrd: &[u8], ram: u64) -> Result<u64, BzImageError> {
        let size = initrd.len() as u64;
        let limit = (u64::from(u32_at(&self.header, INITRD_ADDR_MAX)) + 1).min(ram);
        let kernel_end = self.kernel_end();
        place_initrd(size, kernel_end, limit).ok_or(BzImageError::InitrdNoRoom {
            size,
            kernel_end,
            limit,
        })
    }

    /// Check that the kernel and the initrd fit `ram` bytes of RAM.
    pub fn check_fits(&self, ram: u64) -> Result<(), BzImageError> {
        let need = self.kernel_end() - KERNEL_ADDR;
        if self.kernel_end() > ram {
            return Err(BzImageError::KernelOutsideRam { need, ram });
        }
        if let Some(initrd) = &self.initrd {
            self.initrd_addr(initrd, ram)?;
        }
        Ok(())
    }

    /// The zero page for a machine with the e820 map of `machine`, the initrd at `initrd`
    /// and the RSDP at `rsdp`.
    fn boot_params(
        &self,
        machine: &MachineInfo<'_>,
        initrd: Option<(u64, u64)>,
        rsdp: u64,
    ) -> Vec<u8> {
        let mut p = vec![0u8; BOOT_PARAMS_SIZE];
        put(&mut p, SETUP_HEADER, &self.header[SETUP_HEADER..]);
        p[TYPE_OF_LOADER] = LOADER_UNDEFINED;
        let addr32 = |a: u64| u32::try_from(a).expect("below 4 GiB");
        put(&mut p, CMD_LINE_PTR, &addr32(CMDLINE_ADDR).to_le_bytes());
        // Written either way: the header copied from the file may hold anything there, and a
        // kernel given no initrd must read 0 (boot.rst: ramdisk_image is the loader's to write).
        let (addr, size) = initrd.unwrap_or((0, 0));
        put(&mut p, RAMDISK_IMAGE, &addr32(addr).to_le_bytes());
        put(&mut p, RAMDISK_SIZE, &addr32(size).to_le_bytes());
        // boot_params.acpi_rsdp_addr (protocol 2.14): saves the kernel the BIOS-area scan.
        put(&mut p, ACPI_RSDP_ADDR, &rsdp.to_le_bytes());
        let map = e820(machine.layout);
        assert!(
            map.len() <= E820_MAX_ENTRIES_ZEROPAGE,
            "a handful of entries"
        );
        p[E820_ENTRIES] = u8::try_from(map.len()).expect("at most 128");
        for (i, e) in map.iter().enumerate() {
            let at = E820_TABLE + E820_ENTRY_SIZE * i;
            let (addr, size, kind) = (
                at + offset_of!(boot_e820_entry, addr),
                at + offset_of!(boot_e820_entry, size),
                at + offset_of!(boot_e820_entry, r#type),
            );
            put(&mut p, addr, &e.range.start.to_le_bytes());
            put(&mut p, size, &e.range.len().to_le_bytes());
            put(&mut p, kind, &(e.kind as u32).to_le_bytes());
        }
        p
    }
}

impl Loader for BzImage {
    fn load(
        &self,
        mem: &GuestMemoryMmap,
        machine: &MachineInfo<'_>,
    ) -> Result<EntryState, LoadError> {
        let ram = machine.layout.low_ram_end();
        self.check_fits(ram)?;
        mem.write_slice(&self.payload, GuestAddress(KERNEL_ADDR))?;
        let initrd = match &self.initrd {
            Some(initrd) => {
                let addr = self.initrd_addr(initrd, ram)?;
                mem.write_slice(initrd, GuestAddress(addr))?;
                Some((addr, initrd.len() as u64))
            }
            None => None,
        };
        mem.write_slice(&self.cmdline, GuestAddress(CMDLINE_ADDR))?;
        let rsdp = write_acpi(mem, machine)?;
        let params = self.boot_params(machine, initrd, rsdp);
        mem.write_slice(&params, GuestAddress(BOOT_PARAMS_ADDR))?;
        long_mode::write_tables(mem)?;
        Ok(EntryState {
            mode: CpuMode::LongMode,
            regs: kvm_bindings::kvm_regs {
                rip: KERNEL_ADDR + ENTRY_64_OFFSET,
                rsi: BOOT_PARAMS_ADDR,
                rsp: STACK_TOP,
                rflags: boot::RFLAGS_BOOT,
                ..Default::default()
            },
        })
    }
}

impl From<BzImageError> for LoadError {
    fn from(e: BzImageError) -> Self {
        LoadError::kernel(e)
    }
}

#[cfg(test)]
mod tests;
