//! The guests exitless builds from C with gcc (the build script says how): the probe guest, which
//! the VMM embeds and boots to time each device path, and the multiboot test kernel, which
//! `exitless run` boots to check its machine against QEMU's conventions. The build script also
//! puts the test kernel beside the `exitless` binary (`target/<profile>/`), where the README's
//! examples find it.

/// The probe guest's flat image, loaded at `exitless_contract::PROBE_LOAD_ADDR`.
pub static PROBE_IMAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/probe.bin"));

/// The test kernel as a 32-bit multiboot ELF, as this build made it (for tests that drive the
/// VMM as a library; the copy beside the binary is the same file).
pub const TEST_KERNEL_ELF: &str = concat!(env!("OUT_DIR"), "/testkernel.elf");
/// The same kernel linked at 0x8000, in conventional memory.
pub const TEST_KERNEL_LOW_ELF: &str = concat!(env!("OUT_DIR"), "/testkernel-low.elf");
/// The same kernel as a flat image, loaded by its multiboot header's address fields.
pub const TEST_KERNEL_BIN: &str = concat!(env!("OUT_DIR"), "/testkernel.bin");
