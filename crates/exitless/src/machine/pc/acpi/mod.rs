//! The ACPI tables of `exitless run`'s machine (ACPI 6.5 §5.2), built with the acpi_tables
//! crate and written into the BIOS area, where a guest without UEFI finds the RSDP by scanning
//! (§5.2.5.1): RSDP → XSDT → FADT (→ FACS, DSDT), MADT, MCFG when ECAM is described, and the
//! tables other parts of the machine describe themselves with ([`AcpiTables::extra`]: the
//! IOMMU's DMAR, once the machine has one).
//!
//! What the tables say is what the machine has: the fixed-hardware registers of
//! `devices::acpi_pm` (S3 and power-off through PM1 control, the RTC alarm's status and
//! enable, the PM timer), the reset register at 0xCF9, one local APIC per vCPU, KVM's IOAPIC
//! and its ISA overrides, the PCI host bridge with the bus range and windows of
//! `machine::layout`, the COM1 UART, the RTC (`devices::rtc`), the pvpanic port, each
//! virtio-mmio window the layout gave out, and no VGA.

use acpi_tables::aml::{
    AddressSpace, AddressSpaceCacheable, Device, EISAName, IO, Interrupt, Memory32Fixed, Name,
    Package, ResourceTemplate, ZERO,
};
use acpi_tables::facs::FACS;
use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::gas::{AccessSize, AddressSpace as GasSpace, GAS};
use acpi_tables::madt::{
    EnabledStatus, IoApic, LocalInterruptController, MADT, ProcessorLocalApic,
};
use acpi_tables::mcfg::MCFG;
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::{Aml, AmlSink};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use zerocopy::little_endian::{U16, U32};
use zerocopy::{Immutable, IntoBytes};

use crate::contract::PORT_SERIAL;
use crate::devices::acpi_pm::{
    PM_BASE, PM_BLOCK_LEN, PM_TMR_LEN, PM_TMR_OFFSET, PM1_CNT_LEN, PM1_CNT_OFFSET, PM1_EVT_LEN,
    PM1_EVT_OFFSET, S3_SLP_TYP, S5_SLP_TYP,
};
use crate::devices::pvpanic::{PVPANIC_HID, PVPANIC_LEN, PVPANIC_PORT};
use crate::devices::reset_control::{RESET_CONTROL_PORT, RESET_VALUE};
use crate::devices::rtc::{CENTURY_INDEX, RTC_IRQ, RTC_PORT, RTC_PORTS_LEN};
use crate::devices::serial::SERIAL_PORT_LEN;
use crate::irq::ioapic::IOAPIC_ID;
use crate::irq::regs::{IOAPIC_BASE, LAPIC_BASE};
use crate::machine::layout::{
    ECAM_LAST_BUS, ECAM_SIZE, MemoryLayout, PCI_IO_BASE, PCI_IO_LEN, PCI_MMIO_WINDOW, SERIAL_GSI,
};
use crate::machine::pc::memmap::BIOS_AREA;
use crate::pci::cf8::PCI_CONFIG_IO_LEN;
use crate::pci::regs::PCI_CONFIG_ADDRESS_PORT;

/// OEMID of every table.
pub const OEM_ID: [u8; 6] = *b"EXITLS";
/// OEM Table ID of every table.
pub const OEM_TABLE_ID: [u8; 8] = *b"EXITLESS";
const OEM_REVISION: u32 = 1;

/// The system control interrupt's ISA IRQ (and GSI), as on PCs. Nothing raises it: no fixed
/// event is modelled, but the FADT must name one.
const SCI_IRQ: u8 = 9;

/// Why the tables could not be written.
#[derive(Debug, thiserror::Error)]
pub enum AcpiError {
    /// More table bytes than the BIOS area holds.
    #[error("the ACPI tables need {need} bytes; the BIOS area holds {room}")]
    TooLarge {
        /// Bytes needed, alignment included.
        need: u64,
        /// Bytes of the area.
        room: u64,
    },
    /// Writing guest memory failed.
    #[error("writing the ACPI tables failed: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
}

/// What the tables describe.
#[derive(Debug)]
pub struct AcpiTables<'a> {
    /// The guest-physical map: ECAM and the PCI windows.
    pub layout: &'a MemoryLayout,
    /// vCPUs, one local APIC each, APIC IDs from 0.
    pub vcpus: u8,
    /// Complete tables (header and checksum included) that other parts of the machine
    /// describe themselves with, listed in the XSDT after the standard ones. This is where an
    /// IOMMU's DMAR table goes.
    pub extra: &'a [Vec<u8>],
    /// Whether the machine has the dual 8259 PICs: the MADT's PCAT_COMPAT flag.
    pub pics: bool,
}

/// An MADT Interrupt Source Override (ACPI 6.5 §5.2.12.5): ISA IRQ `source` arrives at GSI
/// `gsi` with the polarity and trigger mode of `flags` (MPS INTI flags, table 5.26).
#[repr(C, packed)]
#[derive(Clone, Copy, IntoBytes, Immutable)]
struct InterruptSourceOverride {
    kind: u8,
    length: u8,
    bus: u8,
    source: u8,
    gsi: U32,
    flags: U16,
}

impl InterruptSourceOverride {
    fn new(source: u8, gsi: u32, flags: u16) -> Self {
        InterruptSourceOverride {
            kind: 2,
            length: 10,
            bus: 0, // ISA
            source,
            gsi: gsi.into(),
            flags: flags.into(),
        }
    }
}

/// MPS INTI flags: polarity and trigger as the bus defines them (ISA: high, edge).
const INTI_CONFORMS: u16 = 0;
/// MPS INTI flags: active high, level-triggered (the SCI, ACPI 6.5 §5.2.9 SCI_INT).
const INTI_HIGH_LEVEL: u16 = 0b01 | 0b11 << 2;

/// An MADT Local APIC NMI structure (ACPI 6.5 §5.2.12.7): the NMI arrives on LINT`lint` of
/// every processor (UID 0xFF).
#[repr(C, packed)]
#[derive(Clone, Copy, IntoBytes, Immutable)]
struct LocalApicNmi {
    kind: u8,
    length: u8,
    uid: u8,
    flags: U16,
    lint: u8,
}

macro_rules! aml_from_bytes {
    ($($t:ty),*) => {$(
        impl Aml for $t {
            fn to_aml_bytes(&self, sink: &mut dyn AmlSink) {
                sink.vec(self.as_bytes());
            }
        }
    )*};
}
aml_from_bytes!(InterruptSourceOverride, LocalApicNmi);

/// MADT flag PCAT_COMPAT: the machine also has dual 8259 PICs (KVM's irqchip does).
const MADT_PCAT_COMPAT: u32 = 1;
/// Offset of the MADT's flags (after the header and the local APIC address).
const MADT_FLAGS_OFFSET: usize = 40;
/// Offset of the checksum in every table header (ACPI 6.5 §5.2.6).
const CHECKSUM_OFFSET: usize = 9;

/// IA-PC boot architecture flags (ACPI 6.5 §5.2.9.3): ISA devices (the UART, the RTC) are
/// there, no VGA; CMOS RTC Not Present (bit 5) stays clear. The 8042 flag stays clear: only
/// its reset command is modelled.
const IAPC_LEGACY_DEVICES: u16 = 1 << 0;
const IAPC_VGA_NOT_PRESENT: u16 = 1 << 2;
/// P_LVL2_LAT above 100 and P_LVL3_LAT above 1000 say C2 and C3 are not supported.
const NO_C2: u16 = 101;
const NO_C3: u16 = 1001;

/// Bytes of `table` as AML.
fn bytes(table: &dyn Aml) -> Vec<u8> {
    let mut v = Vec::new();
    table.to_aml_bytes(&mut v);
    v
}

/// Make the bytes of `table` sum to zero again after a change.
fn fix_checksum(table: &mut [u8]) {
    table[CHECKSUM_OFFSET] = 0;
    let sum = table.iter().fold(0u8, |s, &b| s.wrapping_add(b));
    table[CHECKSUM_OFFSET] = sum.wrapping_neg();
}

/// A system I/O register of `bits` bits at `port`, as the FADT's extended fields give it.
fn io_register(port: u16, bits: u8) -> GAS {
    GAS::new(
        GasSpace::SystemIo,
        bits,
        0,
        AccessSize::Undefined,
        port.into(),
    )
}

/// The DSDT: the host bridge, COM1, the RTC, the pvpanic port, the virtio-mmio devices, the
/// motherboard's own resources, and `\_S3` and `\_S5`. Each device is named by its full path under `\_SB` (predefined, ACPI 6.5 §5.3.1).
fn dsdt(layout: &MemoryLayout) -> Vec<u8> {
    // Revision 2: integers are 64 bits.
    let mut table = Sdt::new(*b"DSDT", 36, 2, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    host_bridge(layout, &mut table);
    com1(&mut table);
    rtc(&mut table);
    pvpanic(&mut table);
    virtio_mmio(layout, &mut table);
    motherboard_resources(layout, &mut table);
    // \_S3 and \_S5: the SLP_TYP values for PM1a and PM1b control, then two reserved (ACPI
    // 6.5 §7.4.2); the values `devices::acpi_pm` decodes.
    for (name, typ) in [("_S3_", S3_SLP_TYP), ("_S5_", S5_SLP_TYP)] {
        Name::new(name.into(), &Package::new(vec![&typ, &ZERO, &ZERO, &ZERO]))
            .to_aml_bytes(&mut table);
    }
    table.update_checksum();
    table.as_slice().to_vec()
}

/// `\_SB.PCI0`, PCI Firmware 3.3 §4.1: a PCI Express host bridge, compatible with a PCI one,
/// decoding bus 0, the configuration ports and the BAR windows: the 32-bit one, and on a
/// machine with RAM above 4 GiB the 64-bit one above RAM (a QWordMemory, ACPI 6.5 §6.4.3.5.1),
/// where the 64-bit BARs are. That one is marked cacheable, as QEMU's q35 marks its own, not
/// prefetchable: Linux will not claim a non-prefetchable BAR (virtio's, whose ISR status is
/// read-to-clear) inside a window flagged prefetchable (pci_find_parent_resource).
fn host_bridge(layout: &MemoryLayout, table: &mut dyn AmlSink) {
    let (mmio_start, mmio_end) = PCI_MMIO_WINDOW;
    let mmio = AddressSpace::new_memory(
        AddressSpaceCacheable::NotCacheable,
        true,
        u32::try_from(mmio_start).expect("a 32-bit window"),
        u32::try_from(mmio_end - 1).expect("a 32-bit window"),
        None,
    );
    let mmio64 = layout.mmio64_window().map(|(start, end)| {
        AddressSpace::new_memory(AddressSpaceCacheable::Cacheable, true, start, end - 1, None)
    });
    let io = AddressSpace::new_io(PCI_IO_BASE, PCI_IO_BASE + (PCI_IO_LEN - 1), None);
    let buses = AddressSpace::new_bus_number(0u16, ECAM_LAST_BUS.into());
    let config_ports = IO::new(
        PCI_CONFIG_ADDRESS_PORT,
        PCI_CONFIG_ADDRESS_PORT,
        1,
        u8::try_from(PCI_CONFIG_IO_LEN).expect("8 ports"),
    );
    let mut resources: Vec<&dyn Aml> = vec![&buses, &config_ports, &io, &mmio];
    if let Some(mmio64) = &mmio64 {
        resources.push(mmio64);
    }
    Device::new(
        "\\_SB_.PCI0".into(),
        vec![
            &Name::new("_HID".into(), &EISAName::new("PNP0A08")),
            &Name::new("_CID".into(), &EISAName::new("PNP0A03")),
            &Name::new("_ADR".into(), &ZERO),
            &Name::new("_SEG".into(), &ZERO),
            &Name::new("_UID".into(), &ZERO),
            &Name::new("_BBN".into(), &ZERO),
            &Name::new("_CRS".into(), &ResourceTemplate::new(resources)),
        ],
    )
    .to_aml_bytes(table);
}

/// `\_SB.COM1`: the 16550A-compatible UART at COM1's ports and GSI.
fn com1(table: &mut dyn AmlSink) {
    let uart_ports = IO::new(
        PORT_SERIAL,
        PORT_SERIAL,
        1,
        u8::try_from(SERIAL_PORT_LEN).expect("8 ports"),
    );
    let uart_irq = Interrupt::new(true, true, false, false, SERIAL_GSI);
    Device::new(
        "\\_SB_.COM1".into(),
        vec![
            &Name::new("_HID".into(), &EISAName::new("PNP0501")),
            &Name::new("_UID".into(), &ZERO),
            &Name::new(
                "_CRS".into(),
                &ResourceTemplate::new(vec![&uart_ports, &uart_irq]),
            ),
        ],
    )
    .to_aml_bytes(table);
}

/// `\_SB.RTC`: the MC146818-compatible RTC (PNP0B00) at ports 0x70..0x71 on ISA IRQ 8.
fn rtc(table: &mut dyn AmlSink) {
    let ports = IO::new(
        RTC_PORT,
        RTC_PORT,
        1,
        u8::try_from(RTC_PORTS_LEN).expect("2 ports"),
    );
    let irq = Interrupt::new(true, true, false, false, RTC_IRQ);
    Device::new(
        "\\_SB_.RTC_".into(),
        vec![
            &Name::new("_HID".into(), &EISAName::new("PNP0B00")),
            &Name::new("_CRS".into(), &ResourceTemplate::new(vec![&ports, &irq])),
        ],
    )
    .to_aml_bytes(table);
}

/// `\_SB.PEVT`: QEMU's pvpanic port, under the ID Linux's pvpanic-mmio driver matches (QEMU
/// names its own so); the driver takes the port from `_CRS`.
fn pvpanic(table: &mut dyn AmlSink) {
    let port = IO::new(
        PVPANIC_PORT,
        PVPANIC_PORT,
        1,
        u8::try_from(PVPANIC_LEN).expect("1 port"),
    );
    Device::new(
        "\\_SB_.PEVT".into(),
        vec![
            &Name::new("_HID".into(), &PVPANIC_HID),
            &Name::new("_CRS".into(), &ResourceTemplate::new(vec![&port])),
        ],
    )
    .to_aml_bytes(table);
}

/// `\_SB.VRn`: the `n`th virtio-mmio device, its register window and its line, under the
/// hardware ID Linux's virtio_mmio driver matches (`LNRO0005`, as QEMU's microvm and Firecracker
/// describe theirs), so a guest finds them without `virtio_mmio.device=` on its command line
/// (which Debian's kernels do not build in). The line is level-triggered, active high: the
/// transport holds it until the guest's InterruptACK (virtio 1.2 §4.2.2).
fn virtio_mmio(layout: &MemoryLayout, table: &mut dyn AmlSink) {
    for (n, slot) in layout.virtio_mmio().iter().enumerate() {
        let window = Memory32Fixed::new(
            true,
            u32::try_from(slot.base).expect("virtio-mmio windows are below 4 GiB"),
            u32::try_from(slot.size).expect("a window of 8 KiB"),
        );
        let line = Interrupt::new(true, false, false, false, slot.gsi);
        let uid = u32::try_from(n).expect("a few slots");
        Device::new(
            format!("\\_SB_.VR{n:02X}").as_str().into(),
            vec![
                &Name::new("_HID".into(), &VIRTIO_MMIO_HID),
                &Name::new("_UID".into(), &uid),
                &Name::new("_CRS".into(), &ResourceTemplate::new(vec![&window, &line])),
            ],
        )
        .to_aml_bytes(table);
    }
}

/// The ACPI hardware ID of a virtio-mmio device (Linaro's vendor prefix).
const VIRTIO_MMIO_HID: &str = "LNRO0005";

/// `\_SB.MRES`: resources the motherboard decodes outside any device's, the power-management
/// block and the ECAM window (PCI Firmware 3.3 §4.1.2 asks for it here).
fn motherboard_resources(layout: &MemoryLayout, table: &mut dyn AmlSink) {
    let pm = IO::new(
        PM_BASE,
        PM_BASE,
        1,
        u8::try_from(PM_BLOCK_LEN).expect("12 ports"),
    );
    let ecam = layout.ecam_base().map(|base| {
        Memory32Fixed::new(
            false,
            u32::try_from(base).expect("ECAM below 4 GiB"),
            u32::try_from(ECAM_SIZE).expect("1 MiB"),
        )
    });
    let mut resources: Vec<&dyn Aml> = vec![&pm];
    if let Some(ecam) = &ecam {
        resources.push(ecam);
    }
    Device::new(
        "\\_SB_.MRES".into(),
        vec![
            &Name::new("_HID".into(), &EISAName::new("PNP0C02")),
            &Name::new("_UID".into(), &ZERO),
            &Name::new("_CRS".into(), &ResourceTemplate::new(resources)),
        ],
    )
    .to_aml_bytes(table);
}

/// The FADT: the fixed-hardware registers of `devices::acpi_pm`, the reset register, and the
/// FACS and DSDT at the addresses given.
fn fadt(facs: u64, dsdt: u64) -> Vec<u8> {
    let port = |offset: u16| PM_BASE + offset;
    let mut f = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION)
        .firmware_ctrl_64(facs)
        .dsdt_64(dsdt)
        // WBINVD works; C1 (hlt) on every CPU; the power and sleep buttons are not fixed
        // hardware (there are none); the reset register below is there.
        .flag(Flags::Wbinvd)
        .flag(Flags::ProcC1)
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton)
        .flag(Flags::ResetRegSup);
    // FIRMWARE_CTRL too, the FACS being below 4 GiB (§5.2.9: a guest may read only it); the
    // builder's 64-bit setter clears it.
    f.firmware_ctrl = u32::try_from(facs)
        .expect("the FACS is in the BIOS area")
        .into();
    // The RTC's century byte (§5.2.9, CENTURY: its CMOS index).
    f.century = CENTURY_INDEX;
    f.sci_int = u16::from(SCI_IRQ).into();
    // No SMI_CMD port: the machine is in ACPI mode from the start (§5.2.9, SMI_CMD).
    f.pm1a_evt_blk = u32::from(port(PM1_EVT_OFFSET)).into();
    f.pm1a_cnt_blk = u32::from(port(PM1_CNT_OFFSET)).into();
    f.pm_tmr_blk = u32::from(port(PM_TMR_OFFSET)).into();
    (f.pm1_evt_len, f.pm1_cnt_len, f.pm_tmr_len) = (PM1_EVT_LEN, PM1_CNT_LEN, PM_TMR_LEN);
    f.x_pm1a_evt_blk = io_register(port(PM1_EVT_OFFSET), PM1_EVT_LEN * 8);
    f.x_pm1a_cnt_blk = io_register(port(PM1_CNT_OFFSET), PM1_CNT_LEN * 8);
    f.x_pm_tmr_blk = io_register(port(PM_TMR_OFFSET), PM_TMR_LEN * 8);
    f.p_lvl2_lat = NO_C2.into();
    f.p_lvl3_lat = NO_C3.into();
    f.iapc_boot_arch = (IAPC_LEGACY_DEVICES | IAPC_VGA_NOT_PRESENT).into();
    f.reset_reg = GAS::new(
        GasSpace::SystemIo,
        8,
        0,
        AccessSize::ByteAccess,
        RESET_CONTROL_PORT.into(),
    );
    f.reset_value = RESET_VALUE;
    bytes(&f.finalize())
}

/// The MADT: one enabled local APIC per vCPU (UID and APIC ID = its index), the IOAPIC with
/// GSIs from 0, IRQ 0 (the PIT) on GSI 2 and the SCI level-triggered, NMIs on LINT1;
/// PCAT_COMPAT if the machine has `pics` (not under a split irqchip, which has none).
fn madt(vcpus: u8, pics: bool) -> Vec<u8> {
    let lapic = u32::try_from(LAPIC_BASE).expect("below 4 GiB");
    let mut m = MADT::new(
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
        LocalInterruptController::Address(lapic),
    );
    for i in 0..vcpus {
        m.add_structure(ProcessorLocalApic::new(i, i, EnabledStatus::Enabled));
    }
    let ioapic = u32::try_from(IOAPIC_BASE).expect("below 4 GiB");
    m.add_structure(IoApic::new(IOAPIC_ID, ioapic, 0));
    m.add_structure(InterruptSourceOverride::new(0, 2, INTI_CONFORMS));
    m.add_structure(InterruptSourceOverride::new(
        SCI_IRQ,
        SCI_IRQ.into(),
        INTI_HIGH_LEVEL,
    ));
    m.add_structure(LocalApicNmi {
        kind: 4,
        length: 6,
        uid: 0xff,
        flags: INTI_CONFORMS.into(),
        lint: 1,
    });
    let mut table = bytes(&m);
    let flags = if pics { MADT_PCAT_COMPAT } else { 0 };
    table[MADT_FLAGS_OFFSET..MADT_FLAGS_OFFSET + 4].copy_from_slice(&flags.to_le_bytes());
    fix_checksum(&mut table);
    table
}

/// The MCFG: one ECAM range for segment 0, buses 0 to `ECAM_LAST_BUS`.
fn mcfg(base: u64) -> Vec<u8> {
    let mut m = MCFG::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    m.add_ecam(base, 0, 0, ECAM_LAST_BUS);
    bytes(&m)
}

/// Hands out addresses in the BIOS area.
struct Placer {
    next: u64,
}

impl Placer {
    /// Room for `len` bytes aligned to `align`.
    fn place(&mut self, len: usize, align: u64) -> Result<u64, AcpiError> {
        let at = self.next.next_multiple_of(align);
        let end = at + len as u64;
        if end > BIOS_AREA.end {
            return Err(AcpiError::TooLarge {
                need: end - BIOS_AREA.start,
                room: BIOS_AREA.len(),
            });
        }
        self.next = end;
        Ok(at)
    }
}

/// Tables go on 16-byte boundaries (the RSDP must, §5.2.5.1); the FACS on a 64-byte one
/// (§5.2.10).
const TABLE_ALIGN: u64 = 16;
const FACS_ALIGN: u64 = 64;
/// Where the FACS goes: right after the RSDP (36 bytes) at the start of the BIOS area, on the
/// next 64-byte boundary.
pub const FACS_ADDR: u64 = BIOS_AREA.start + FACS_ALIGN;

impl AcpiTables<'_> {
    /// Build the tables and write them into the BIOS area of `mem`; returns the RSDP's address.
    pub fn write(&self, mem: &GuestMemoryMmap) -> Result<u64, AcpiError> {
        let mut placer = Placer {
            next: BIOS_AREA.start,
        };
        // The RSDP first, where a scan finds it first; the FACS next, at the address
        // `devices::acpi_pm` reads the waking vector from.
        let rsdp_at = placer.place(Rsdp::len(), TABLE_ALIGN)?;
        let facs = placer.place(FACS::len(), FACS_ALIGN)?;
        debug_assert_eq!(facs, FACS_ADDR);
        let mut tables = vec![(facs, bytes(&FACS::new()))];
        let mut place = |table: Vec<u8>, align| -> Result<u64, AcpiError> {
            let at = placer.place(table.len(), align)?;
            tables.push((at, table));
            Ok(at)
        };
        let dsdt = place(dsdt(self.layout), TABLE_ALIGN)?;
        let mut listed = vec![place(fadt(facs, dsdt), TABLE_ALIGN)?];
        listed.push(place(madt(self.vcpus, self.pics), TABLE_ALIGN)?);
        if let Some(base) = self.layout.ecam_base() {
            listed.push(place(mcfg(base), TABLE_ALIGN)?);
        }
        for table in self.extra {
            listed.push(place(table.clone(), TABLE_ALIGN)?);
        }
        let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
        for &at in &listed {
            xsdt.add_entry(at);
        }
        let xsdt = place(bytes(&xsdt), TABLE_ALIGN)?;
        tables.push((rsdp_at, bytes(&Rsdp::new(OEM_ID, xsdt))));
        for (at, table) in tables {
            mem.write_slice(&table, GuestAddress(at))?;
        }
        Ok(rsdp_at)
    }
}

#[cfg(test)]
mod tests;
