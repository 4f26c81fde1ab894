//! vCPUs: setup, the exit dispatcher, and the per-vCPU thread loop.
//!
//! The loop only runs the vCPU and hands each exit to [`handle_exit`], which routes port and
//! MMIO accesses to the buses and counts them; everything else is a device's business.

use kvm_bindings::{
    CpuId, KVM_MAX_CPUID_ENTRIES, KVM_MP_STATE_INIT_RECEIVED, KVM_MP_STATE_RUNNABLE, kvm_mp_state,
    kvm_regs, kvm_sregs,
};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::signal::register_signal_handler;

use crate::bus::{DeviceId, IoBuses};
use crate::exits::{ExitCounters, ExitKind};
use crate::irq::regs::{IOAPIC_BASE, IOAPIC_EOI};
use crate::seccomp::kick_signal;
use crate::vm::boot::{RFLAGS_BOOT, protected_mode_sregs, real_mode_sregs};
use crate::vm::cpuid::{self, CpuTemplate};
use crate::vm::kvm_run::{MAX_INSTRUCTION_BYTES, RunPage};
use crate::vm::run_control::{RunControl, StopReason};
use crate::vm::sleep::WakeEntry;
use crate::vm::{Vm, VmError};

/// What the loop does after an exit.
#[derive(Debug, PartialEq, Eq)]
pub enum ExitAction {
    /// Re-enter the guest.
    Resume,
    /// Stop this vCPU and the run.
    Stop(StopReason),
}

/// Count an access exit; one at an address no device claims also gets a rate-limited warning
/// (the access itself is harmless: reads see all-ones, writes are dropped).
fn account(counters: &ExitCounters, kind: ExitKind, device: Option<DeviceId>, addr: u64) {
    counters.record(kind, device);
    if device.is_none() {
        crate::guest_error!(
            counters.unclaimed_log(),
            "guest {} at {addr:#x}: no device there",
            kind.name()
        );
    }
}

/// The elements of a port exit: `data` holds `data.len() / size` accesses of `size` bytes, in
/// order. A `rep ins/outs` string is one exit for `count` elements (api.rst §5, KVM_EXIT_IO:
/// "Data format is a packed array"); a size KVM never reports (0, or one that does not divide the
/// data) falls back to one access of the whole data, so a bad value cannot panic.
fn pio_element(size: u8, data_len: usize) -> usize {
    match usize::from(size) {
        s @ (1 | 2 | 4) if data_len.is_multiple_of(s) => s,
        _ => data_len.max(1),
    }
}

/// Count one exit, then route it to the buses. No KVM needed: tests feed it synthetic exits.
///
/// `pio_size` is the element size of a port exit (`kvm_run.io.size`, which kvm-ioctls'
/// `IoIn`/`IoOut` drop); other exits ignore it.
pub fn handle_exit(
    exit: VcpuExit<'_>,
    pio_size: u8,
    io: &IoBuses,
    counters: &ExitCounters,
) -> ExitAction {
    match exit {
        VcpuExit::IoIn(port, data) => {
            let device = io.pio.device_at(port.into());
            account(counters, ExitKind::PioRead, device, port.into());
            for element in data.chunks_mut(pio_element(pio_size, data.len())) {
                io.pio.read(port.into(), element);
            }
        }
        VcpuExit::IoOut(port, data) => {
            let device = io.pio.device_at(port.into());
            account(counters, ExitKind::PioWrite, device, port.into());
            for element in data.chunks(pio_element(pio_size, data.len())) {
                io.pio.write(port.into(), element);
            }
        }
        VcpuExit::MmioRead(addr, data) => {
            account(counters, ExitKind::MmioRead, io.mmio.device_at(addr), addr);
            io.mmio.read(addr, data);
        }
        VcpuExit::MmioWrite(addr, data) => {
            account(counters, ExitKind::MmioWrite, io.mmio.device_at(addr), addr);
            io.mmio.write(addr, data);
        }
        VcpuExit::IoapicEoi(vector) => {
            // Under a split irqchip, the EOI of a level-triggered IOAPIC vector (api.rst §5,
            // KVM_EXIT_IOAPIC_EOI): what the IOAPIC's EOI register does with it.
            counters.record(ExitKind::Other, None);
            io.mmio
                .write(IOAPIC_BASE + IOAPIC_EOI, &u32::from(vector).to_le_bytes());
        }
        VcpuExit::Hlt | VcpuExit::IrqWindowOpen | VcpuExit::Intr => {
            counters.record(ExitKind::Other, None);
        }
        VcpuExit::Shutdown => {
            counters.record(ExitKind::Other, None);
            return ExitAction::Stop(StopReason::Shutdown);
        }
        other => {
            counters.record(ExitKind::Other, None);
            return ExitAction::Stop(StopReason::VcpuFailed(format!("unexpected exit {other:?}")));
        }
    }
    ExitAction::Resume
}

/// Stops the run when a vCPU thread ends for any reason, a panic included, so the VMM thread
/// never waits on a vCPU that is gone. A normal end finds the reason already set: no effect.
struct StopOnExit<'a>(&'a RunControl, u8);

impl Drop for StopOnExit<'_> {
    fn drop(&mut self) {
        self.0.stop(StopReason::VcpuFailed(format!(
            "vCPU {} thread ended unexpectedly",
            self.1
        )));
    }
}

/// The general registers at a waking vector: all clear but the instruction pointer and the
/// always-one RFLAGS bit, as after a reset (Intel SDM Vol. 3A §9.1.1, table 9-1).
pub fn wake_regs(entry: WakeEntry) -> kvm_regs {
    let rip = match entry {
        WakeEntry::Real { ip, .. } => ip.into(),
        WakeEntry::Protected32(at) => at.into(),
    };
    kvm_regs {
        rip,
        rflags: RFLAGS_BOOT,
        ..Default::default()
    }
}

/// The special registers at a waking vector (ACPI 6.5 §5.2.10): real mode with CS at the
/// vector's segment, or flat 32-bit protected mode with paging off.
pub fn wake_sregs(current: kvm_sregs, entry: WakeEntry) -> kvm_sregs {
    match entry {
        WakeEntry::Real { cs, .. } => real_mode_sregs(current, cs),
        WakeEntry::Protected32(_) => protected_mode_sregs(current),
    }
}

/// One vCPU and its view of the `kvm_run` page.
pub struct Vcpu {
    fd: VcpuFd,
    run_page: RunPage,
    index: u8,
    /// Guest RAM, read only to show the bytes of an instruction KVM cannot emulate.
    memory: GuestMemoryMmap,
    /// What of its state a snapshot can take on this KVM.
    coverage: state::Coverage,
}

/// `cc 0f 0b`: bytes as a disassembler lists them.
fn hex_bytes(bytes: &[u8]) -> String {
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    hex.join(" ")
}

extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Nothing to do: the signal's only job is to make KVM_RUN return EINTR.
}

/// Install the kick handler once per process.
pub fn install_kick_handler() -> Result<(), VmError> {
    // The outcome is kept: a failed install must fail every run, or the first kick (whose
    // default action terminates the process) would.
    static INSTALLED: std::sync::OnceLock<Result<(), i32>> = std::sync::OnceLock::new();
    let result = INSTALLED.get_or_init(|| {
        register_signal_handler(kick_signal(), kick_handler).map_err(|e| e.errno())
    });
    result.map_err(|errno| VmError::Kvm {
        what: "install the vCPU kick signal handler",
        source: kvm_ioctls::Error::new(errno),
    })
}

impl Vcpu {
    /// Create vCPU `index` in KVM's reset state, with the machine's CPUID `cpuid`
    /// ([`cpuid::guest`]) and its own APIC ID. With the in-kernel irqchip
    /// the boot vCPU (0) is runnable and the others wait for INIT/SIPI
    /// (`KVM_MP_STATE_UNINITIALIZED`, api.rst §4.38) until [`Vcpu::set_entry`] starts them.
    pub fn new(vm: &Vm, index: u8, cpuid: &CpuId) -> Result<Self, VmError> {
        let err = |what| move |source| VmError::Kvm { what, source };
        let fd = vm
            .fd()
            .create_vcpu(index.into())
            .map_err(err("create vCPU"))?;
        fd.set_cpuid2(&cpuid::for_vcpu(cpuid.clone(), index))
            .map_err(err("set CPUID"))?;
        let run_page = RunPage::new(&fd)?;
        let coverage = state::Coverage::of(vm, &fd)?;
        Ok(Vcpu {
            fd,
            run_page,
            index,
            memory: vm.memory().clone(),
            coverage,
        })
    }

    /// Enter the guest with `regs`, and the special registers `sregs` makes of the current
    /// ones: a loader's entry state. A vCPU other than the boot one starts there at once
    /// instead of waiting for INIT/SIPI.
    pub fn set_entry(
        &self,
        regs: &kvm_regs,
        sregs: impl FnOnce(kvm_sregs) -> kvm_sregs,
    ) -> Result<(), VmError> {
        let err = |what| move |source| VmError::Kvm { what, source };
        let current = self.fd.get_sregs().map_err(err("get sregs"))?;
        self.fd
            .set_sregs(&sregs(current))
            .map_err(err("set sregs"))?;
        self.fd.set_regs(regs).map_err(err("set regs"))?;
        if self.index != 0 {
            self.fd
                .set_mp_state(kvm_mp_state {
                    mp_state: KVM_MP_STATE_RUNNABLE,
                })
                .map_err(err("set MP state"))?;
        }
        Ok(())
    }

    /// The machine's CPUID for `template`: what KVM supports, shaped by it.
    pub fn machine_cpuid(vm: &Vm, template: &CpuTemplate) -> Result<CpuId, VmError> {
        let supported = vm
            .kvm()
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(|source| VmError::Kvm {
                what: "get supported CPUID",
                source,
            })?;
        Ok(cpuid::guest(&supported, template)?)
    }

    /// The TSC frequency KVM gives this vCPU, in kHz.
    pub fn tsc_khz(&self) -> Option<u32> {
        self.fd.get_tsc_khz().ok()
    }

    /// One line on a `KVM_EXIT_INTERNAL_ERROR`: where the guest was, and KVM's reason. On a
    /// host whose KVM emulates ring 0 (docs/host-kvm.md) it is most often an instruction the
    /// emulator lacks (suberror 1).
    fn internal_error(&self) -> String {
        let regs = self.fd.get_regs();
        let rip = regs
            .as_ref()
            .map_or_else(|e| format!("unknown ({e})"), |r| format!("{:#x}", r.rip));
        let why = match self.run_page.internal_suberror() {
            kvm_bindings::KVM_INTERNAL_ERROR_EMULATION => {
                let code = self
                    .run_page
                    .emulation_failure_bytes()
                    .or_else(|| self.code_at(regs.ok()?.rip))
                    .map_or_else(|| "unreadable".to_owned(), |bytes| hex_bytes(&bytes));
                format!("KVM cannot emulate the instruction there (code: {code})")
            }
            other => format!("KVM internal error, suberror {other}"),
        };
        format!("vCPU {} at rip {rip}: {why}", self.index)
    }

    /// Which vCPU shut down and where KVM left it, for the log: on Intel the state at the
    /// triple fault; on AMD, whose VMCB is undefined after a shutdown, KVM's reset state
    /// (arch/x86/kvm/svm/svm.c, shutdown_interception), which says only which vCPU it was.
    fn shutdown_state(&self) -> String {
        let at = match (self.fd.get_regs(), self.fd.get_sregs()) {
            (Ok(r), Ok(s)) => format!(
                "rip {:#x} rsp {:#x} cs {:#x} cr0 {:#x} cr3 {:#x} cr4 {:#x} efer {:#x}",
                r.rip, r.rsp, s.cs.selector, s.cr0, s.cr3, s.cr4, s.efer
            ),
            (Err(e), _) | (_, Err(e)) => format!("unreadable state ({e})"),
        };
        format!(
            "vCPU {} shut down (a triple fault); KVM left it at {at}",
            self.index
        )
    }

    /// Up to [`MAX_INSTRUCTION_BYTES`] of code at `rip`, read through the guest's own page
    /// tables (`KVM_TRANSLATE`), for a KVM that does not hand over the failing instruction.
    /// Stops at the first byte that does not translate to guest RAM.
    fn code_at(&self, rip: u64) -> Option<Vec<u8>> {
        let sregs = self.fd.get_sregs().ok()?;
        // A 64-bit code segment has no base (Intel SDM Vol. 3A §3.4.4); others do.
        let base = if sregs.cs.l == 1 { 0 } else { sregs.cs.base };
        let mut bytes = Vec::with_capacity(MAX_INSTRUCTION_BYTES);
        for linear in (0..MAX_INSTRUCTION_BYTES as u64).map(|i| base.wrapping_add(rip) + i) {
            let byte = self
                .fd
                .translate_gva(linear)
                .ok()
                .filter(|t| t.valid != 0)
                .and_then(|t| {
                    self.memory
                        .read_obj::<u8>(GuestAddress(t.physical_address))
                        .ok()
                });
            match byte {
                Some(b) => bytes.push(b),
                None => break,
            }
        }
        (!bytes.is_empty()).then_some(bytes)
    }

    /// Finish the exit this vCPU is in (an OUT to PM1 control, an MMIO read's data), so its
    /// state is that of an instruction boundary: KVM_RUN with immediate_exit completes it and
    /// returns at once (api.rst §5, immediate_exit), as QEMU's paused vCPUs do. Completing one
    /// access can need userspace again (the second half of an MMIO access KVM split, the next
    /// round of a string I/O instruction): KVM then returns that exit instead, which is served
    /// like any other until KVM says EINTR. Left unserved, the guest would resume with a
    /// write lost or a read's data stale, mid-instruction. No guest code runs in between, only
    /// the rest of the one instruction (a long string I/O instruction needs an exit per page):
    /// a pause that instruction outlasts times out, as for a vCPU stuck in a device.
    fn complete_exit(&mut self, io: &IoBuses, counters: &ExitCounters, control: &RunControl) {
        self.fd.set_kvm_immediate_exit(1);
        while !control.is_stopping() {
            let action = match self.fd.run() {
                Ok(VcpuExit::InternalError) => {
                    ExitAction::Stop(StopReason::VcpuFailed(self.internal_error()))
                }
                Ok(exit) => handle_exit(exit, self.run_page.pio_size(), io, counters),
                // EINTR: nothing (more) to complete.
                Err(_) => break,
            };
            if let ExitAction::Stop(reason) = action {
                control.stop(reason);
                break;
            }
        }
        self.fd.set_kvm_immediate_exit(0);
    }

    /// Park until the VMM's user resumes the machine, at an instruction boundary; then tell
    /// the guest its vCPU was stopped, so its watchdogs do not take the time it was parked
    /// for a CPU stuck in the kernel.
    fn pause(&mut self, io: &IoBuses, counters: &ExitCounters, control: &RunControl) {
        self.complete_exit(io, counters, control);
        control
            .pause()
            .park(self.index, || control.is_stopping(), || self.save_state());
        self.flag_stopped();
    }

    /// KVM_KVMCLOCK_CTRL (api.rst): KVM sets PVCLOCK_GUEST_STOPPED in the guest's kvmclock
    /// page, which Linux's soft-lockup and RCU-stall detectors check and clear before they
    /// report (QEMU does this on every resume). A guest that never enabled kvmclock (the
    /// probe, the test kernel) has no such page: KVM answers EINVAL, which is no fault.
    fn flag_stopped(&self) {
        match self.fd.kvmclock_ctrl() {
            Ok(()) => {}
            Err(e) if e.errno() == libc::EINVAL => {}
            Err(e) => log::warn!("vCPU {}: KVM_KVMCLOCK_CTRL failed: {e}", self.index),
        }
    }

    /// Park for S3 until the machine wakes, then restart as firmware hands over after S3 (ACPI
    /// 6.5 §16.1.3): the boot vCPU at the waking vector, the others waiting for INIT/SIPI.
    fn sleep(&mut self, io: &IoBuses, counters: &ExitCounters, control: &RunControl) {
        // Finish the exit before the vCPU's state is replaced.
        self.complete_exit(io, counters, control);
        let Some(entry) = control.sleep().park(|| control.is_stopping()) else {
            return;
        };
        let err = |what| move |source| VmError::Kvm { what, source };
        // The boot vCPU may have been halted when kicked (another vCPU asked for S3).
        let (mp_state, entry) = match self.index {
            0 => (KVM_MP_STATE_RUNNABLE, Some(entry)),
            _ => (KVM_MP_STATE_INIT_RECEIVED, None),
        };
        let restarted = entry
            .map_or(Ok(()), |e| {
                self.set_entry(&wake_regs(e), |current| wake_sregs(current, e))
            })
            .and_then(|()| {
                self.fd
                    .set_mp_state(kvm_mp_state { mp_state })
                    .map_err(err("set MP state"))
            });
        if let Err(e) = restarted {
            control.stop(StopReason::VcpuFailed(format!(
                "vCPU {} could not resume from S3: {e}",
                self.index
            )));
        }
    }

    /// Run until the run is stopped.
    pub fn run(mut self, io: &IoBuses, counters: &ExitCounters, control: &RunControl) {
        let _stop_on_exit = StopOnExit(control, self.index);
        while !control.is_stopping() {
            // A pause first: a vCPU that asked for S3 parks in it until resumed, then sleeps.
            if control.pause().must_park() {
                self.pause(io, counters, control);
                continue;
            }
            if control.sleep().must_park() {
                self.sleep(io, counters, control);
                continue;
            }
            let action = match self.fd.run() {
                Ok(VcpuExit::InternalError) => {
                    ExitAction::Stop(StopReason::VcpuFailed(self.internal_error()))
                }
                Ok(exit) => handle_exit(exit, self.run_page.pio_size(), io, counters),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    ExitAction::Resume
                }
                Err(e) => ExitAction::Stop(StopReason::VcpuFailed(format!(
                    "vCPU {}: KVM_RUN: {e}",
                    self.index
                ))),
            };
            if let ExitAction::Stop(reason) = action {
                if reason == StopReason::Shutdown {
                    log::error!("{}", self.shutdown_state());
                }
                control.stop(reason);
            }
        }
    }
}

mod state;

#[cfg(test)]
mod tests;
