//! vCPUs: setup, the exit dispatcher, and the per-vCPU thread loop.
//!
//! The loop only runs the vCPU and hands each exit to [`handle_exit`], which routes port and
//! MMIO accesses to the buses and counts them; everything else is a device's business.

use kvm_bindings::{
    KVM_MAX_CPUID_ENTRIES, KVM_MP_STATE_RUNNABLE, kvm_mp_state, kvm_regs, kvm_sregs,
};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vmm_sys_util::signal::{SIGRTMIN, register_signal_handler};

use crate::bus::{DeviceId, IoBuses};
use crate::stats::{ExitCounters, ExitKind};
use crate::vm::run_control::{RunControl, StopReason};
use crate::vm::{Vm, VmError, boot, cpuid};

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
        warn_ratelimited!("guest {} at {addr:#x}: no device there", kind.name());
    }
}

/// Count one exit, then route it to the buses. No KVM needed: tests feed it synthetic exits.
pub fn handle_exit(exit: VcpuExit<'_>, io: &IoBuses, counters: &ExitCounters) -> ExitAction {
    match exit {
        VcpuExit::IoIn(port, data) => {
            account(
                counters,
                ExitKind::PioRead,
                io.pio.device_at(port.into()),
                port.into(),
            );
            io.pio.read(port.into(), data);
        }
        VcpuExit::IoOut(port, data) => {
            account(
                counters,
                ExitKind::PioWrite,
                io.pio.device_at(port.into()),
                port.into(),
            );
            io.pio.write(port.into(), data);
        }
        VcpuExit::MmioRead(addr, data) => {
            account(counters, ExitKind::MmioRead, io.mmio.device_at(addr), addr);
            io.mmio.read(addr, data);
        }
        VcpuExit::MmioWrite(addr, data) => {
            account(counters, ExitKind::MmioWrite, io.mmio.device_at(addr), addr);
            io.mmio.write(addr, data);
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

/// One vCPU, configured for the probe's entry.
pub struct Vcpu {
    fd: VcpuFd,
    index: u8,
}

extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Nothing to do: the signal's only job is to make KVM_RUN return EINTR.
}

/// The signal that kicks a vCPU thread out of `KVM_RUN`.
pub fn kick_signal() -> libc::c_int {
    SIGRTMIN()
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
    /// Create vCPU `index` in long mode at the probe entry.
    pub fn new(vm: &Vm, index: u8) -> Result<Self, VmError> {
        let err = |what| move |source| VmError::Kvm { what, source };
        let fd = vm
            .fd()
            .create_vcpu(index.into())
            .map_err(err("create vCPU"))?;
        let supported = vm
            .kvm()
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(err("get supported CPUID"))?;
        fd.set_cpuid2(&cpuid::for_vcpu(supported, index))
            .map_err(err("set CPUID"))?;
        let sregs = fd.get_sregs().map_err(err("get sregs"))?;
        fd.set_sregs(&boot::long_mode_sregs(sregs))
            .map_err(err("set sregs"))?;
        fd.set_regs(&boot::entry_regs(index.into()))
            .map_err(err("set regs"))?;
        if index != 0 {
            // With the in-kernel LAPIC an AP waits for INIT/SIPI; ours start at the probe entry
            // directly, which parks them.
            fd.set_mp_state(kvm_mp_state {
                mp_state: KVM_MP_STATE_RUNNABLE,
            })
            .map_err(err("set MP state"))?;
        }
        Ok(Vcpu { fd, index })
    }

    /// Enter the guest with `regs`, and the special registers `sregs` makes of the current
    /// ones: a loader's entry state, set on the boot vCPU after [`Vcpu::new`].
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
        self.fd.set_regs(regs).map_err(err("set regs"))
    }

    /// The TSC frequency KVM gives this vCPU, in kHz.
    pub fn tsc_khz(&self) -> Option<u32> {
        self.fd.get_tsc_khz().ok()
    }

    /// Run until the run is stopped.
    pub fn run(mut self, io: &IoBuses, counters: &ExitCounters, control: &RunControl) {
        let _stop_on_exit = StopOnExit(control, self.index);
        while !control.is_stopping() {
            let action = match self.fd.run() {
                Ok(exit) => handle_exit(exit, io, counters),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    ExitAction::Resume
                }
                Err(e) => ExitAction::Stop(StopReason::VcpuFailed(format!(
                    "vCPU {}: KVM_RUN: {e}",
                    self.index
                ))),
            };
            if let ExitAction::Stop(reason) = action {
                control.stop(reason);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::BusDevice;
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Latch(Mutex<Vec<u8>>);

    impl BusDevice for Latch {
        fn read(&self, _offset: u64, data: &mut [u8]) {
            data.fill(0x5a);
        }
        fn write(&self, _offset: u64, data: &[u8]) {
            self.0.lock().unwrap().extend_from_slice(data);
        }
    }

    #[test]
    fn port_and_mmio_exits_reach_their_device_and_are_counted() {
        let mut io = IoBuses::default();
        let latch = Arc::new(Latch::default());
        let pio = io.add_pio("latch", 0x80, 1, latch.clone()).unwrap();
        io.add_mmio("latch", 0x1000, 0x10, latch.clone()).unwrap();
        let counters = ExitCounters::new(io.names.len());
        let mut buf = [0u8; 2];
        assert_eq!(
            handle_exit(VcpuExit::IoOut(0x80, &[7]), &io, &counters),
            ExitAction::Resume
        );
        assert_eq!(
            handle_exit(VcpuExit::MmioRead(0x1004, &mut buf), &io, &counters),
            ExitAction::Resume
        );
        assert_eq!(buf, [0x5a, 0x5a]);
        handle_exit(VcpuExit::MmioWrite(0x2000, &[1]), &io, &counters); // unclaimed
        let s = counters.snapshot();
        assert_eq!(*latch.0.lock().unwrap(), vec![7]);
        assert_eq!(s.of_device(pio), 2);
        assert_eq!(s.of_kind(ExitKind::PioWrite), 1);
        assert_eq!(s.of_kind(ExitKind::MmioWrite), 1);
        assert_eq!(s.by_device.last(), Some(&1), "the unclaimed write");
    }

    #[test]
    fn shutdown_and_unexpected_exits_stop_the_run() {
        let io = IoBuses::default();
        let counters = ExitCounters::new(0);
        assert_eq!(
            handle_exit(VcpuExit::Shutdown, &io, &counters),
            ExitAction::Stop(StopReason::Shutdown)
        );
        assert!(matches!(
            handle_exit(VcpuExit::FailEntry(0, 0), &io, &counters),
            ExitAction::Stop(StopReason::VcpuFailed(_))
        ));
        assert_eq!(
            handle_exit(VcpuExit::Hlt, &io, &counters),
            ExitAction::Resume
        );
    }
}
