//! The report of a forbidden system call. Filters trap (`SECCOMP_RET_TRAP`): the kernel sends
//! the calling thread SIGSYS, with the call's number in `si_syscall` (seccomp(2)), and the
//! handler writes one line to stderr naming the thread, its kind and the call, then ends the
//! process with [`EXIT_VIOLATION`].
//!
//! A signal handler may only do what is async-signal-safe (signal-safety(7)). The line is
//! formatted on the stack with `core::fmt`, which neither allocates nor locks; the thread's name
//! and kind come from thread-locals set when it was confined; the process ends with `write` and
//! `_exit`, which every filter allows. `_exit` and not `exit`: atexit handlers and stdio flushing
//! take locks the interrupted thread may hold, and make calls its filter may forbid. Not
//! `abort`: the report's own exit status says what happened, a core dump would not.

use std::cell::Cell;
use std::fmt::Write;

use vmm_sys_util::signal::register_signal_handler;

use super::ThreadKind;

/// The exit status of a process ended by a forbidden system call: 128 + SIGSYS, the status a
/// shell shows for a process that SIGSYS killed.
pub const EXIT_VIOLATION: i32 = 128 + libc::SIGSYS;

/// `si_code` of a SIGSYS that seccomp raised (`include/uapi/asm-generic/siginfo.h`).
const SYS_SECCOMP: libc::c_int = 1;

/// Bytes of a thread's name kept: Linux keeps no more (`TASK_COMM_LEN` is 16 with the NUL).
const NAME_LEN: usize = 15;

thread_local! {
    // `const` initialisers and contents without destructors make these plain TLS slots:
    // reading one neither allocates nor takes a lock, so the handler may.
    static KIND: Cell<Option<ThreadKind>> = const { Cell::new(None) };
    static NAME: Cell<([u8; NAME_LEN], usize)> = const { Cell::new(([0; NAME_LEN], 0)) };
}

/// Record who the calling thread is, for the report.
pub(super) fn identify(kind: ThreadKind) {
    let current = std::thread::current();
    let name = current.name().unwrap_or_default();
    let len = (0..=name.len().min(NAME_LEN))
        .rev()
        .find(|&i| name.is_char_boundary(i))
        .unwrap_or(0);
    let mut buf = [0; NAME_LEN];
    buf[..len].copy_from_slice(&name.as_bytes()[..len]);
    NAME.set((buf, len));
    KIND.set(Some(kind));
}

/// Install the handler, for the whole process.
pub(super) fn install() -> Result<(), vmm_sys_util::errno::Error> {
    register_signal_handler(libc::SIGSYS, on_sigsys)
}

/// A line built on the stack; what does not fit is cut.
struct Line {
    buf: [u8; 320],
    len: usize,
}

impl Write for Line {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// The report of system call `nr`, first arguments `args`, made by the thread called `name`,
/// of `kind` (`None`: a thread that did not confine itself, under a filter it inherited).
fn report(name: &str, kind: Option<ThreadKind>, nr: i32, args: [u64; 3]) -> Line {
    let mut line = Line {
        buf: [0; 320],
        len: 0,
    };
    let kind = kind.map_or("inherited filter", ThreadKind::name);
    let [a0, a1, a2] = args;
    let _ = writeln!(
        line,
        "exitless: seccomp: thread \"{name}\" ({kind}) made system call {nr} (arguments {a0:#x}, \
         {a1:#x}, {a2:#x}), which its filter forbids; exiting with status {EXIT_VIOLATION} \
         (--no-seccomp runs without filters)"
    );
    line
}

extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel hands an SA_SIGINFO handler a valid siginfo_t and ucontext_t; for a
    // SIGSYS from seccomp it fills the `_sigsys` member and the registers are those of the
    // call (x86-64: arguments in rdi, rsi, rdx).
    let line = unsafe {
        if (*info).si_code == SYS_SECCOMP {
            let (buf, len) = NAME.get();
            let name = std::str::from_utf8(&buf[..len]).unwrap_or_default();
            let regs = &(*context.cast::<libc::ucontext_t>()).uc_mcontext.gregs;
            let arg = |r: libc::c_int| regs[r as usize] as u64;
            report(
                name,
                KIND.get(),
                (*info).si_syscall(),
                [arg(libc::REG_RDI), arg(libc::REG_RSI), arg(libc::REG_RDX)],
            )
        } else {
            let mut line = Line {
                buf: [0; 320],
                len: 0,
            };
            let _ = writeln!(
                line,
                "exitless: SIGSYS sent by another process; exiting with status {EXIT_VIOLATION}"
            );
            line
        }
    };
    // SAFETY: write(2) and _exit(2) are async-signal-safe, and every filter allows them; the
    // buffer is valid for `len` bytes.
    unsafe {
        libc::write(libc::STDERR_FILENO, line.buf.as_ptr().cast(), line.len);
        libc::_exit(EXIT_VIOLATION);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(line: &Line) -> &str {
        std::str::from_utf8(&line.buf[..line.len]).unwrap()
    }

    #[test]
    fn the_report_names_the_thread_its_kind_and_the_call() {
        let line = report("vcpu", Some(ThreadKind::Vcpu), 41, [2, 1, 0]);
        assert_eq!(
            text(&line),
            "exitless: seccomp: thread \"vcpu\" (vcpu) made system call 41 (arguments 0x2, \
             0x1, 0x0), which its filter forbids; exiting with status 159 (--no-seccomp runs \
             without filters)\n"
        );
        let long = report(&"x".repeat(NAME_LEN), None, 16, [u64::MAX; 3]);
        assert!(text(&long).ends_with("filters)\n"), "fits: {}", text(&long));
    }

    #[test]
    fn a_long_name_is_kept_as_linux_keeps_it() {
        std::thread::Builder::new()
            .name("virtio-mmio@0xd0000000".into())
            .spawn(|| {
                identify(ThreadKind::Device);
                let (buf, len) = NAME.get();
                assert_eq!(&buf[..len], b"virtio-mmio@0xd");
                assert_eq!(KIND.get(), Some(ThreadKind::Device));
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
