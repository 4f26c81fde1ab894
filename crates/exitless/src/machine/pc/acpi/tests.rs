use super::*;
use std::collections::BTreeMap;

/// The tables as a guest finds them: from the RSDP through the XSDT, every checksum
/// checked; by signature.
fn walk(mem: &GuestMemoryMmap, rsdp: u64) -> BTreeMap<String, Vec<u8>> {
    let read = |at: u64, len: usize| {
        let mut v = vec![0u8; len];
        mem.read_slice(&mut v, GuestAddress(at)).unwrap();
        v
    };
    let sums = |v: &[u8]| v.iter().fold(0u8, |s, &b| s.wrapping_add(b)) == 0;
    let r = read(rsdp, 36);
    assert_eq!(&r[..8], b"RSD PTR ");
    assert!(sums(&r[..20]) && sums(&r), "RSDP checksums");
    assert_eq!(r[15], 2, "revision 2: XSDT");
    let table = |at: u64| {
        let len = u32::from_le_bytes(read(at + 4, 4).try_into().unwrap());
        let t = read(at, len as usize);
        assert!(sums(&t), "{} checksum", String::from_utf8_lossy(&t[..4]));
        t
    };
    let u64_at = |v: &[u8], o: usize| u64::from_le_bytes(v[o..o + 8].try_into().unwrap());
    let xsdt = table(u64_at(&r, 24));
    assert_eq!(&xsdt[..4], b"XSDT");
    let mut found = BTreeMap::new();
    for entry in xsdt[36..].chunks(8) {
        let t = table(u64::from_le_bytes(entry.try_into().unwrap()));
        if &t[..4] == b"FACP" {
            found.insert("DSDT".into(), table(u64_at(&t, 140)));
            let facs = read(u64_at(&t, 132), 64);
            assert_eq!(&facs[..4], b"FACS");
        }
        found.insert(String::from_utf8_lossy(&t[..4]).into_owned(), t);
    }
    found
}

fn written(ecam: bool, vcpus: u8, extra: &[Vec<u8>]) -> BTreeMap<String, Vec<u8>> {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
    let layout = MemoryLayout::new(2 << 20, ecam).unwrap();
    let tables = AcpiTables {
        layout: &layout,
        vcpus,
        extra,
        pics: true,
    };
    let rsdp = tables.write(&mem).unwrap();
    assert_eq!(rsdp, BIOS_AREA.start, "where a scan finds it first");
    walk(&mem, rsdp)
}

fn u32_at(v: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(v[o..o + 4].try_into().unwrap())
}

#[test]
fn the_fadt_points_at_the_pm_block_and_the_reset_register() {
    let t = written(true, 1, &[]);
    let fadt = &t["FACP"];
    assert_eq!(u32_at(fadt, 64), 0x604, "PM1a_CNT_BLK");
    assert_eq!(u32_at(fadt, 76), 0x608, "PM_TMR_BLK, where QEMU has it");
    assert_eq!((fadt[88], fadt[89], fadt[91]), (4, 2, 4), "block lengths");
    assert_eq!(u32_at(fadt, 112) & (1 << 8), 0, "24-bit timer");
    assert_eq!(fadt[116], 1, "RESET_REG in system I/O");
    assert_eq!(
        u64::from_le_bytes(fadt[120..128].try_into().unwrap()),
        0xcf9
    );
    assert_eq!(fadt[128], 6, "RESET_VALUE");
    let dsdt = &t["DSDT"];
    let pnp0a08 = [0x41, 0xd0, 0x0a, 0x08];
    assert!(dsdt.windows(4).any(|w| w == pnp0a08), "a PCIe host bridge");
    assert!(dsdt.windows(4).any(|w| w == b"_S5_"));
}

#[test]
fn the_madt_has_a_local_apic_per_vcpu_the_ioapic_and_the_pit_override() {
    let madt = &written(false, 3, &[])["APIC"];
    assert_eq!(u32_at(madt, 36), 0xfee0_0000);
    assert_eq!(u32_at(madt, 40), MADT_PCAT_COMPAT);
    let mut entries = Vec::new();
    let mut at = 44;
    while at < madt.len() {
        entries.push(&madt[at..at + usize::from(madt[at + 1])]);
        at += usize::from(madt[at + 1]);
    }
    let lapics: Vec<_> = entries.iter().filter(|e| e[0] == 0).collect();
    assert_eq!(lapics.len(), 3);
    assert!(
        lapics
            .iter()
            .enumerate()
            .all(|(i, e)| usize::from(e[3]) == i && e[4] == 1)
    );
    let ioapic = entries.iter().find(|e| e[0] == 1).expect("an IOAPIC");
    assert_eq!(u32_at(ioapic, 4), 0xfec0_0000);
    assert!(
        entries
            .iter()
            .any(|e| e[0] == 2 && e[3] == 0 && u32_at(e, 4) == 2),
        "IRQ 0 → GSI 2"
    );
}

#[test]
fn the_mcfg_is_there_exactly_when_ecam_is_described() {
    let mcfg = &written(true, 1, &[])["MCFG"];
    assert_eq!(
        u64::from_le_bytes(mcfg[44..52].try_into().unwrap()),
        crate::machine::layout::ECAM_BASE
    );
    assert_eq!((mcfg[54], mcfg[55]), (0, ECAM_LAST_BUS), "buses");
    assert!(!written(false, 1, &[]).contains_key("MCFG"));
}

#[test]
fn extra_tables_are_listed_as_given() {
    // A DMAR's bytes as the IOMMU would hand them over: any complete table.
    let mut dmar = Sdt::new(*b"DMAR", 48, 1, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    dmar.write_u8(36, 38); // host address width - 1
    let t = written(true, 1, &[dmar.as_slice().to_vec()]);
    assert_eq!(t["DMAR"], dmar.as_slice());
}

#[test]
fn tables_that_outgrow_the_bios_area_are_refused() {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
    let layout = MemoryLayout::new(2 << 20, true).unwrap();
    let huge = vec![
        Sdt::new(*b"OEMX", 0x2_0000, 1, OEM_ID, OEM_TABLE_ID, 1)
            .as_slice()
            .to_vec(),
    ];
    let e = AcpiTables {
        layout: &layout,
        vcpus: 1,
        extra: &huge,
        pics: true,
    }
    .write(&mem)
    .expect_err("128 KiB of extra tables");
    assert!(e.to_string().contains("BIOS area holds 131072"), "{e}");
}

/// The first element of the package `name` is bound to, as an integer (OneOp, ZeroOp, or a
/// byte or word constant, ACPI 6.5 §20.2.3).
fn first_package_integer(dsdt: &[u8], name: &[u8; 4]) -> u64 {
    let at = dsdt.windows(4).position(|w| w == name).expect("named") + 4;
    assert_eq!(dsdt[at], 0x12, "PackageOp");
    let element = &dsdt[at + 3..];
    match element[0] {
        0x00 => 0,
        0x01 => 1,
        0x0a => element[1].into(),
        0x0b => u16::from_le_bytes([element[1], element[2]]).into(),
        op => panic!("unexpected opcode {op:#x}"),
    }
}

#[test]
fn firmware_ctrl_the_century_byte_the_rtc_and_s3_are_described() {
    let t = written(false, 1, &[]);
    let fadt = &t["FACP"];
    // A guest reading only the 32-bit FIRMWARE_CTRL (offset 36) finds the FACS there too.
    assert_eq!(u64::from(u32_at(fadt, 36)), FACS_ADDR, "FIRMWARE_CTRL");
    assert_eq!(
        u64::from_le_bytes(fadt[132..140].try_into().unwrap()),
        FACS_ADDR,
        "X_FIRMWARE_CTRL"
    );
    assert_eq!(fadt[108], 0x32, "CENTURY: the RTC's CMOS index");
    assert_eq!(fadt[109] & (1 << 5), 0, "CMOS RTC Not Present is clear");
    let dsdt = &t["DSDT"];
    let pnp0b00 = [0x41, 0xd0, 0x0b, 0x00];
    assert!(dsdt.windows(4).any(|w| w == pnp0b00), "an RTC");
    assert_eq!(first_package_integer(dsdt, b"_S3_"), u64::from(S3_SLP_TYP));
    assert_eq!(first_package_integer(dsdt, b"_S5_"), u64::from(S5_SLP_TYP));
}

/// The QWord memory descriptors (ACPI 6.5 §6.4.3.5.1: tag 0x8A, length 0x2B, type 0) of a
/// table, as `(min, max)`.
fn qword_memory_ranges(table: &[u8]) -> Vec<(u64, u64)> {
    let u64_at = |o: usize| u64::from_le_bytes(table[o..o + 8].try_into().unwrap());
    table
        .windows(4)
        .enumerate()
        .filter(|(_, w)| *w == [0x8a, 0x2b, 0, 0])
        .map(|(at, _)| (u64_at(at + 14), u64_at(at + 22)))
        .collect()
}

#[test]
fn with_ram_past_4_gib_the_host_bridge_has_a_64_bit_window_above_it() {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
    let dsdt = |mib: usize| {
        let layout = MemoryLayout::new(mib << 20, true).unwrap();
        let tables = AcpiTables {
            layout: &layout,
            vcpus: 1,
            extra: &[],
            pics: true,
        };
        walk(&mem, tables.write(&mem).unwrap())["DSDT"].clone()
    };
    assert_eq!(
        qword_memory_ranges(&dsdt(3072)),
        vec![],
        "none below the hole"
    );
    let window = MemoryLayout::new(4608 << 20, true)
        .unwrap()
        .mmio64_window()
        .unwrap();
    assert_eq!(
        qword_memory_ranges(&dsdt(4608)),
        vec![(window.0, window.1 - 1)]
    );
    assert!(window.0 >= 0x1_6000_0000, "above RAM");
}

#[test]
fn without_pics_the_madt_clears_pcat_compat() {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
    let layout = MemoryLayout::new(2 << 20, false).unwrap();
    let tables = AcpiTables {
        layout: &layout,
        vcpus: 1,
        extra: &[],
        pics: false,
    };
    let madt = &walk(&mem, tables.write(&mem).unwrap())["APIC"];
    assert_eq!(u32_at(madt, 40), 0, "no dual 8259s under a split irqchip");
}

/// The Memory32Fixed descriptors (ACPI 6.5 §6.4.3.4: tag 0x86, length 9) of a table, as
/// `(writable, base, length)`, and its Extended Interrupt descriptors (§6.4.3.6: tag 0x89,
/// length 6, one interrupt) as `(flags, number)`.
fn memory32_fixed_ranges(table: &[u8]) -> Vec<(bool, u32, u32)> {
    table
        .windows(3)
        .enumerate()
        .filter(|(_, w)| *w == [0x86, 9, 0])
        .map(|(at, _)| {
            (
                table[at + 3] == 1,
                u32_at(table, at + 4),
                u32_at(table, at + 8),
            )
        })
        .collect()
}

fn extended_interrupts(table: &[u8]) -> Vec<(u8, u32)> {
    table
        .windows(3)
        .enumerate()
        .filter(|(_, w)| *w == [0x89, 6, 0])
        .map(|(at, _)| (table[at + 3], u32_at(table, at + 5)))
        .collect()
}

#[test]
fn each_virtio_mmio_window_is_a_device_linux_matches_with_its_level_triggered_line() {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
    let mut layout = MemoryLayout::new(2 << 20, false).unwrap();
    let slots = [
        layout.allocate_virtio_mmio().unwrap(),
        layout.allocate_virtio_mmio().unwrap(),
    ];
    let tables = AcpiTables {
        layout: &layout,
        vcpus: 1,
        extra: &[],
        pics: true,
    };
    let dsdt = &walk(&mem, tables.write(&mem).unwrap())["DSDT"];
    let hid = b"LNRO0005\0";
    let hids = dsdt.windows(hid.len()).filter(|w| w == hid).count();
    assert_eq!(hids, 2, "one virtio-mmio device per slot");
    for (n, name) in [b"VR00", b"VR01"].iter().enumerate() {
        assert!(dsdt.windows(4).any(|w| w == *name), "device {n} named");
    }
    let windows = memory32_fixed_ranges(dsdt);
    let lines = extended_interrupts(dsdt);
    for slot in slots {
        let window = (
            true,
            u32::try_from(slot.base).unwrap(),
            u32::try_from(slot.size).unwrap(),
        );
        assert!(windows.contains(&window), "{window:x?} in {windows:x?}");
        // Consumer, level-triggered, active high, exclusive: as the transport's line works.
        assert!(
            lines.contains(&(0b0001, slot.gsi)),
            "GSI {} in {lines:?}",
            slot.gsi
        );
    }
    // Without virtio-mmio devices, none is described.
    let empty = written(false, 1, &[]);
    assert!(!empty["DSDT"].windows(hid.len()).any(|w| w == hid));
}

#[test]
fn the_pvpanic_port_is_a_device_linux_matches_with_its_port() {
    let dsdt = &written(false, 1, &[])["DSDT"];
    assert!(dsdt.windows(9).any(|w| w == b"QEMU0001\0"), "its _HID");
    // An I/O port descriptor (ACPI 6.5 §6.4.2.5): 16-bit decode, 0x505 to 0x505, one port.
    let port = [0x47, 0x01, 0x05, 0x05, 0x05, 0x05, 0x01, 0x01];
    assert!(dsdt.windows(port.len()).any(|w| w == port), "its _CRS");
}
