//! A guest's vCPU taken at a pause, with its memory and the VM's state, and set on a fresh VM:
//! the guest goes on from the instruction after the one it had done, with every register.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvm_bindings::{KVM_IRQCHIP_IOAPIC, kvm_irqchip};
use vm_memory::{Bytes, GuestAddress};

use super::super::tests::vcpu_running;
use super::*;
use crate::bus::{BusDevice, IoBuses};
use crate::contract::PROBE_LOAD_ADDR;
use crate::exits::ExitCounters;
use crate::vm::run_control::{RunControl, StopReason};
use crate::vm::state::tests::TempFile;
use crate::vm::{Irqchip, RamBacking};

/// Where the guest keeps its count.
const COUNTER: u64 = PROBE_LOAD_ADDR + 0x1000;

/// Count in rax forever, storing each value at [`COUNTER`] and writing it to port 0x80.
#[rustfmt::skip]
const COUNTING: &[u8] = &[
    0x48, 0xff, 0xc0,                               // inc rax
    0x48, 0x89, 0x04, 0x25, 0x00, 0x10, 0x20, 0x00, // mov [COUNTER], rax
    0xe6, 0x80,                                     // out 0x80, al
    0xeb, 0xf1,                                     // jmp (the inc)
];

/// The counts the guest wrote; at the `pause_at`-th it asks for a pause (as `vm.pause` would,
/// from the vCPU's own exit: no kick needed), at the `stop_at`-th it stops the run.
struct Counts {
    seen: Mutex<Vec<u8>>,
    control: Arc<RunControl>,
    pause_at: usize,
    stop_at: usize,
}

impl BusDevice for Counts {
    fn read(&self, _offset: u64, _data: &mut [u8]) {}
    fn write(&self, _offset: u64, data: &[u8]) {
        let mut seen = self.seen.lock().unwrap();
        seen.push(data[0]);
        if seen.len() == self.pause_at {
            self.control.pause().request().unwrap();
        }
        if seen.len() == self.stop_at {
            self.control.stop(StopReason::GuestDone(0));
        }
    }
}

fn counting_buses(
    control: &Arc<RunControl>,
    pause_at: usize,
    stop_at: usize,
) -> (IoBuses, Arc<Counts>) {
    let mut io = IoBuses::default();
    let counts = Arc::new(Counts {
        seen: Mutex::new(Vec::new()),
        control: control.clone(),
        pause_at,
        stop_at,
    });
    io.add_pio("counts", 0x80, 1, counts.clone()).unwrap();
    (io, counts)
}

/// Run the counting guest until it has written five counts and parked; take its vCPU (on the
/// vCPU's thread, `Pause::save_vcpus`), the VM's state and its memory (and its checksum).
fn counted_to_five(memory: &TempFile) -> (VcpuState, crate::vm::state::VmState, u8, u32) {
    let (vm, vcpu) = vcpu_running(COUNTING);
    // Something of the IOAPIC's own, for the VM state to carry: pin 3's redirection entry.
    let mut ioapic = kvm_irqchip {
        chip_id: KVM_IRQCHIP_IOAPIC,
        ..Default::default()
    };
    vm.fd().get_irqchip(&mut ioapic).unwrap();
    // SAFETY: chip 2 is the IOAPIC: `ioapic` is the union's member KVM filled in.
    unsafe { ioapic.chip.ioapic.redirtbl[3].bits = 0x0300_0000_0001_a031 };
    vm.fd().set_irqchip(&ioapic).unwrap();
    let control = Arc::new(RunControl::default());
    let (io, counts) = counting_buses(&control, 5, usize::MAX);
    let running = {
        let control = control.clone();
        std::thread::spawn(move || vcpu.run(&io, &ExitCounters::new(1), &control))
    };
    assert!(
        control
            .pause()
            .wait_parked(Duration::from_secs(60), || control.is_stopping())
    );
    let mut states = control.pause().save_vcpus(Duration::from_secs(60)).unwrap();
    let vm_state = vm.save_state().unwrap();
    let mut file = std::fs::File::create(&memory.0).unwrap();
    let checksum = vm.save_memory(&mut file).unwrap();
    control.stop(StopReason::GuestDone(0));
    control.pause().notify_stop();
    running.join().unwrap();
    let last = *counts.seen.lock().unwrap().last().unwrap();
    assert_eq!(states.len(), 1);
    (states.remove(0), vm_state, last, checksum)
}

fn json<T: serde::Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap()
}

#[test]
fn a_guest_taken_at_a_pause_goes_on_in_a_fresh_vm() {
    let memory = TempFile::new("vcpu-round-trip");
    let (mut state, vm_state, last, checksum) = counted_to_five(&memory);
    assert_eq!(last, 5);
    assert_eq!(state.regs.rax, 5, "the count in rax");
    assert_eq!(
        state.regs.rip,
        PROBE_LOAD_ADDR + 13,
        "past the out: the exit was completed before the state was taken"
    );
    assert!(
        state.sregs.efer & (1 << 10) != 0,
        "long mode active (EFER.LMA)"
    );
    assert!(!state.msrs.is_empty(), "MSRs taken");
    // Values the guest never set, to see that each part is set on the new vCPU, not left as
    // it was: XMM0's low word in the XSAVE area (Intel SDM Vol. 1 §13.4.1: XMM0 at byte 160),
    // with the SSE bit of XSTATE_BV (byte 512, §13.4.2) so that it is not the init state,
    // IA32_KERNEL_GS_BASE, and the local APIC's task priority (TPR, offset 80H: Intel SDM
    // Vol. 3A §11.8.3.1) with CR8, which mirrors its priority class (§11.8.6.1).
    const KERNEL_GS_BASE: u32 = 0xc000_0102;
    const TPR: usize = 0x80;
    state.lapic.regs[TPR] = 0x20;
    state.sregs.cr8 = 2;
    if let Some(xsave) = state.xsave.as_mut() {
        xsave.region[160 / 4] = 0x5a5a_5a5a;
        xsave.region[512 / 4] |= 1 << 1;
    }
    state
        .msrs
        .iter_mut()
        .filter(|m| m.index == KERNEL_GS_BASE)
        .for_each(|m| m.data = 0xffff_8000_1234_5000);

    // The state through its JSON, as a snapshot keeps it.
    let state: VcpuState = serde_json::from_value(json(&state)).unwrap();
    let vm_state: crate::vm::state::VmState = serde_json::from_value(json(&vm_state)).unwrap();
    let file = crate::vm::state::memory::SavedMemory {
        file: std::fs::File::open(&memory.0).unwrap(),
        checksum,
    };
    let vm = crate::vm::Vm::restored(
        &[(0, 16 << 20)],
        false,
        Irqchip::InKernel,
        RamBacking::Private,
        file,
    )
    .unwrap();
    assert_eq!(
        vm.memory().read_obj::<u64>(GuestAddress(COUNTER)).unwrap(),
        5
    );
    vm.restore_state(&vm_state).unwrap();
    let cpuid = Vcpu::machine_cpuid(&vm, &Default::default()).unwrap();
    let vcpu = Vcpu::new(&vm, 0, &cpuid).unwrap();
    vcpu.restore_state(&state).unwrap();

    let back = vcpu.save_state().unwrap();
    for part in [
        "mp_state",
        "regs",
        "sregs",
        "xsave",
        "xcrs",
        "debug_regs",
        "events",
    ] {
        assert_eq!(json(&back)[part], json(&state)[part], "{part}");
    }
    assert_eq!(back.lapic.regs[TPR], 0x20, "the local APIC's TPR");
    let msr = |s: &VcpuState| {
        s.msrs
            .iter()
            .find(|m| m.index == KERNEL_GS_BASE)
            .map(|m| m.data)
    };
    assert_eq!(msr(&back), msr(&state));
    assert_eq!(
        back.msrs.iter().map(|m| m.index).collect::<Vec<_>>(),
        state.msrs.iter().map(|m| m.index).collect::<Vec<_>>()
    );
    assert_eq!(
        json(&vm.save_state().unwrap())["irqchip"],
        json(&vm_state)["irqchip"],
        "PICs and IOAPIC, pin 3's entry with them"
    );

    let control = Arc::new(RunControl::default());
    let (io, counts) = counting_buses(&control, usize::MAX, 3);
    vcpu.run(&io, &ExitCounters::new(1), &control);
    assert_eq!(
        *counts.seen.lock().unwrap(),
        vec![6, 7, 8],
        "on from 5, none repeated"
    );
    assert_eq!(
        vm.memory().read_obj::<u64>(GuestAddress(COUNTER)).unwrap(),
        8
    );
}

#[test]
fn a_state_this_vcpu_cannot_take_is_refused() {
    let memory = TempFile::new("vcpu-refused");
    let (mut state, _, _, _) = counted_to_five(&memory);
    let (_vm, vcpu) = vcpu_running(COUNTING);
    state.msrs.push(Msr {
        index: 0xdead_beef,
        data: 1,
    });
    match vcpu.restore_state(&state) {
        Err(VmError::MsrNotSet { index, data }) => assert_eq!((index, data), (0xdead_beef, 1)),
        other => panic!("{other:?}"),
    }
    state.msrs.pop();
    // A TSC within Firecracker's tolerance is left as it runs; one at twice the rate is set
    // where KVM scales TSCs, and refused where it cannot.
    let khz = vcpu.tsc_khz().expect("this host's KVM says its TSC rate");
    state.tsc_khz = Some(khz + 1);
    vcpu.restore_state(&state).unwrap();
    assert_eq!(vcpu.tsc_khz(), Some(khz));
    state.tsc_khz = Some(khz * 2);
    match vcpu.restore_state(&state) {
        Ok(()) => assert_eq!(vcpu.tsc_khz(), Some(khz * 2)),
        Err(e) => assert!(e.to_string().contains("set the TSC frequency"), "{e}"),
    }
    let mut json = json(&state);
    json["regs"] = "00ff".into();
    let e = serde_json::from_value::<VcpuState>(json).unwrap_err();
    assert!(e.to_string().contains("2 bytes where kvm_regs are"), "{e}");
}
