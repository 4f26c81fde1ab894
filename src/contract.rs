
/// Declares constants shared with the guest and lists them under `$list` for the C header.
macro_rules! contract_consts {
    ($list:ident; $($(#[doc = $doc:literal])* $name:ident: $ty:ty = $value:expr;)*) => {
        $($(#[doc = $doc])* pub const $name: $ty = $value;)*
        /// Every constant above, by name, for generating the guest's C header.
        pub const $list: &[(&str, u64)] = &[$((stringify!($name), $name as u64)),*];
    };
}

/// Declares `#[repr(C)]` blocks of `u64` fields (`name` or `name[N]`) and their C text.
macro_rules! contract_structs {
    ($($(#[doc = $doc:literal])* struct $name:ident as $cname:ident {
        $($(#[doc = $fdoc:literal])* $field:ident $([$len:literal])?,)*
    })*) => {
        $(
            $(#[doc = $doc])*
            #[repr(C)]
            #[derive(
                Clone, Copy, Debug, Default, PartialEq, Eq,
                zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable,
            )]
            pub struct $name {
                $($(#[doc = $fdoc])* pub $field: contract_field_type!($($len)?),)*
            }
        )*
        /// C declarations of every block above, for generating `contract.h`.
        pub const CONTRACT_STRUCTS_C: &str = concat!($(
            "struct ", stringify!($cname), " {\n",
            $("    uint64_t ", stringify!($field), $("[", stringify!($len), "]",)? ";\n",)*
            "};\n",
        )*);
    };
}

macro_rules! contract_field_type {
    () => { u64 };
    ($len:literal) => { [u64; $len] };
}

contract_consts! {
    CONTRACT_CONSTS;
    /// `BootInfo::magic`: "exitless" in ASCII, so the guest can tell it was booted by us.
    BOOT_INFO_MAGIC: u64 = 0x7373_656c_7469_7865;
    /// Guest-physical address of the [`BootInfo`] block.
    BOOT_INFO_ADDR: u64 = 0x7000;
    /// Guest-physical address of the op array (`MAX_OPS` entries).
    OPS_ADDR: u64 = 0x1_0000;
    /// Capacity of the op array.
    MAX_OPS: u64 = 256;
    /// Guest-physical address of the op results (`MAX_OPS` entries).
    RESULTS_ADDR: u64 = 0x1_8000;
    /// Guest-physical address of the enumeration records written by `OP_ENUMERATE`.
    ENUM_ADDR: u64 = 0x2_0000;
    /// Capacity of the enumeration record array.
    MAX_ENUM_RECORDS: u64 = 256;
    /// Where the probe image is loaded and entered (at CPL 0; it drops to CPL 3 at once).
    PROBE_LOAD_ADDR: u64 = 0x20_0000;
    /// Largest probe image the VMM accepts.
    PROBE_MAX_SIZE: u64 = 0x10_0000;
    /// Top of the CPL-3 stack.
    PROBE_STACK_TOP: u64 = 0x80_0000;
    /// Start of a page-aligned scratch RAM area the guest reads for the RAM floor loop.
    RAM_SCRATCH_ADDR: u64 = 0x90_0000;
    /// Size of the RAM scratch area.
    RAM_SCRATCH_SIZE: u64 = 0x1000;
    /// GDT selector of the 64-bit user code segment (DPL 3, RPL 3).
    USER_CS: u16 = 0x1b;
    /// GDT selector of the user data segment (DPL 3, RPL 3).
    USER_DS: u16 = 0x23;
    /// The console UART (COM1), a 16550A.
    PORT_SERIAL: u16 = 0x3f8;
    /// Port the guest writes an op index to before the op.
    PORT_PHASE_BEGIN: u16 = 0x500;
    /// Port the guest writes an op index to after the op.
    PORT_PHASE_END: u16 = 0x504;
    /// Port the guest writes its exit status to; ends the run.
    PORT_DONE: u16 = 0x508;
    /// `PORT_DONE` value: every op ran.
    DONE_OK: u64 = 0;
    /// `PORT_DONE` value: the boot-info magic was wrong.
    DONE_BAD_BOOT_INFO: u64 = 1;
    /// `Op::kind`: read `size` bytes of config space at `address` → `OpResult::value`.
    OP_CFG_READ: u64 = 1;
    /// `Op::kind`: write `value` (`size` bytes) to config space at `address`.
    OP_CFG_WRITE: u64 = 2;
    /// `Op::kind`: read the config dword at `address` `count` times; cycles in `OpResult`. One
    /// untimed warm-up read comes first (a page's first touch faults); it is in the op's exits.
    OP_CFG_READ_LOOP: u64 = 3;
    /// `Op::kind`: read a guest-RAM dword `count` times (the floor); cycles in `OpResult`. One
    /// untimed warm-up read comes first, as for `OP_CFG_READ_LOOP`.
    OP_RAM_READ_LOOP: u64 = 4;
    /// `Op::kind`: enumerate the bus (headers, BAR sizes, capabilities) into the records at
    /// `ENUM_ADDR`; record count in `OpResult::value`.
    OP_ENUMERATE: u64 = 5;
    /// `Op::kind`: read `size` bytes of guest-physical memory at `address` (device MMIO).
    OP_MMIO_READ: u64 = 6;
    /// `Op::kind`: write `value` (`size` bytes) to guest-physical memory at `address`.
    OP_MMIO_WRITE: u64 = 7;
    /// `Op::method`: the guest picks, as the seed's guest patch argues: ECAM when it runs under a
    /// hypervisor (CPUID.1:ECX[31]) and ECAM is described, PIO otherwise.
    METHOD_AUTO: u64 = 0;
    /// `Op::method`: configuration mechanism #1 (ports 0xCF8/0xCFC).
    METHOD_PIO: u64 = 1;
    /// `Op::method`: the ECAM window.
    METHOD_ECAM: u64 = 2;
    /// `OpResult::status`: done.
    STATUS_OK: u64 = 0;
    /// `OpResult::status`: the op cannot be done by that method (e.g. offset ≥ 256 by PIO, no
    /// ECAM described) or is malformed; nothing was accessed.
    STATUS_UNSUPPORTED: u64 = 1;
    /// `OpResult::status`: the op kind is unknown.
    STATUS_BAD_OP: u64 = 2;
    /// `EnumRecord::flags` bit: this function is a PCI-to-PCI bridge or has header type ≠ 0.
    ENUM_FLAG_NOT_TYPE0: u64 = 1;
    /// `EnumRecord::flags` bit: the capability list was longer than the record holds.
    ENUM_FLAG_CAPS_TRUNCATED: u64 = 2;
}

contract_structs! {
    /// Written by the VMM at `BOOT_INFO_ADDR` before the guest starts.
    struct BootInfo as boot_info {
        /// `BOOT_INFO_MAGIC`.
        magic,
        /// Guest-physical base of the ECAM window, 0 when none is described.
        ecam_base,
        /// First bus number the ECAM window decodes.
        ecam_bus_start,
        /// Last bus number the ECAM window decodes.
        ecam_bus_end,
        /// Number of valid entries at `OPS_ADDR`.
        op_count,
    }

    /// One step of the guest's work, read by the guest at `OPS_ADDR`.
    struct Op as op {
        /// `OP_*`.
        kind,
        /// `METHOD_*` for config-space ops.
        method,
        /// Config ops: ECAM-style offset `bus << 20 | device << 15 | function << 12 | register`.
        /// MMIO ops: guest-physical address.
        address,
        /// Access width in bytes: 1, 2, 4 (or 8 for MMIO).
        size,
        /// Value for writes.
        value,
        /// Iterations for loops.
        count,
    }

    /// Filled by the guest at `RESULTS_ADDR`, one per op.
    struct OpResult as op_result {
        /// `STATUS_*`.
        status,
        /// Value read, or record count for `OP_ENUMERATE`.
        value,
        /// TSC cycles the op took, measured with `rdtsc` at CPL 3.
        cycles,
        /// The `METHOD_*` actually used (resolves `METHOD_AUTO`).
        method_used,
    }

    /// One enumerated PCI function, written by `OP_ENUMERATE` at `ENUM_ADDR`.
    struct EnumRecord as enum_record {
        /// ECAM-style offset of the function (register 0).
        address,
        /// Dwords 0x00..0x40 of the header as first read (before BAR sizing).
        header[16],
        /// Size in bytes of each BAR as found by writing all-ones (0: not implemented; a 64-bit
        /// BAR's size is in its low slot and the high slot is 0).
        bar_sizes[6],
        /// Capability IDs in list order (standard ones, then extended ones with bit 16 set).
        caps[8],
        /// Number of valid entries in `caps`.
        cap_count,
        /// `ENUM_FLAG_*`.
        flags,
    }
}
