//! The platform devices' snapshot states through the machine's wiring (issue 25): a machine
//! with the PC platform, the VT-d unit and the userspace IOAPIC registers each stateful device
//! under its bus name, and a second machine built from the same configuration takes every
//! state the first saved; a state from another device is refused.

use std::sync::Arc;

use exitless::contract::PORT_SERIAL;
use exitless::devices::acpi_pm::{PM_BASE, PM1_EVT_OFFSET};
use exitless::devices::fw_cfg::{FW_CFG_ID, FW_CFG_PORT};
use exitless::devices::pit::{PIT_PORT, PORT_B};
use exitless::devices::reset_control::RESET_CONTROL_PORT;
use exitless::devices::rtc::RTC_PORT;
use exitless::iommu::regs::VTD_FEDATA_REG;
use exitless::irq::regs::{IOAPIC_BASE, IOAPIC_REGSEL, IOAPIC_WINDOW};
use exitless::machine::layout::IOMMU_BASE;
use exitless::machine::wiring::{self, names};
use exitless::machine::{MachineConfig, MemoryLayout, Platform};
use exitless::pci::regs::{PCI_CONFIG_ADDRESS_PORT, PCI_CONFIG_DATA_PORT};
use exitless::vm::run_control::RunControl;
use exitless::vm::{Irqchip, RamBacking, Vm};

fn wired(cfg: &MachineConfig) -> (Vm, wiring::Devices) {
    let mut layout = MemoryLayout::new(cfg.ram_size, cfg.ecam.is_some()).unwrap();
    let irqchip = Irqchip::Split {
        pins: exitless::irq::ioapic::PINS,
    };
    let mut vm =
        Vm::with_irqchip(&layout.ram_regions(), false, irqchip, RamBacking::Private).unwrap();
    let control = Arc::new(RunControl::default());
    let devices = wiring::wire(&mut vm, &mut layout, cfg, &control, Default::default()).unwrap();
    (vm, devices)
}

/// A state without the PM timer's count, which runs on.
fn still(mut state: serde_json::Value) -> serde_json::Value {
    if let Some(fields) = state.as_object_mut() {
        fields.remove("timer");
    }
    state
}

#[test]
fn every_platform_device_is_registered_and_a_fresh_machine_takes_its_state() {
    let cfg = MachineConfig {
        platform: Some(Platform {
            fw_cfg_files: vec![("opt/exitless/cmdline".into(), b"x".to_vec())],
        }),
        iommu: true,
        split_irqchip: true,
        // 00:01.0 below.
        pci_test_endpoints: true,
        ..MachineConfig::default()
    };
    let (_vm, first) = wired(&cfg);
    // A guest's writes: the UART's scratch byte, a CMOS byte, fw_cfg's selector, PM1 enable,
    // the reset kind, the PIT, the unit's fault event data, an IOAPIC entry (masked, vector
    // 0x41).
    let (pio, mmio) = (&first.io.pio, &first.io.mmio);
    let port = |p: u16| u64::from(p);
    pio.write(port(PORT_SERIAL + 7), &[0x5a]);
    pio.write(port(RTC_PORT), &[0x40]);
    pio.write(port(RTC_PORT + 1), &[0x77]);
    pio.write(port(FW_CFG_PORT), &FW_CFG_ID.to_le_bytes());
    pio.write(
        port(PM_BASE + PM1_EVT_OFFSET + 2),
        &(1u16 << 10).to_le_bytes(),
    ); // RTC_EN
    pio.write(port(RESET_CONTROL_PORT), &[0x08]); // FULL_RST
    // The PIT (a split irqchip has no KVM PIT): channel 2 as a square wave awaiting its count,
    // and port B's gate and speaker bits.
    pio.write(port(PIT_PORT + 3), &[0xb6]);
    pio.write(port(PORT_B), &[0x03]);
    mmio.write(IOMMU_BASE + VTD_FEDATA_REG, &0x45u32.to_le_bytes());
    mmio.write(IOAPIC_BASE + IOAPIC_REGSEL, &[0x10]);
    mmio.write(IOAPIC_BASE + IOAPIC_WINDOW, &0x1_0041u32.to_le_bytes());
    // Bus 0 ("pci"): 00:01.0's latency timer (offset 0x0d), through CF8/CFC.
    let latency_timer = 0x8000_0000u32 | 1 << 11 | 0x0c;
    pio.write(port(PCI_CONFIG_ADDRESS_PORT), &latency_timer.to_le_bytes());
    pio.write(port(PCI_CONFIG_DATA_PORT + 1), &[0x40]);
    let ids: Vec<&str> = first.persist.iter().map(|(id, _)| id.as_str()).collect();
    for id in [
        names::SERIAL,
        names::FW_CFG,
        names::ACPI_PM,
        names::RTC,
        names::RESET_CONTROL,
        names::PIT,
        names::IOMMU,
        names::IOAPIC,
    ] {
        assert_eq!(
            ids.iter().filter(|&&i| i == id).count(),
            1,
            "{id} in {ids:?}"
        );
    }
    let (_vm2, second) = wired(&cfg);
    for ((id, saved), (id2, fresh)) in first.persist.iter().zip(&second.persist) {
        assert_eq!(id, id2, "the same order");
        let state = saved.save().unwrap();
        assert_ne!(
            still(fresh.save().unwrap()),
            still(state.clone()),
            "{id}: the guest's writes are in its state"
        );
        fresh.restore(state.clone()).unwrap();
        assert_eq!(still(fresh.save().unwrap()), still(state), "{id}");
    }
    let serial = &second
        .persist
        .iter()
        .find(|(id, _)| id == names::SERIAL)
        .unwrap()
        .1;
    let rtc_state = first
        .persist
        .iter()
        .find(|(id, _)| id == names::RTC)
        .unwrap()
        .1
        .save();
    assert!(
        serial.restore(rtc_state.unwrap()).is_err(),
        "another device's state"
    );
}
