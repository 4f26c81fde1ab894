//! vCPU states in and out of a machine's vCPUs: taken while paused, in index order, and set
//! back on a fresh machine, which goes on.

use super::*;
use crate::contract::PROBE_LOAD_ADDR;
use crate::machine::loader::long_mode;
use crate::machine::probe::loader::entry_regs;
use crate::vm::state::tests::TempFile;
use crate::vm::{Irqchip, RamBacking};
use vm_memory::{Bytes, GuestAddress};

/// Where each vCPU keeps its count: 8 bytes each, by index.
const COUNTS: u64 = PROBE_LOAD_ADDR + 0x1000;

/// Count in rax forever, storing each value at `COUNTS + 8 * rdi` (rdi: the vCPU's index, as
/// the probe's entry gives it). Ring 0 and no exit: only a kick takes a vCPU out of it.
#[rustfmt::skip]
const COUNTING: &[u8] = &[
    0x48, 0xff, 0xc0,                               // inc rax
    0x48, 0x89, 0x04, 0xfd, 0x00, 0x10, 0x20, 0x00, // mov [COUNTS + rdi * 8], rax
    0xeb, 0xf3,                                     // jmp (the inc)
];

const RAM: [(u64, usize); 1] = [(0, 16 << 20)];

/// Two vCPUs about to run `COUNTING` in a VM of its own (RAM made of `backing`).
fn counting_vcpus(backing: RamBacking) -> (Vm, Vcpus) {
    let vm = Vm::with_irqchip(&RAM, false, Irqchip::InKernel, backing).unwrap();
    long_mode::write_tables(vm.memory()).unwrap();
    vm.memory()
        .write_slice(COUNTING, GuestAddress(PROBE_LOAD_ADDR))
        .unwrap();
    let vcpus = Vcpus::create(&vm, 2, &CpuTemplate::default()).unwrap();
    for (i, vcpu) in (0..).zip(&vcpus.0) {
        vcpu.set_entry(&entry_regs(i), long_mode::long_mode_sregs)
            .unwrap();
    }
    (vm, vcpus)
}

/// Run `vcpus` on their threads, as a machine does, until the returned control stops them.
fn running(vm: &Vm, vcpus: Vcpus) -> (Arc<RunControl>, JoinHandle<Result<RunEnd, std::io::Error>>) {
    let control = Arc::new(RunControl::default());
    let counters = Arc::new(ExitCounters::new(0));
    let io = Arc::new(IoBuses::default());
    let memory = vm.memory().clone();
    let run = {
        let control = control.clone();
        thread::spawn(move || vcpus.run(&io, &counters, &control, &memory, Duration::from_secs(60)))
    };
    (control, run)
}

fn stop(control: &RunControl, run: JoinHandle<Result<RunEnd, std::io::Error>>) {
    control.stop(StopReason::GuestDone(0));
    assert!(matches!(run.join().unwrap(), Ok(RunEnd::Stopped(_))));
}

fn counts(vm: &Vm) -> [u64; 2] {
    [0, 1].map(|i| vm.memory().read_obj(GuestAddress(COUNTS + 8 * i)).unwrap())
}

#[test]
fn states_of_another_vcpu_count_are_refused_before_any_is_set() {
    let vm = Vm::new(&[(0, 1 << 20)], false).unwrap();
    let two = Vcpus::create(&vm, 2, &CpuTemplate::default()).unwrap();
    let one = Vcpus::create(
        &Vm::new(&[(0, 1 << 20)], false).unwrap(),
        1,
        &Default::default(),
    )
    .unwrap();
    let pause = crate::vm::pause::Pause::default();
    // The state of one parked vCPU, taken as a snapshot takes it (on its own thread).
    let states = std::thread::scope(|s| {
        pause.request().unwrap();
        let vcpu = &one.0[0];
        s.spawn(|| pause.park(0, || false, || vcpu.save_state()));
        assert!(pause.wait_parked(Duration::from_secs(60), || false));
        let states = pause.save_vcpus(Duration::from_secs(60));
        pause.resume().unwrap();
        states.unwrap()
    });
    let e = two.set_states(&states).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the snapshot does not fit this VM: the snapshot has 1 vCPUs, the machine 2"
    );
    one.set_states(&states).unwrap();
}

/// Two vCPUs counting in the guest, kicked out of it by a pause as `vm.pause` does, each take
/// their own state, in index order (rdi = the index); set on a fresh machine whose RAM is the
/// shared memfd loaded from the memory file, both go on counting from where they were.
#[test]
fn a_paused_machine_gives_every_vcpu_state_and_a_fresh_one_goes_on_from_them() {
    let (vm, vcpus) = counting_vcpus(RamBacking::Private);
    let (control, run) = running(&vm, vcpus);
    while counts(&vm).iter().any(|&c| c < 100) {
        thread::sleep(Duration::from_millis(1));
    }
    control.pause_vcpus(Duration::from_secs(60)).unwrap();
    let states = control.pause().save_vcpus(Duration::from_secs(60)).unwrap();
    let vm_state = vm.save_state().unwrap();
    let file = TempFile::new("two-vcpus");
    let checksum = vm
        .save_memory(&mut std::fs::File::create(&file.0).unwrap())
        .unwrap();
    let saved = counts(&vm);
    assert_eq!(
        states.iter().map(|s| s.regs.rdi).collect::<Vec<_>>(),
        [0, 1]
    );
    for (state, count) in states.iter().zip(saved) {
        // At an instruction boundary: the count stored, or incremented and not yet stored.
        assert!([count, count + 1].contains(&state.regs.rax), "{count}");
    }
    control.pause().resume().unwrap();
    assert_eq!(
        control.pause().save_vcpus(Duration::ZERO).unwrap_err(),
        crate::vm::pause::PauseError::NotPaused
    );
    stop(&control, run);

    let memory = crate::vm::state::memory::SavedMemory {
        file: std::fs::File::open(&file.0).unwrap(),
        checksum,
    };
    let vm = Vm::restored(
        &RAM,
        false,
        Irqchip::InKernel,
        RamBacking::SharedMemfd,
        memory,
    )
    .unwrap();
    assert_eq!(counts(&vm), saved);
    let vcpus = Vcpus::create(&vm, 2, &CpuTemplate::default()).unwrap();
    vcpus.set_states(&states).unwrap();
    vm.restore_state(&vm_state).unwrap();
    let (control, run) = running(&vm, vcpus);
    // Each goes on from its count (a vCPU started afresh would count from 1 again).
    loop {
        let now = counts(&vm);
        assert!(
            !run.is_finished(),
            "the run ended at {now:?}, from {saved:?}"
        );
        assert!(
            now.iter().zip(saved).all(|(&n, s)| n >= s),
            "{now:?} from {saved:?}"
        );
        if now.iter().zip(saved).all(|(&n, s)| n >= s + 100) {
            break;
        }
        thread::sleep(Duration::from_millis(1));
    }
    stop(&control, run);
}
