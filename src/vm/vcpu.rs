//! vCPUs: setup, the exit dispatcher, and the per-vCPU thread loop.
//!
//! The loop only runs the vCPU and hands each exit to [`handle_exit`], which routes port and
//! MMIO accesses to the buses and counts them; everything else is a device's business.

use kvm_bindings::{
    KVM_MAX_CPUID_ENTRIES, KVM_MP_STATE_RUNNABLE, kvm_mp_state, kvm_regs, kvm_sregs,
};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::signal::register_signal_handler;

use crate::bus::{DeviceId, IoBuses};
use crate::seccomp::kick_signal;
use crate::stats::{ExitCounters, ExitKind};
use crate::vm::kvm_run::{MAX_INSTRUCTION_BYTES, RunPage};
use crate::vm::run_control::{RunControl, StopReason};
use crate::vm::{Vm, VmError, cpuid};

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

/// One vCPU and its view of the `kvm_run` page.
pub struct Vcpu {
    fd: VcpuFd,
    run_page: RunPage,
    index: u8,
    /// Guest RAM, read only to show the bytes of an instruction KVM cannot emulate.
    memory: GuestMemoryMmap,
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
    /// Create vCPU `index` in KVM's reset state, with its CPUID. With the in-kernel irqchip
    /// the boot vCPU (0) is runnable and the others wait for INIT/SIPI
    /// (`KVM_MP_STATE_UNINITIALIZED`, api.rst §4.38) until [`Vcpu::set_entry`] starts them.
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
        let run_page = RunPage::new(&fd)?;
        Ok(Vcpu {
            fd,
            run_page,
            index,
            memory: vm.memory().clone(),
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

    /// The TSC frequency KVM gives this vCPU, in kHz.
    pub fn tsc_khz(&self) -> Option<u32> {
        self.fd.get_tsc_khz().ok()
    }

    /// One line on a `KVM_EXIT_INTERNAL_ERROR`: where the guest was, and KVM's reason. On a
    /// host whose KVM emulates ring 0 (PLATFORM.md) it is most often an instruction the
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

    /// Run until the run is stopped.
    pub fn run(mut self, io: &IoBuses, counters: &ExitCounters, control: &RunControl) {
        let _stop_on_exit = StopOnExit(control, self.index);
        while !control.is_stopping() {
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
                control.stop(reason);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::BusDevice;
    use crate::vm::boot;
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
            handle_exit(VcpuExit::IoOut(0x80, &[7]), 1, &io, &counters),
            ExitAction::Resume
        );
        assert_eq!(
            handle_exit(VcpuExit::MmioRead(0x1004, &mut buf), 0, &io, &counters),
            ExitAction::Resume
        );
        assert_eq!(buf, [0x5a, 0x5a]);
        handle_exit(VcpuExit::MmioWrite(0x2000, &[1]), 0, &io, &counters); // unclaimed
        let s = counters.snapshot();
        assert_eq!(*latch.0.lock().unwrap(), vec![7]);
        assert_eq!(s.of_device(pio), 2);
        assert_eq!(s.of_kind(ExitKind::PioWrite), 1);
        assert_eq!(s.of_kind(ExitKind::MmioWrite), 1);
        assert_eq!(s.by_device.last(), Some(&1), "the unclaimed write");
    }

    /// Records every access as (offset, bytes); reads count up from 1.
    #[derive(Default)]
    struct Recorder {
        writes: Mutex<Vec<(u64, Vec<u8>)>>,
        reads: Mutex<u8>,
    }

    impl BusDevice for Recorder {
        fn read(&self, _offset: u64, data: &mut [u8]) {
            let mut n = self.reads.lock().unwrap();
            *n += 1;
            data.fill(*n);
        }
        fn write(&self, offset: u64, data: &[u8]) {
            self.writes.lock().unwrap().push((offset, data.to_vec()));
        }
    }

    #[test]
    fn string_port_io_is_one_access_per_element() {
        let mut io = IoBuses::default();
        let rec = Arc::new(Recorder::default());
        let id = io.add_pio("rec", 0x3f8, 8, rec.clone()).unwrap();
        let counters = ExitCounters::new(io.names.len());
        // `rep outsb` of "hi!": one exit, three byte writes to the same port, in order.
        handle_exit(VcpuExit::IoOut(0x3f8, b"hi!"), 1, &io, &counters);
        // `rep outsw` of two words.
        handle_exit(VcpuExit::IoOut(0x3fa, &[1, 2, 3, 4]), 2, &io, &counters);
        let expected = [(0, b"h".to_vec()), (0, b"i".to_vec()), (0, b"!".to_vec())];
        let mut expected = expected.to_vec();
        expected.extend([(2, vec![1, 2]), (2, vec![3, 4])]);
        assert_eq!(*rec.writes.lock().unwrap(), expected);
        // `rep insb` of four bytes: four reads.
        let mut buf = [0u8; 4];
        handle_exit(VcpuExit::IoIn(0x3f8, &mut buf), 1, &io, &counters);
        assert_eq!(buf, [1, 2, 3, 4]);
        let s = counters.snapshot();
        assert_eq!(s.of_device(id), 3, "one exit per string, not per element");
        // A size KVM never reports is one access of the whole data, not a panic.
        handle_exit(VcpuExit::IoOut(0x3f8, &[9, 9, 9]), 2, &io, &counters);
        handle_exit(VcpuExit::IoOut(0x3f8, &[]), 0, &io, &counters);
        assert_eq!(rec.writes.lock().unwrap().last(), Some(&(0, vec![9, 9, 9])));
    }

    #[test]
    fn rep_outsb_reaches_the_console() {
        use crate::devices::serial::{ConsoleOutput, SerialConsole};
        use crate::logging::DeviceLog;
        let mut io = IoBuses::default();
        let log = Arc::new(Mutex::new(Vec::new()));
        let out = ConsoleOutput::Buffer(log.clone());
        let serial = SerialConsole::new(
            vmm_sys_util::eventfd::EventFd::new(0).unwrap(),
            out,
            DeviceLog::new("serial"),
        )
        .unwrap();
        io.add_pio("serial", 0x3f8, 8, Arc::new(serial)).unwrap();
        let counters = ExitCounters::new(io.names.len());
        handle_exit(VcpuExit::IoOut(0x3f8, b"hi!"), 1, &io, &counters);
        assert_eq!(&log.lock().unwrap()[..], b"hi!");
    }

    /// Stops the run on any write: the guest's "done".
    struct Done(Arc<RunControl>);

    impl BusDevice for Done {
        fn read(&self, _offset: u64, _data: &mut [u8]) {}
        fn write(&self, _offset: u64, _data: &[u8]) {
            self.0.stop(StopReason::GuestDone(0));
        }
    }

    /// A 16 MiB VM with `code` at the probe's load address and vCPU 0 about to run it in long
    /// mode at CPL 0 (the VM must outlive the vCPU's run).
    fn vcpu_running(code: &[u8]) -> (Vm, Vcpu) {
        use crate::contract::PROBE_LOAD_ADDR;
        use vm_memory::{Bytes, GuestAddress};
        let vm = Vm::new(16 << 20).unwrap();
        boot::write_tables(vm.memory()).unwrap();
        vm.memory()
            .write_slice(code, GuestAddress(PROBE_LOAD_ADDR))
            .unwrap();
        install_kick_handler().unwrap();
        let vcpu = Vcpu::new(&vm, 0).unwrap();
        vcpu.set_entry(&boot::entry_regs(0), boot::long_mode_sregs)
            .unwrap();
        (vm, vcpu)
    }

    /// End to end through KVM and the `kvm_run` view. Hardware KVM reports the string as one
    /// exit with count 3; this host's software KVM (kvm_pvm, ring 0 emulated) exits once per
    /// element, so here the test shows the bytes arrive, the synthetic one above the split.
    #[test]
    fn a_guest_rep_outsb_is_dispatched_byte_by_byte() {
        #[rustfmt::skip]
        let code: &[u8] = &[
            0x48, 0x8d, 0x35, 0x10, 0, 0, 0, // lea rsi, [rip + 16] (the string)
            0x66, 0xba, 0xf8, 0x03,          // mov dx, 0x3f8
            0xb9, 0x03, 0, 0, 0,             // mov ecx, 3
            0xf3, 0x6e,                      // rep outsb
            0x66, 0xba, 0xf9, 0x03,          // mov dx, 0x3f9
            0xee,                            // out dx, al: done
            b'h', b'i', b'!',
        ];
        let (_vm, vcpu) = vcpu_running(code);
        let control = Arc::new(RunControl::default());
        let mut io = IoBuses::default();
        let rec = Arc::new(Recorder::default());
        io.add_pio("rec", 0x3f8, 1, rec.clone()).unwrap();
        io.add_pio("done", 0x3f9, 1, Arc::new(Done(control.clone())))
            .unwrap();
        let counters = ExitCounters::new(io.names.len());
        vcpu.run(&io, &counters, &control);
        assert_eq!(
            control.wait(std::time::Duration::ZERO),
            Some(StopReason::GuestDone(0))
        );
        let bytes: Vec<u8> = rec
            .writes
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(_, d)| d.clone())
            .collect();
        assert_eq!(bytes, b"hi!");
        assert!(rec.writes.lock().unwrap().iter().all(|(_, d)| d.len() == 1));
    }

    /// `int3` at ring 0 is one of the instructions this host's emulator lacks (PLATFORM.md):
    /// the run ends with one line that names the rip and shows the bytes there. Hardware KVM
    /// executes it (and, with no IDT, shuts down): nothing to report there.
    #[test]
    fn an_instruction_kvm_cannot_emulate_is_named_by_its_bytes() {
        use crate::contract::PROBE_LOAD_ADDR;
        let code: &[u8] = &[0x90, 0xcc, 0x0f, 0x0b]; // nop; int3; ud2
        let (_vm, vcpu) = vcpu_running(code);
        let control = Arc::new(RunControl::default());
        let io = IoBuses::default();
        vcpu.run(&io, &ExitCounters::new(0), &control);
        match control.wait(std::time::Duration::ZERO) {
            Some(StopReason::VcpuFailed(line)) => {
                let at = format!("vCPU 0 at rip {:#x}: ", PROBE_LOAD_ADDR + 1);
                assert!(line.starts_with(&at), "{line}");
                assert!(line.contains("KVM cannot emulate"), "{line}");
                assert!(line.contains("(code: cc 0f 0b"), "{line}");
            }
            Some(StopReason::Shutdown) => {
                eprintln!("skipped: this host's KVM executes int3 at ring 0 (hardware KVM)")
            }
            other => panic!("unexpected end: {other:?}"),
        }
    }

    /// Where KVM does not hand over the instruction, the bytes come from guest RAM through the
    /// guest's page tables, up to 15 and never past the end of RAM.
    #[test]
    fn code_is_read_through_the_guest_page_tables() {
        use crate::contract::PROBE_LOAD_ADDR;
        let (_vm, vcpu) = vcpu_running(&[0xf0, 0x48, 0x0f, 0xc7, 0x0e]);
        let code = vcpu.code_at(PROBE_LOAD_ADDR).unwrap();
        assert_eq!(code.len(), MAX_INSTRUCTION_BYTES);
        assert_eq!(code[..5], [0xf0, 0x48, 0x0f, 0xc7, 0x0e]); // lock cmpxchg16b [rsi]
        let end = (16 << 20) - 3;
        assert_eq!(
            vcpu.code_at(end).map(|c| c.len()),
            Some(3),
            "stops at the end of RAM"
        );
        assert_eq!(vcpu.code_at(16 << 20), None, "nothing there");
    }

    #[test]
    fn shutdown_and_unexpected_exits_stop_the_run() {
        let io = IoBuses::default();
        let counters = ExitCounters::new(0);
        assert_eq!(
            handle_exit(VcpuExit::Shutdown, 0, &io, &counters),
            ExitAction::Stop(StopReason::Shutdown)
        );
        assert!(matches!(
            handle_exit(VcpuExit::FailEntry(0, 0), 0, &io, &counters),
            ExitAction::Stop(StopReason::VcpuFailed(_))
        ));
        assert_eq!(
            handle_exit(VcpuExit::Hlt, 0, &io, &counters),
            ExitAction::Resume
        );
    }
}
