//! exitless: a KVM virtual machine monitor for x86-64 whose device I/O path avoids VM exits or
//! amortizes them. See README.md for what it measures and DESIGN notes in the modules.

#[macro_use]
pub mod contract {
    //! The VMM ↔ probe-guest contract: addresses, ports, selectors and the blocks both sides
    //! exchange. `build.rs` turns the same file into the guest's `contract.h`, so the two halves
    //! cannot drift.
    //!
    //! Protocol: the VMM writes a [`BootInfo`] at [`BOOT_INFO_ADDR`] and `op_count` [`Op`]s at
    //! [`OPS_ADDR`], then starts the guest. For each op `i` the guest writes `i` to
    //! [`PORT_PHASE_BEGIN`], performs the op at CPL 3, fills [`OpResult`] `i` at
    //! [`RESULTS_ADDR`] and writes `i` to [`PORT_PHASE_END`]; the VMM attributes the exits in
    //! between to op `i`. Then the guest writes [`DONE_OK`] (or an error) to [`PORT_DONE`].
    //!
    //! Under QEMU (`crate::peer`) the same image enters through its multiboot header
    //! ([`MULTIBOOT_BOOTLOADER_MAGIC`] in EAX), builds the tables at `BOOT_*_ADDR` itself, fills
    //! the [`BootInfo`] from ACPI, reads the ops from the fw_cfg file [`QEMU_OPS_FILE`], runs
    //! them as above, prints the results between [`DUMP_BEGIN`] and [`DUMP_END`] on
    //! [`PORT_SERIAL`] and writes its status to [`QEMU_DEBUG_EXIT_PORT`].
    include!("contract.rs");
}

/// What to do about a host error that is a resource limit, to append to its message.
pub(crate) fn resource_hint(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE) => {
            "; every interrupt vector and doorbell holds an eventfd: raise the open-file limit \
             (ulimit -n) or configure fewer devices"
        }
        _ => "",
    }
}

pub mod api;
pub mod bench;
pub mod bus;
pub mod devices;
pub mod dma;
pub mod fakes;
pub mod host_file;
pub mod inspect;
pub mod iommu;
pub mod irq;
pub mod logging;
pub mod machine;
pub mod pci;
pub mod peer;
pub mod seccomp;
pub mod snapshot;
pub mod stats;
pub mod virtio;
pub mod vm;
