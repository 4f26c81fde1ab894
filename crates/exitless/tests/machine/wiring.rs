//! The wiring registers every device with what a snapshot keeps of it: on a machine with every
//! kind of device, each name on the buses is saved under its own name, or inside a device that
//! is, or is one of the few that hold no state; and only the probe's machines show its test
//! endpoints.

use std::collections::BTreeSet;
use std::sync::Arc;

use exitless::machine::wiring::{self, Kept, names};
use exitless::machine::{
    DiskConfig, MachineConfig, MemoryLayout, Platform, ProbeConfig, Transport, VirtioNetConfig,
};
use exitless::pci::regs::{PCI_CONFIG_ADDRESS_PORT, PCI_CONFIG_DATA_PORT};
use exitless::virtio::notify::NotifyPath;
use exitless::vm::run_control::RunControl;
use exitless::vm::{Irqchip, RamBacking, Vm};

fn wired(cfg: &MachineConfig) -> (Vm, wiring::Devices) {
    let mut layout = MemoryLayout::new(cfg.ram_size, cfg.ecam.is_some()).unwrap();
    let irqchip = match cfg.split_irqchip {
        true => Irqchip::Split {
            pins: exitless::irq::ioapic::PINS,
        },
        false => Irqchip::InKernel,
    };
    let mut vm =
        Vm::with_irqchip(&layout.ram_regions(), false, irqchip, RamBacking::Private).unwrap();
    let control = Arc::new(RunControl::default());
    let devices = wiring::wire(&mut vm, &mut layout, cfg, &control, Default::default()).unwrap();
    (vm, devices)
}

/// A disk image of 1 MiB in a fresh folder.
fn image(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("exitless-wiring-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::File::create(&path)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    path
}

/// The vendor and device ID dword of `dd:f` on bus 0, through CF8/CFC.
fn id_of(devices: &wiring::Devices, device: u8, function: u8) -> u32 {
    let address = 0x8000_0000u32 | u32::from(device) << 11 | u32::from(function) << 8;
    let pio = &devices.io.pio;
    pio.write(PCI_CONFIG_ADDRESS_PORT.into(), &address.to_le_bytes());
    let mut id = [0u8; 4];
    pio.read(PCI_CONFIG_DATA_PORT.into(), &mut id);
    u32::from_le_bytes(id)
}

#[test]
fn every_device_on_a_bus_is_in_the_snapshot_or_inside_one_that_is() {
    let mut mmio_disk = DiskConfig::new(image("mmio.img"));
    mmio_disk.transport = Transport::Mmio;
    let pci_disk = DiskConfig::new(image("pci.img"));
    let cfg = MachineConfig {
        platform: Some(Platform {
            fw_cfg_files: Vec::new(),
        }),
        iommu: true,
        split_irqchip: true,
        virtio: vec![
            VirtioNetConfig::new(Transport::Mmio, NotifyPath::Datamatch),
            VirtioNetConfig::new(Transport::Pci, NotifyPath::Address),
        ],
        disks: vec![mmio_disk, pci_disk],
        ..MachineConfig::default()
    };
    let (_vm, devices) = wired(&cfg);
    let saved: BTreeSet<&str> = devices.persist.iter().map(|(id, _)| id.as_str()).collect();
    let mut stateless = BTreeSet::new();
    for name in &devices.io.names {
        let kept = devices.kept.iter().find(|(n, _)| n == name);
        match kept.map(|(_, kept)| kept) {
            None => panic!("{name} is on a bus but was not registered"),
            Some(Kept::Saved(_)) => assert!(saved.contains(name.as_str()), "{name}"),
            Some(Kept::Within(owner)) => {
                assert!(
                    saved.contains(owner),
                    "{name}'s state is in {owner}, not saved"
                )
            }
            Some(Kept::Nothing) => {
                stateless.insert(name.as_str());
            }
        }
    }
    // Every kind of device is there: the wiring gave each a name on the buses.
    for name in [
        names::SERIAL,
        names::FW_CFG,
        names::ACPI_PM,
        names::RTC,
        // The machine has a split irqchip: KVM gives it no PIT, exitless its own.
        names::PIT,
        names::PORT_B,
        names::IOMMU,
        names::IOAPIC,
        names::PCI_PIO,
        names::PCI_ECAM,
        names::PCI_BARS,
        "virtio-mmio.0",
        "virtio-mmio.1",
        "virtio-pci.00:03.0",
        "virtio-pci.00:04.0",
    ] {
        assert!(devices.io.names.iter().any(|n| n == name), "{name} missing");
    }
    // Only these hold nothing a guest can see change: the debug exit, the i8042's reset, the
    // panic port and the ports that float.
    let mut expected = BTreeSet::from([
        names::DEBUG_EXIT,
        names::I8042,
        names::PVPANIC,
        names::DMA_PAGE,
        names::SUPER_IO,
        names::SUPER_IO_ALTERNATE,
    ]);
    expected.extend(names::ABSENT_UARTS);
    assert_eq!(stateless, expected, "a device registered as stateless");
    // What sits behind another's ports is saved too.
    for id in [names::PCI_ROOT, names::RESET_CONTROL] {
        assert!(saved.contains(id), "{id}");
    }
}

#[test]
fn only_the_probes_machines_have_its_test_endpoints() {
    let (_vm, plain) = wired(&MachineConfig::default());
    // The host bridge, and nothing at 00:01.0 (all ones: no function there).
    assert_ne!(id_of(&plain, 0, 0), u32::MAX);
    assert_eq!(id_of(&plain, 1, 0), u32::MAX);
    let (_vm, probe) = wired(&ProbeConfig::default().machine());
    for (device, function) in [(1, 0), (2, 0), (2, 1)] {
        assert_ne!(
            id_of(&probe, device, function),
            u32::MAX,
            "00:0{device}.{function}"
        );
    }
}
