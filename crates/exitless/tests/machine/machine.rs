//! A machine without the probe: the board is optional, the loader is any `Loader`, and RAM
//! size is a checked parameter.

use std::time::Duration;

use exitless::exits::ExitKind;
use exitless::machine::loader::long_mode;
use exitless::machine::probe::PROBE_MIN_RAM;
use exitless::machine::{
    CpuMode, EntryState, LoadError, Loader, Machine, MachineConfig, MachineInfo, ProbeConfig,
    RunEnd, names, run_probe,
};
use exitless::vm::run_control::StopReason;
use kvm_bindings::kvm_regs;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// A guest of a few instructions at CPL 0, loaded at `ENTRY` in long mode.
struct Code(&'static [u8]);

const ENTRY: u64 = 0x10_0000;

impl Loader for Code {
    fn load(
        &self,
        mem: &GuestMemoryMmap,
        machine: &MachineInfo<'_>,
    ) -> Result<EntryState, LoadError> {
        assert_eq!(machine.layout.ram_size(), 4 << 20);
        long_mode::write_tables(mem)?;
        mem.write_slice(self.0, GuestAddress(ENTRY))?;
        Ok(EntryState {
            mode: CpuMode::LongMode,
            regs: kvm_regs {
                rip: ENTRY,
                rsp: ENTRY,
                rflags: 0x2,
                ..Default::default()
            },
        })
    }
}

/// `out` to an unclaimed port, then `ud2`, which with no IDT triple-faults: the run ends in
/// a shutdown. (mov al, 0x42; out 0x80, al; ud2)
const OUT_THEN_CRASH: Code = Code(&[0xb0, 0x42, 0xe6, 0x80, 0x0f, 0x0b]);

/// A 4 MiB machine without the probe's board or ECAM.
fn small_machine() -> Machine {
    let cfg = MachineConfig {
        ram_size: 4 << 20,
        ecam: None,
        ..Default::default()
    };
    Machine::new(&cfg, None).expect("a machine without a board")
}

#[test]
fn a_machine_without_the_probe_board_runs_any_loader() {
    let machine = small_machine();
    assert!(
        !machine.io().names.iter().any(|n| n == names::PROBE_PORTS),
        "no probe ports without the probe board: {:?}",
        machine.io().names
    );
    let ran = machine
        .run(&OUT_THEN_CRASH, Duration::from_secs(60))
        .expect("run");
    assert!(
        matches!(ran.end, RunEnd::Stopped(StopReason::Shutdown)),
        "{:?}",
        ran.end
    );
    let exits = machine.counters().snapshot();
    assert_eq!(
        exits.of_kind(ExitKind::PioWrite),
        1,
        "the loader's entry ran"
    );
    assert_eq!(
        exits.by_device.last(),
        Some(&1),
        "to a port no device claims"
    );
}

#[test]
fn ram_too_small_for_the_probe_is_a_clear_error() {
    let e = run_probe(&ProbeConfig {
        ram_size: 8 << 20,
        ..Default::default()
    })
    .expect_err("8 MiB cannot hold the probe");
    let msg = e.to_string();
    assert!(
        msg.contains("needs at least") && msg.contains("15 MiB"),
        "{msg}"
    );
    let e = run_probe(&ProbeConfig {
        ram_size: usize::try_from(PROBE_MIN_RAM).unwrap() + 1,
        ..Default::default()
    })
    .expect_err("not whole pages");
    assert!(e.to_string().contains("multiple of"), "{e}");
}

#[test]
fn the_probe_runs_with_more_ram_than_the_default() {
    let run = run_probe(&ProbeConfig {
        ram_size: 64 << 20,
        ..Default::default()
    })
    .expect("probe with 64 MiB");
    assert!(run.results.is_empty());
    assert!(run.devices.iter().any(|n| n == names::PROBE_PORTS));
}

/// A port whose device never answers: the vCPU that reads it is stuck outside the guest.
struct Stuck;

impl exitless::bus::BusDevice for Stuck {
    fn read(&self, _offset: u64, _data: &mut [u8]) {
        loop {
            std::thread::park();
        }
    }
    fn write(&self, _offset: u64, _data: &[u8]) {}
}

/// `in al, 0x80`: reaches the stuck port.
const READS_THE_STUCK_PORT: Code = Code(&[0xe4, 0x80, 0x0f, 0x0b]);

/// Defect: the stop path had no bound: a vCPU stuck in a device kept the run from ever ending,
/// whatever its timeout said.
#[test]
fn a_vcpu_stuck_in_a_device_does_not_keep_the_run_from_ending() {
    let machine = small_machine();
    machine
        .io()
        .pio
        .update_range(
            None,
            Some(exitless::bus::BusRange {
                base: 0x80,
                len: 1,
                id: 0,
                name: "stuck".into(),
                device: std::sync::Arc::new(Stuck),
            }),
        )
        .expect("port 0x80 is free");
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let ran = machine.run(&READS_THE_STUCK_PORT, Duration::from_secs(1));
        let _ = done.send(ran.map(|r| matches!(r.end, RunEnd::TimedOut)));
    });
    let timed_out = finished
        .recv_timeout(Duration::from_secs(30))
        .expect("the run ends in bounded time")
        .expect("run");
    assert!(timed_out, "the run reports its timeout");
}
