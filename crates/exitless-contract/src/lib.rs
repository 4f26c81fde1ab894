//! The VMM ↔ guest contract: the probe's addresses, ports, selectors and the blocks both sides
//! exchange, and the register facts (PCI, virtio, x86 interrupts, VT-d) that the VMM's device
//! models and the guest's drivers share. The VMM uses this crate as a library; the guest crate's
//! build script turns the same constants into the guest's `contract.h` ([`header::c_header`]),
//! so the two halves cannot drift.
//!
//! Protocol: the VMM writes a [`BootInfo`] at [`BOOT_INFO_ADDR`] and `op_count` [`Op`]s at
//! [`OPS_ADDR`], then starts the guest. For each op `i` the guest writes `i` to
//! [`PORT_PHASE_BEGIN`], performs the op at CPL 3, fills [`OpResult`] `i` at
//! [`RESULTS_ADDR`] and writes `i` to [`PORT_PHASE_END`]; the VMM attributes the exits in
//! between to op `i`. Then the guest writes [`DONE_OK`] (or an error) to [`PORT_DONE`].
//!
//! Under QEMU (the `exitless-peer` crate) the same image enters through its multiboot header
//! ([`MULTIBOOT_BOOTLOADER_MAGIC`] in EAX), builds the tables at `BOOT_*_ADDR` itself, fills
//! the [`BootInfo`] from ACPI, reads the ops from the fw_cfg file [`QEMU_OPS_FILE`], runs
//! them as above, prints the results between [`DUMP_BEGIN`] and [`DUMP_END`] on
//! [`PORT_SERIAL`] and writes its status to [`QEMU_DEBUG_EXIT_PORT`].

#[macro_use]
mod macros;

pub mod header;
pub mod iommu;
pub mod irq;
pub mod pci;
pub mod virtio;

contract_consts! {
    CONTRACT_CONSTS;
    /// `BootInfo::magic`: "exitless" in ASCII, so the guest can tell it was booted by us.
    BOOT_INFO_MAGIC: u64 = 0x7373_656c_7469_7865;
    /// Guest-physical address of the [`BootInfo`] block.
    BOOT_INFO_ADDR: u64 = 0x7000;
    /// Guest-physical address of the op array (`MAX_OPS` entries).
    OPS_ADDR: u64 = 0x1_0000;
    /// Capacity of the op array.
    MAX_OPS: u64 = 512;
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
    /// GDT selector of the 64-bit kernel code segment (interrupt gates point at it).
    KERNEL_CS: u16 = 0x08;
    /// GDT selector of the kernel data segment.
    KERNEL_DS: u16 = 0x10;
    /// GDT selector of the 64-bit TSS (a 16-byte system descriptor: two slots).
    TSS_SELECTOR: u16 = 0x28;
    /// Where the GDT lies: the VMM writes it, or the probe's multiboot entry does.
    BOOT_GDT_ADDR: u64 = 0x1000;
    /// Where the TSS lies, with its I/O permission bitmap.
    BOOT_TSS_ADDR: u64 = 0x2000;
    /// I/O permission bitmap offset inside the TSS: right after the 104-byte 64-bit TSS.
    TSS_IOMAP_BASE: u16 = 0x68;
    /// 65536 ports, one bit each; an all-ones byte follows (the CPU may read past the end).
    TSS_IOMAP_LEN: u16 = 0x2000;
    /// The PML4 of the identity map.
    BOOT_PML4_ADDR: u64 = 0x5000;
    /// Its one page-directory-pointer table.
    BOOT_PDPT_ADDR: u64 = 0x6000;
    /// Page directories mapping 4 GiB with 2 MiB pages: RAM, the PCI holes, ECAM.
    BOOT_PD_ADDR: u64 = 0x8000;
    /// Number of page directories at `BOOT_PD_ADDR`.
    BOOT_PD_COUNT: u64 = 4;
    /// Page-table entry bits (Intel SDM vol. 3 §4.5): present.
    PTE_PRESENT: u64 = 1 << 0;
    /// Writable.
    PTE_WRITABLE: u64 = 1 << 1;
    /// Reachable at CPL 3 (the probe's loops run there).
    PTE_USER: u64 = 1 << 2;
    /// A 1 GiB (PDPTE) or 2 MiB (PDE) page.
    PTE_HUGE: u64 = 1 << 7;
    /// Under QEMU without 1 GiB pages, page directories mapping 4–64 GiB in 2 MiB pages
    /// (`HIGH_PD_COUNT` of them), which the probe fills at CPL 3, where it runs natively:
    /// firmware may put 64-bit BARs up there. Free RAM below the EBDA in QEMU's map.
    HIGH_PD_ADDR: u64 = 0x5_0000;
    /// Page directories at `HIGH_PD_ADDR`: one per GiB from 4 to 64 GiB.
    HIGH_PD_COUNT: u64 = 60;
    /// EAX at entry when a multiboot loader (QEMU's `-kernel`) started the probe (Multiboot
    /// 0.6.96 §3.2); exitless enters the probe in long mode directly, with RSI = 0.
    MULTIBOOT_BOOTLOADER_MAGIC: u64 = 0x2bad_b002;
    /// QEMU's `-device isa-debug-exit,iobase=0xf4,iosize=4`: the probe booted by QEMU ends
    /// its run by writing its `DONE_*` status here; QEMU exits with `(status << 1) | 1`.
    QEMU_DEBUG_EXIT_PORT: u16 = 0xf4;
    /// Top of the ring-0 stack the CPU switches to when an interrupt arrives at CPL 3 (TSS.RSP0).
    INTERRUPT_STACK_TOP: u64 = 0x88_0000;
    /// GDT selector of the 64-bit user code segment (DPL 3, RPL 3).
    USER_CS: u16 = 0x1b;
    /// GDT selector of the user data segment (DPL 3, RPL 3).
    USER_DS: u16 = 0x23;
    /// Guest RAM the probe's drivers use for virtqueues and buffers.
    DMA_ADDR: u64 = 0xa0_0000;
    /// Size of the driver RAM area.
    DMA_SIZE: u64 = 0x50_0000;
    /// Most virtio-mmio devices the boot info describes.
    MAX_VIRTIO_MMIO: u64 = 8;
    /// First IDT vector the probe's drivers give device interrupts; a device's queue `q` uses
    /// `IRQ_VECTOR_BASE + q` and its config changes `IRQ_VECTOR_BASE + IRQ_VECTOR_CONFIG`.
    IRQ_VECTOR_BASE: u64 = 0x40;
    /// Offset from `IRQ_VECTOR_BASE` of the configuration-change vector.
    IRQ_VECTOR_CONFIG: u64 = 0x10;
    /// IDT vector of the virtio-mmio legacy line (its handler reads InterruptStatus and ACKs).
    IRQ_VECTOR_LEGACY: u64 = 0x30;
    /// Bytes per receive buffer the probe posts: the largest response it takes, with the header.
    RR_RX_BUFFER_SIZE: u64 = 0x4000;
    /// Largest request frame the probe sends.
    RR_MAX_REQUEST: u64 = 0x1000;
    /// The console UART (COM1), a 16550A.
    PORT_SERIAL: u16 = 0x3f8;
    /// Port the guest writes an op index to before the op.
    PORT_PHASE_BEGIN: u16 = 0x500;
    /// Port the guest writes an op index to after the op.
    PORT_PHASE_END: u16 = 0x504;
    /// Port the guest writes its exit status to; ends the run.
    PORT_DONE: u16 = 0x508;
    /// Port the guest writes an ECAM-style function address plus an MSI-X entry number to (the
    /// address's low 12 bits are free): the VMM then sends that vector once, as the device does
    /// when the queue behind it completes work. The probe's interrupt source for delivery checks.
    PORT_MSIX_SEND: u16 = 0x50c;
    /// `PORT_DONE` value: every op ran.
    DONE_OK: u64 = 0;
    /// `PORT_DONE` value: the boot-info magic was wrong.
    DONE_BAD_BOOT_INFO: u64 = 1;
    /// `PORT_DONE` value: CPU exception `n` is reported as `DONE_EXCEPTION + n`.
    DONE_EXCEPTION: u64 = 0x100;
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
    /// `Op::kind`: bring up the virtio-net device at `address` (`method`: `TRANSPORT_*`; MMIO:
    /// index in `BootInfo::virtio_mmio_base`, PCI: ECAM-style function address) with the
    /// `RR_FLAG_*` in `value`. Later `OP_VIRTIO_RR` ops drive it. `size`: payload bytes of
    /// the largest frame `OP_NET_STREAM` will stream on it (0 to `NET_STREAM_FRAME_SIZE` less
    /// the virtio-net header; up to 32 lays the buffers out as for 32): its stream buffers are
    /// laid out (and touched) here, not in the timed stream.
    OP_VIRTIO_INIT: u64 = 8;
    /// `Op::kind`: `count` request/response transactions on the device of the last
    /// `OP_VIRTIO_INIT`: send a `size`-byte frame, kick, wait for the receive interrupt, check the
    /// response. `OpResult::value`: transactions done; `irqs`, `bytes` as documented there.
    OP_VIRTIO_RR: u64 = 9;
    /// `Op::kind`: send a request and, without waiting for its response, reset the device of
    /// the last `OP_VIRTIO_INIT` (status 0), then bring it up again with the same flags: what a
    /// driver does after DEVICE_NEEDS_RESET. The lost response must not reappear.
    OP_VIRTIO_RESET: u64 = 10;
    /// `Op::kind`: mask the receive vector, complete one transaction without an interrupt,
    /// check the vector's pending bit, unmask and check the interrupt then arrives and the
    /// pending bit clears. MSI modes only.
    OP_VIRTIO_MASK_PENDING: u64 = 11;
    /// `Op::kind`: program every MSI-X entry of the function at `address` (ECAM-style) with
    /// message address `size` (`MSI_ADDRESS_BASE` if 0) and data `value + i` for entry i
    /// (wrapping within `value`..=0xff, so no entry reaches an exception vector), then
    /// unmask it if
    /// `count` is 1 (leave it masked if 0), all while MSI-X is disabled (the op clears Enable
    /// first). `OpResult::value`: entries programmed; cycles: the programming alone.
    OP_MSIX_PROGRAM: u64 = 12;
    /// `Op::kind`: write `value` to the MSI-X Message Control register of the function at
    /// `address` (`PCI_MSIX_FLAGS_ENABLE`, `PCI_MSIX_FLAGS_MASKALL`); cycles: that one write.
    OP_MSIX_CONTROL: u64 = 13;
    /// `Op::kind`: write the Vector Control of every MSI-X entry of the function at `address`,
    /// one entry after the other: unmask if `value` is 0, mask if 1.
    OP_MSIX_MASK_EACH: u64 = 14;
    /// `Op::kind`: rewrite the data of every MSI-X entry of the function at `address` to
    /// `value + i` (wrapping as `OP_MSIX_PROGRAM` does) without masking it first (address,
    /// then data: Linux's order).
    OP_MSIX_RETARGET: u64 = 15;
    /// `Op::kind`: check MSI-X delivery on the function at `address`. First, messages left
    /// pending at the previous check (or `OP_MSIX_PROGRAM`) on entries that can deliver now
    /// (Enable set, Function Mask and the entry's mask clear) must each have arrived once on
    /// the IDT vector in the entry's data. Then, with `count` = 1, the guest asks for each
    /// vector in turn through `PORT_MSIX_SEND`: one that can deliver must arrive exactly once
    /// on its own IDT vector and nowhere else; one that cannot must not arrive and must show
    /// its pending bit; one whose message the CPU does not take (address outside 0xFEExxxxx,
    /// vector < 16) must not arrive at all. `OpResult::value`: entries that behaved; `irqs`:
    /// interrupts on expected vectors; `stray_irqs`: any other; status `STATUS_BAD_DATA` on a
    /// mismatch.
    OP_MSIX_CHECK: u64 = 16;
    /// `Op::kind`: interrupt latency on the function at `address`: `count` rounds, each asking
    /// the VMM (`PORT_MSIX_SEND`) for entries `value` .. `value + size` (one if `size` is 0) one
    /// at a time and waiting for each on the IDT vector in its data; cycles: all of it, from
    /// the first request to the last handler. `OpResult::value`: requests; `irqs`: interrupts
    /// that arrived; status `STATUS_TIMEOUT` if one did not within a second (as for a held or
    /// invalid vector: ask only for deliverable ones).
    OP_MSIX_LATENCY: u64 = 17;
    /// `Op::kind`: a hostile burst from seed `value`: `count` random accesses of every width
    /// at any offset and value into every device window and config space (both mechanisms),
    /// BAR moves, decode and bus-master toggles, device resets with requests in flight,
    /// random descriptor chains on the driven device's rings and random MSI messages. DMA
    /// addresses it writes point at `HOSTILE_DMA_ADDR`'s area or outside RAM, and MSI data
    /// it writes never names an exception vector, SMI, NMI or INIT, so the probe survives
    /// its own attack. Afterwards every virtio-pci function gets the BARs, decode, bus
    /// mastering and MSI-X Enable firmware gave it; devices are left for `OP_VIRTIO_INIT` to
    /// bring up. `OpResult::value`: accesses made; `resets`: device resets among them;
    /// `irqs`: interrupts that arrived meanwhile on any device vector.
    OP_HOSTILE: u64 = 18;
    /// Guest RAM that DMA addresses written by `OP_HOSTILE` point into, after everything else
    /// the probe uses: whatever a device writes there hurts no code, stack or table.
    HOSTILE_DMA_ADDR: u64 = DMA_ADDR + DMA_SIZE;
    /// Size of the `OP_HOSTILE` DMA area; the soak's RAM ends with it.
    HOSTILE_DMA_SIZE: u64 = 0x10_0000;
    /// DMA addresses from here up, written by `OP_HOSTILE`, are outside the soak's RAM.
    HOSTILE_OUTSIDE_RAM: u64 = 0x1000_0000;
    /// `Op::kind`: from now on, unmap IOMMU-mapped buffers as `method` (`IOMMU_MODE_*`) says,
    /// flushing past a high-water mark of `value` pending unmaps (the deferred modes; 0 keeps
    /// the last one). Unmaps still pending are flushed first, as Linux does when it leaves
    /// lazy mode. `OpResult::value`: pages that flush covered.
    OP_IOMMU_MODE: u64 = 19;
    /// `Op::kind`: `count` frames of `size` payload bytes on the transmit queue of the device
    /// of the last `OP_VIRTIO_INIT`, at most `value` in flight (its queue size if 0): each
    /// buffer is mapped before it is posted and unmapped when the device returns it, when the
    /// device is behind the IOMMU. The guest writes each frame's payload before posting it:
    /// byte `i` of the `n`th frame of the op is `(n + i) mod 256` (the stream's pattern, which
    /// the sink backend checks). `size` is 1..=`NET_STREAM_FRAME_SIZE` less the virtio-net
    /// header. `OpResult::value`: frames the device returned.
    OP_NET_STREAM: u64 = 20;
    /// `Op::kind`: copy the IOMMU driver's counters since the last `OP_IOMMU_REPORT` into
    /// `IommuReport` slot `address` at `IOMMU_REPORT_ADDR` (up to `MAX_IOMMU_REPORTS`) and
    /// start them again.
    OP_IOMMU_REPORT: u64 = 21;
    /// `Op::kind`: `count` ICMP echo transactions (RFC 792) with the host's kernel through the
    /// device of the last `OP_VIRTIO_INIT` (its MAC from its config space, VIRTIO_NET_F_MAC):
    /// an Ethernet frame carrying an IPv4 echo request with `size` bytes of data
    /// (`ICMP_MAX_PAYLOAD` at most) from the guest's address to the host's, then the echo reply
    /// awaited on the receive interrupt and checked (from the host to the guest, type 0, the
    /// request's identifier, sequence number and data). `address`: the host's IPv4 address in
    /// bits 0..32, the guest's in bits 32..64 (10.0.0.1 is 0x0a00_0001); `value`: the host's
    /// MAC in bits 0..48, its first octet highest. Frames that are not an echo reply to the
    /// guest (the host's own IPv6 chatter) are dropped. `OpResult::value`: replies checked;
    /// `bytes`: their ICMP data bytes; `irqs`, `stray_irqs` as for `OP_VIRTIO_RR`.
    OP_ICMP_ECHO: u64 = 22;
    /// `Op::kind`: interrupt remapping on (VT-d §5.1; docs/iommu.md): the probe's VT-d driver
    /// (brought up if it is not) fills a 256-entry interrupt remapping table whose entry k
    /// delivers IDT vector k + `value` (none below 16) to the boot CPU, accepted only from the
    /// PCI function at `address` (SVT 1; with `count` = 1, from function 0 of the next device
    /// instead, so that every message is blocked and faults), latches it, invalidates the
    /// interrupt entry cache and sets IRE. Messages from then on are checked as remapped: a remappable-format MSI-X entry
    /// (`msix_program` with the address `MSI_REMAPPABLE_SHV`: handle 0, the subhandle in its
    /// data) is expected on the vector its entry names, a compatibility-format one nowhere, and
    /// `OP_MSIX_CHECK` does not count the unit's fault events (`IOMMU_FAULT_VECTOR`). Devices
    /// brought up afterwards (`OP_VIRTIO_INIT`, virtio-pci or the virtio-mmio MSI extension)
    /// get remappable messages naming the entries that deliver on their usual vectors. For a
    /// virtio-mmio device, `address` names its source-id as if it were a function: bus 0xF1,
    /// device n; for the IOAPIC of a split irqchip, FF:00.0 (and `count` = 2 makes the entries
    /// level-triggered, as its level lines need; a virtio-mmio device brought up afterwards on
    /// its line then gets a remappable redirection entry, VT-d §5.1.5.1, naming the entry
    /// that delivers on its usual vector).
    /// `OpResult::value`: the table's entries.
    OP_IOMMU_INTREMAP: u64 = 23;
    /// An MSI address in remappable format (VT-d §5.1.2.2) with handle 0 and SHV set: the
    /// interrupt index is the message data's low 16 bits.
    MSI_REMAPPABLE_SHV: u32 = 0xfee0_0018;
    /// Most ICMP data bytes in an `OP_ICMP_ECHO` request: a 1500-byte IPv4 packet (the tap's
    /// default MTU) less the IPv4 and ICMP headers, so no reply is fragmented.
    ICMP_MAX_PAYLOAD: u64 = 1500 - 20 - 8;
    /// `OP_IOMMU_MODE` method: every unmap invalidates its pages (page-selective IOTLB
    /// invalidation and a wait, one IQT write) before the IOVA is reused.
    IOMMU_MODE_STRICT: u64 = 1;
    /// `OP_IOMMU_MODE` method: the first deferred design (docs/iommu.md): a list node per
    /// unmap, one global invalidation and a wait when the list passes the high-water mark or
    /// after 10 ms.
    IOMMU_MODE_DEFERRED_LIST: u64 = 2;
    /// `OP_IOMMU_MODE` method: the second deferred design: a fixed array, flushed when full
    /// (the high-water mark) or after 10 ms.
    IOMMU_MODE_DEFERRED_ARRAY: u64 = 3;
    /// `OP_IOMMU_MODE` method: as deferred-array, but a domain-selective invalidation.
    IOMMU_MODE_PER_DOMAIN: u64 = 4;
    /// `OP_IOMMU_MODE` method: Linux's dma-iommu flush queue today: a 256-entry ring flushed
    /// when full or after 10 ms (the high-water mark does not apply).
    IOMMU_MODE_LINUX_FQ: u64 = 5;
    /// `RR_FLAG_*` bit: the device's DMA goes through the IOMMU (VIRTIO_F_ACCESS_PLATFORM);
    /// virtio-pci only. The probe sets the unit up at the first such device. A device
    /// brought up without it is not behind the IOMMU: nothing is mapped (the `none` variant).
    RR_FLAG_IOMMU: u64 = 4;
    /// Bytes of the largest `OP_NET_STREAM` frame, virtio-net header included: a jumbo
    /// frame and more (the payload is at most this less the header). The probe lays its 16
    /// frame buffers `NET_STREAM_ALIGN`-aligned, the largest frame its `OP_VIRTIO_INIT` named
    /// rounded up to it apart, so a buffer starts at most 0xf00 into a page and spans at most
    /// 8 pages: one VT-d mapping slot (crates/exitless-guest/probe/vtd.c's `VTD_SLOT_PAGES`).
    NET_STREAM_FRAME_SIZE: u64 = 0x7000;
    /// Alignment of the probe's stream frame buffers: frames of up to 32 bytes lie 0x100
    /// apart, 16 to a page.
    NET_STREAM_ALIGN: u64 = 0x100;
    /// IDT vector of the IOMMU's fault event interrupt.
    IOMMU_FAULT_VECTOR: u64 = 0xf0;
    /// Guest RAM for the probe's VT-d structures: root and context tables, the invalidation
    /// queue, its wait status, page tables.
    IOMMU_TABLES_ADDR: u64 = 0x91_0000;
    /// Size of the VT-d structure area.
    IOMMU_TABLES_SIZE: u64 = 0xe_0000;
    /// First IOVA the probe's driver hands out: above RAM, so a DMA that was not translated
    /// cannot land in guest memory by chance.
    IOVA_BASE: u64 = 0x1_0000_0000;
    /// Guest-physical address of the `IommuReport` slots.
    IOMMU_REPORT_ADDR: u64 = 0x4_0000;
    /// Number of `IommuReport` slots.
    MAX_IOMMU_REPORTS: u64 = 32;
    /// Buckets of `IommuReport::exposure_log2`: bucket `b` counts exposures of
    /// 2^b ..< 2^(b+1) TSC cycles (the last also counts longer ones).
    EXPOSURE_BUCKETS: u64 = 32;
    /// `Op::method` of virtio ops: a virtio-mmio device.
    TRANSPORT_MMIO: u64 = 1;
    /// `Op::method` of virtio ops: a virtio-pci device (MSI-X).
    TRANSPORT_PCI: u64 = 2;
    /// `RR_FLAG_*` bit: virtio-mmio MSI extension (PCI always uses MSI-X).
    RR_FLAG_MSI: u64 = 1;
    /// `RR_FLAG_*` bit: virtio-mmio per-queue doorbells instead of QueueNotify.
    RR_FLAG_DOORBELLS: u64 = 2;
    /// `Op::method`: the guest picks, by the guest-side policy under test: ECAM when it runs
    /// under a hypervisor (CPUID.1:ECX[31]) and ECAM is described, PIO otherwise.
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
    /// `OpResult::status`: the device refused the driver (features, queue, vector), or reports
    /// DEVICE_NEEDS_RESET.
    STATUS_DEVICE_ERROR: u64 = 3;
    /// `OpResult::status`: an awaited completion or interrupt did not come within a second.
    STATUS_TIMEOUT: u64 = 4;
    /// `OpResult::status`: a response had the wrong length or contents.
    STATUS_BAD_DATA: u64 = 5;
    /// `OpResult::status`: masking did not behave (interrupt while masked, no pending bit, or no
    /// interrupt after unmask).
    STATUS_MASK_BROKEN: u64 = 6;
    /// `EnumRecord::flags` bit: this function is a PCI-to-PCI bridge or has header type ≠ 0.
    ENUM_FLAG_NOT_TYPE0: u64 = 1;
    /// `EnumRecord::flags` bit: the capability list was longer than the record holds.
    ENUM_FLAG_CAPS_TRUNCATED: u64 = 2;
}

/// RAM the probe needs: everything up to the end of its driver area, the highest thing it uses.
pub const PROBE_MIN_RAM: u64 = DMA_ADDR + DMA_SIZE;

/// The fw_cfg file QEMU hands the probe its ops in (`-fw_cfg name=opt/exitless/ops,file=…`):
/// the `Op` array exactly as exitless writes it at `OPS_ADDR`; its size gives the count.
pub const QEMU_OPS_FILE: &str = "opt/exitless/ops";
/// First word of the probe's serial dump under QEMU (`exitless_peer::dump` has the format).
pub const DUMP_BEGIN: &str = "exitless-results";
/// First word of the dump's last line, which carries the checksum.
pub const DUMP_END: &str = "exitless-end";
/// The string constants above, by name, for generating the guest's C header.
pub const CONTRACT_STRINGS: &[(&str, &str)] = &[
    ("QEMU_OPS_FILE", QEMU_OPS_FILE),
    ("DUMP_BEGIN", DUMP_BEGIN),
    ("DUMP_END", DUMP_END),
];

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
        /// TSC frequency in kHz (the guest's timeouts), 0 if unknown.
        tsc_khz,
        /// Number of valid entries in `virtio_mmio_base`.
        virtio_mmio_count,
        /// Guest-physical base of each virtio-mmio device (`VIRTIO_MMIO_WINDOW_SIZE` bytes).
        virtio_mmio_base[8],
        /// IOAPIC pin of each virtio-mmio device's legacy interrupt line.
        virtio_mmio_gsi[8],
        /// Guest-physical base of the VT-d remapping unit's register page (`VTD_*_REG`
        /// offsets), 0 when the machine has none. virtio-pci devices offer
        /// VIRTIO_F_ACCESS_PLATFORM when it is there.
        iommu_base,
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
        /// Virtio ops: interrupts taken on the vector the receive queue was given.
        irqs,
        /// Virtio ops: interrupts taken on any other device vector.
        stray_irqs,
        /// Virtio ops: response payload bytes received and checked.
        bytes,
        /// `OP_HOSTILE`: device resets the burst made.
        resets,
    }

    /// What the probe's VT-d driver did between two `OP_IOMMU_REPORT`s.
    struct IommuReport as iommu_report {
        /// Buffers mapped.
        maps,
        /// Buffers unmapped (each may span several pages).
        unmaps,
        /// Pages unmapped.
        pages,
        /// Flushes of deferred unmaps (strict: one per unmap).
        flushes,
        /// Invalidation descriptors queued, waits included.
        descriptors,
        /// Writes to the invalidation queue tail (each one exit).
        iqt_writes,
        /// Most pages pending invalidation at once.
        max_pending,
        /// Exposure of each unmapped page (TSC cycles from its unmap until the invalidation
        /// covering it completed): the longest.
        exposure_max,
        /// The sum, for the mean.
        exposure_sum,
        /// Its distribution (`EXPOSURE_BUCKETS` log2 buckets), for percentiles.
        exposure_log2[32],
        /// Wait descriptors whose status did not come within a second (0 unless broken).
        wait_timeouts,
        /// Fault event interrupts taken.
        faults,
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
