//! Virtio devices' snapshot states through the machine's wiring on KVM (issue 25): a machine
//! with a virtio-pci and a virtio-mmio net device, programmed as a driver would start to, is
//! paused and saved; a second machine built from the same configuration takes every state, its
//! live MSI-X vector routed in one commit (batched), and saves the same again. A live device
//! paused mid-traffic goes on in a second machine given the first's memory, where it stopped.

#![allow(clippy::cast_possible_truncation)] // fixtures: ring addresses below 4 GiB

use std::sync::Arc;

use exitless::irq::CommitStrategy;
use exitless::machine::wiring::{self, names};
use exitless::machine::{MachineConfig, MemoryLayout, Transport, VirtioNetConfig};
use exitless::pci::regs::{
    PCI_BAR0, PCI_CAP_ID_MSIX, PCI_CAPABILITY_LIST, PCI_CONFIG_ADDRESS_PORT, PCI_CONFIG_DATA_PORT,
    PCI_MSIX_ENTRY_DATA, PCI_MSIX_ENTRY_LOWER_ADDR, PCI_MSIX_ENTRY_SIZE,
    PCI_MSIX_ENTRY_VECTOR_CTRL, PCI_MSIX_FLAGS, PCI_MSIX_FLAGS_ENABLE,
};
use exitless::pci::regs::{PCI_COMMAND, PCI_COMMAND_IO, PCI_COMMAND_MASTER, PCI_COMMAND_MEMORY};
use exitless::virtio::notify::NotifyPath;
use exitless::virtio::regs::{
    VIRTIO_F_VERSION_1, VIRTIO_PCI_BAR_NOTIFY, VIRTIO_PCI_COMMON_GF, VIRTIO_PCI_COMMON_GFSELECT,
    VIRTIO_PCI_COMMON_Q_AVAILLO, VIRTIO_PCI_COMMON_Q_DESCLO, VIRTIO_PCI_COMMON_Q_ENABLE,
    VIRTIO_PCI_COMMON_Q_USEDLO, VIRTIO_PCI_COMMON_STATUS, VIRTIO_PCI_NOTIFY_MULTIPLIER,
    VIRTQ_DESC_F_WRITE,
};
use exitless::virtio::regs::{
    VIRTIO_MMIO_QUEUE_NUM, VIRTIO_MMIO_QUEUE_SEL, VIRTIO_PCI_BAR_MSIX_TABLE,
    VIRTIO_PCI_COMMON_Q_SELECT, VIRTIO_PCI_COMMON_Q_SIZE,
};
use exitless::vm::run_control::RunControl;
use exitless::vm::{Irqchip, RamBacking, Vm};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

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
    let devices = wiring::wire(&mut vm, &mut layout, cfg, &control, Default::default()).unwrap();
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

/// MSI-X vectors the driver makes live on the virtio-pci function.
const LIVE: u32 = 3;

/// A driver's first steps: queue 1 resized on both devices, MSI-X entries 0..LIVE programmed
/// and unmasked, MSI-X enabled.
fn program(devices: &wiring::Devices, layout: &MemoryLayout) {
    let mmio = &devices.io.mmio;
    let cfg = Cfg(devices);
    let bar0 = u64::from(cfg.read32(PCI_BAR0) & !0xf);
    let write = |at: u64, v: u32, len: usize| mmio.write(at, &v.to_le_bytes()[..len]);
    write(bar0 + u64::from(VIRTIO_PCI_COMMON_Q_SELECT), 1, 2);
    write(bar0 + u64::from(VIRTIO_PCI_COMMON_Q_SIZE), 64, 2);
    for v in 0..LIVE {
        let entry = bar0 + u64::from(VIRTIO_PCI_BAR_MSIX_TABLE + v * PCI_MSIX_ENTRY_SIZE);
        write(entry + u64::from(PCI_MSIX_ENTRY_LOWER_ADDR), 0xfee0_0000, 4);
        write(entry + u64::from(PCI_MSIX_ENTRY_DATA), 0x41 + v, 4);
        write(entry + u64::from(PCI_MSIX_ENTRY_VECTOR_CTRL), 0, 4);
    }
    let msix = cfg.capability(PCI_CAP_ID_MSIX);
    cfg.write16(msix + PCI_MSIX_FLAGS, PCI_MSIX_FLAGS_ENABLE);
    let base = layout.virtio_mmio()[0].base;
    write(base + u64::from(VIRTIO_MMIO_QUEUE_SEL), 1, 4);
    write(base + u64::from(VIRTIO_MMIO_QUEUE_NUM), 64, 4);
}

#[test]
fn a_fresh_machine_takes_every_virtio_state_and_routes_the_live_vectors_in_one_commit() {
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
        "the live vectors, routed in one commit"
    );
}

/// The seed's case on KVM: the routes of the live vectors come back as the strategy in force
/// commits them.
#[test]
fn restore_commits_the_live_vectors_by_the_strategy_in_force() {
    for (strategy, commits) in [
        (CommitStrategy::PerVector, u64::from(LIVE)),
        (CommitStrategy::Batched, 1),
        (CommitStrategy::FirstUse, 0),
        (CommitStrategy::Direct, 0),
    ] {
        let cfg = MachineConfig {
            virtio: vec![
                VirtioNetConfig::new(Transport::Pci, NotifyPath::Address),
                VirtioNetConfig::new(Transport::Mmio, NotifyPath::Address),
            ],
            gsi_commits: strategy,
            ..MachineConfig::default()
        };
        let (_vm, first, layout) = wired(&cfg);
        program(&first, &layout);
        let (_vm2, second, _) = wired(&cfg);
        let pci = |d: &wiring::Devices| {
            d.persist
                .iter()
                .find(|(id, _)| id == names::PCI_ROOT)
                .unwrap()
                .1
                .clone()
        };
        pci(&first).pause().unwrap();
        let state = pci(&first).save().unwrap();
        let before = second.routing.stats().commits;
        pci(&second).restore(state).unwrap();
        assert_eq!(
            second.routing.stats().commits - before,
            commits,
            "{strategy:?}"
        );
    }
}

/// A split virtqueue of 16 entries at `base` in guest memory, as a driver lays it out.
#[derive(Clone, Copy)]
struct Ring {
    base: u64,
}

impl Ring {
    fn desc(self) -> u64 {
        self.base
    }
    fn avail(self) -> u64 {
        self.base + 0x1000
    }
    fn used(self) -> u64 {
        self.base + 0x2000
    }

    /// Make buffer (`addr`, `len`, `flags`) available as the `n`th chain.
    fn add(self, mem: &GuestMemoryMmap, n: u16, addr: u64, len: u32, flags: u16) {
        let slot = u64::from(n % 16);
        let at = |a: u64| GuestAddress(a);
        mem.write_obj(addr, at(self.desc() + 16 * slot)).unwrap();
        mem.write_obj(len, at(self.desc() + 16 * slot + 8)).unwrap();
        mem.write_obj(flags, at(self.desc() + 16 * slot + 12))
            .unwrap();
        mem.write_obj(n % 16, at(self.avail() + 4 + 2 * slot))
            .unwrap();
        mem.write_obj(n + 1, at(self.avail() + 2)).unwrap();
    }

    fn used_idx(self, mem: &GuestMemoryMmap) -> u16 {
        mem.read_obj(GuestAddress(self.used() + 2)).unwrap()
    }
}

const RX: Ring = Ring { base: 0x10_0000 };
const TX: Ring = Ring { base: 0x11_0000 };
const BUFFERS: u64 = 0x20_0000;

/// What a driver does up to DRIVER_OK on the virtio-pci function, through BAR 0.
fn start_driver(devices: &wiring::Devices) -> u64 {
    let cfg = Cfg(devices);
    cfg.write16(
        PCI_COMMAND,
        PCI_COMMAND_MEMORY | PCI_COMMAND_IO | PCI_COMMAND_MASTER,
    );
    let bar0 = u64::from(cfg.read32(PCI_BAR0) & !0xf);
    let write = |off: u32, v: u32, len: usize| {
        devices
            .io
            .mmio
            .write(bar0 + u64::from(off), &v.to_le_bytes()[..len]);
    };
    write(VIRTIO_PCI_COMMON_STATUS, 3, 1);
    write(VIRTIO_PCI_COMMON_GFSELECT, 1, 4);
    write(VIRTIO_PCI_COMMON_GF, 1 << (VIRTIO_F_VERSION_1 - 32), 4);
    write(VIRTIO_PCI_COMMON_STATUS, 0xb, 1);
    for (q, ring) in [RX, TX].into_iter().enumerate() {
        write(VIRTIO_PCI_COMMON_Q_SELECT, q as u32, 2);
        write(VIRTIO_PCI_COMMON_Q_SIZE, 16, 2);
        write(VIRTIO_PCI_COMMON_Q_DESCLO, ring.desc() as u32, 4);
        write(VIRTIO_PCI_COMMON_Q_AVAILLO, ring.avail() as u32, 4);
        write(VIRTIO_PCI_COMMON_Q_USEDLO, ring.used() as u32, 4);
        write(VIRTIO_PCI_COMMON_Q_ENABLE, 1, 2);
    }
    write(VIRTIO_PCI_COMMON_STATUS, 0xf, 1);
    bar0
}

/// Make request `n` (a zero virtio-net header, no offloads, then 4 bytes of `n`) and its
/// receive buffer available, without a kick.
fn offer(mem: &GuestMemoryMmap, n: u8) {
    let tx_buf = BUFFERS + 0x10_0000 + u64::from(n) * 0x100;
    let mut request = [n; 16];
    request[..12].fill(0);
    mem.write_slice(&request, GuestAddress(tx_buf)).unwrap();
    RX.add(
        mem,
        u16::from(n),
        rx_buf(n),
        0x800,
        VIRTQ_DESC_F_WRITE as u16,
    );
    TX.add(mem, u16::from(n), tx_buf, 16, 0);
}

/// Where request `n`'s answer goes.
fn rx_buf(n: u8) -> u64 {
    BUFFERS + u64::from(n) * 0x1000
}

/// Whether request `n` is answered, and rightly (the answer's byte past the 12-byte header).
fn answered(mem: &GuestMemoryMmap, n: u8) -> bool {
    let answer: u8 = mem.read_obj(GuestAddress(rx_buf(n) + 12)).unwrap();
    RX.used_idx(mem) == u16::from(n) + 1 && answer == !n
}

/// Request `n` with its receive buffer; wait for the answer, then check it.
fn request(devices: &wiring::Devices, mem: &GuestMemoryMmap, bar0: u64, n: u8) {
    offer(mem, n);
    let notify = bar0 + u64::from(VIRTIO_PCI_BAR_NOTIFY + VIRTIO_PCI_NOTIFY_MULTIPLIER);
    devices.io.mmio.write(notify, &1u16.to_le_bytes());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while RX.used_idx(mem) < u16::from(n) + 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(answered(mem, n), "request {n} answered");
}

/// `first` (on `vm`) paused and saved, and a fresh machine of `cfg` with its memory: the
/// states are for the fresh machine's devices to restore.
fn moved(
    cfg: &MachineConfig,
    vm: &Vm,
    first: &wiring::Devices,
) -> (Vm, wiring::Devices, Vec<serde_json::Value>) {
    let states = (first.persist.iter())
        .map(|(_, p)| {
            p.pause().unwrap();
            p.save().unwrap()
        })
        .collect();
    let (vm2, second, _) = wired(cfg);
    let mut bytes = vec![0u8; 0x30_0000];
    vm.memory().read_slice(&mut bytes, GuestAddress(0)).unwrap();
    vm2.memory().write_slice(&bytes, GuestAddress(0)).unwrap();
    (vm2, second, states)
}

/// A live device's thread is paused and its queues saved at their positions; a second
/// machine, given the first's memory and states, answers the next request at the next index
/// and answers none of the earlier ones again.
#[test]
fn a_live_device_goes_on_in_a_fresh_machine_where_it_stopped() {
    let cfg = MachineConfig {
        virtio: vec![VirtioNetConfig::new(Transport::Pci, NotifyPath::Address)],
        gsi_commits: CommitStrategy::Batched,
        ..MachineConfig::default()
    };
    let (vm, first, _) = wired(&cfg);
    let bar0 = start_driver(&first);
    for n in 0..2 {
        request(&first, vm.memory(), bar0, n);
    }
    let (vm2, second, states) = moved(&cfg, &vm, &first);
    for n in 0..2u64 {
        vm2.memory()
            .write_obj(0u8, GuestAddress(BUFFERS + n * 0x1000 + 12))
            .unwrap();
    }
    for ((_, fresh), state) in second.persist.iter().zip(states) {
        fresh.restore(state).unwrap();
    }
    for (_, fresh) in &second.persist {
        fresh.resume();
    }
    request(&second, vm2.memory(), bar0, 2);
    for n in 0..2u64 {
        let byte: u8 = vm2
            .memory()
            .read_obj(GuestAddress(BUFFERS + n * 0x1000 + 12))
            .unwrap();
        assert_eq!(byte, 0, "request {n} is not answered again");
    }
}

/// A request the driver made available while the machine was paused for the snapshot (its
/// kick came too late for the paused thread) is answered by the time the restored machine's
/// devices have resumed, before any vCPU runs: a driver that was waiting for it with a
/// deadline taken before the snapshot finds the answer (docs/snapshot.md, the guest's TSC).
#[test]
fn work_made_available_before_the_snapshot_is_done_when_resume_returns() {
    let cfg = MachineConfig {
        virtio: vec![VirtioNetConfig::new(Transport::Pci, NotifyPath::Address)],
        ..MachineConfig::default()
    };
    let (vm, first, _) = wired(&cfg);
    let bar0 = start_driver(&first);
    request(&first, vm.memory(), bar0, 0);
    let (vm2, second, states) = moved(&cfg, &vm, &first);
    offer(vm2.memory(), 1);
    for ((_, fresh), state) in second.persist.iter().zip(states) {
        fresh.restore(state).unwrap();
    }
    assert!(!answered(vm2.memory(), 1), "not before the resume");
    let (_, pci) = (second.persist.iter())
        .find(|(id, _)| id == "pci")
        .expect("the PCI bus is a snapshot entry");
    pci.resume();
    assert!(answered(vm2.memory(), 1), "answered when resume returned");
}
