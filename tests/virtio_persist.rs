//! Virtio devices' snapshot states through the machine's wiring on KVM (issue 25): a machine
//! with a virtio-pci and a virtio-mmio net device, programmed as a driver would start to, is
//! paused and saved; a second machine built from the same configuration takes every state, its
//! live MSI-X vector routed in one commit (batched), and saves the same again.

use std::sync::Arc;

use exitless::irq::CommitStrategy;
use exitless::machine::wiring::{self, names};
use exitless::machine::{MachineConfig, MemoryLayout, Transport, VirtioNetConfig};
use exitless::pci::regs::{
    PCI_BAR0, PCI_CAP_ID_MSIX, PCI_CAPABILITY_LIST, PCI_CONFIG_ADDRESS_PORT, PCI_CONFIG_DATA_PORT,
    PCI_MSIX_ENTRY_DATA, PCI_MSIX_ENTRY_LOWER_ADDR, PCI_MSIX_ENTRY_VECTOR_CTRL, PCI_MSIX_FLAGS,
    PCI_MSIX_FLAGS_ENABLE,
};
use exitless::virtio::notify::NotifyPath;
use exitless::virtio::regs::{
    VIRTIO_MMIO_QUEUE_NUM, VIRTIO_MMIO_QUEUE_SEL, VIRTIO_PCI_BAR_MSIX_TABLE,
    VIRTIO_PCI_COMMON_Q_SELECT, VIRTIO_PCI_COMMON_Q_SIZE,
};
use exitless::vm::run_control::RunControl;
use exitless::vm::{Irqchip, RamBacking, Vm};

fn wired(cfg: &MachineConfig) -> (Vm, wiring::Devices, MemoryLayout) {
    let mut layout = MemoryLayout::new(cfg.ram_size, cfg.ecam.is_some()).unwrap();
    let mut vm = Vm::with_irqchip(
        &layout.ram_regions(),
        false,
        Irqchip::InKernel,
        RamBacking::Private,
    )
    .unwrap();
    let control = Arc::new(RunControl::default());
    let devices = wiring::wire(&mut vm, &mut layout, cfg, &control).unwrap();
    (vm, devices, layout)
}

/// Configuration space of 00:03.0 through CF8/CFC: read or write a dword or less.
struct Cfg<'a>(&'a wiring::Devices);

impl Cfg<'_> {
    fn select(&self, reg: u16) {
        let address = 0x8000_0000u32 | 3 << 11 | u32::from(reg & !3);
        let port = u64::from(PCI_CONFIG_ADDRESS_PORT);
        self.0.io.pio.write(port, &address.to_le_bytes());
    }

    fn read8(&self, reg: u16) -> u8 {
        self.select(reg);
        let mut b = [0u8];
        let port = u64::from(PCI_CONFIG_DATA_PORT + (reg & 3));
        self.0.io.pio.read(port, &mut b);
        b[0]
    }

    fn read32(&self, reg: u16) -> u32 {
        self.select(reg);
        let mut b = [0u8; 4];
        self.0.io.pio.read(u64::from(PCI_CONFIG_DATA_PORT), &mut b);
        u32::from_le_bytes(b)
    }

    fn write16(&self, reg: u16, value: u16) {
        self.select(reg);
        let port = u64::from(PCI_CONFIG_DATA_PORT + (reg & 3));
        self.0.io.pio.write(port, &value.to_le_bytes());
    }

    fn capability(&self, id: u8) -> u16 {
        let mut at = self.read8(PCI_CAPABILITY_LIST);
        while at != 0 {
            if self.read8(u16::from(at)) == id {
                return u16::from(at);
            }
            at = self.read8(u16::from(at) + 1);
        }
        panic!("no capability {id:#x}");
    }
}

/// A driver's first steps: queue 1 resized on both devices, MSI-X entry 0 programmed and
/// unmasked, MSI-X enabled.
fn program(devices: &wiring::Devices, layout: &MemoryLayout) {
    let mmio = &devices.io.mmio;
    let cfg = Cfg(devices);
    let bar0 = u64::from(cfg.read32(PCI_BAR0) & !0xf);
    let write = |at: u64, v: u32, len: usize| mmio.write(at, &v.to_le_bytes()[..len]);
    write(bar0 + u64::from(VIRTIO_PCI_COMMON_Q_SELECT), 1, 2);
    write(bar0 + u64::from(VIRTIO_PCI_COMMON_Q_SIZE), 64, 2);
    let entry = bar0 + u64::from(VIRTIO_PCI_BAR_MSIX_TABLE);
    write(entry + u64::from(PCI_MSIX_ENTRY_LOWER_ADDR), 0xfee0_0000, 4);
    write(entry + u64::from(PCI_MSIX_ENTRY_DATA), 0x41, 4);
    write(entry + u64::from(PCI_MSIX_ENTRY_VECTOR_CTRL), 0, 4);
    let msix = cfg.capability(PCI_CAP_ID_MSIX);
    cfg.write16(msix + PCI_MSIX_FLAGS, PCI_MSIX_FLAGS_ENABLE);
    let base = layout.virtio_mmio()[0].base;
    write(base + u64::from(VIRTIO_MMIO_QUEUE_SEL), 1, 4);
    write(base + u64::from(VIRTIO_MMIO_QUEUE_NUM), 64, 4);
}

#[test]
fn a_fresh_machine_takes_every_virtio_state_and_routes_the_live_vector_once() {
    let cfg = MachineConfig {
        virtio: vec![
            VirtioNetConfig::new(Transport::Pci, NotifyPath::Address),
            VirtioNetConfig::new(Transport::Mmio, NotifyPath::Address),
        ],
        gsi_commits: CommitStrategy::Batched,
        ..MachineConfig::default()
    };
    let (_vm, first, layout) = wired(&cfg);
    program(&first, &layout);
    let (_vm2, second, _) = wired(&cfg);
    let ids: Vec<&str> = second.persist.iter().map(|(id, _)| id.as_str()).collect();
    for id in [names::PCI_ROOT, "virtio-mmio.0"] {
        assert_eq!(
            ids.iter().filter(|&&i| i == id).count(),
            1,
            "{id} in {ids:?}"
        );
    }
    let before = second.routing.stats().commits;
    for ((id, saved), (_, fresh)) in first.persist.iter().zip(&second.persist) {
        saved.pause().unwrap();
        let state = saved.save().unwrap();
        if [names::PCI_ROOT, "virtio-mmio.0"].contains(&id.as_str()) {
            assert_ne!(
                fresh.save().unwrap(),
                state,
                "{id}: the guest's writes are in it"
            );
        }
        fresh.restore(state.clone()).unwrap();
        fresh.resume();
        saved.resume();
        // A snapshot of the restored machine saves the same.
        fresh.pause().unwrap();
        assert_eq!(fresh.save().unwrap(), state, "{id}");
        fresh.resume();
    }
    assert_eq!(
        second.routing.stats().commits - before,
        1,
        "the one live vector, routed in one commit"
    );
}
