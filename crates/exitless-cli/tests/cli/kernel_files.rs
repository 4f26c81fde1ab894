//! `exitless run` with kernel and initrd files that must not be read whole: a 16 GiB sparse
//! file and `/dev/zero` (as `--kernel`, and as `--initrd` beside the small multiboot test
//! kernel) end at once with one line and status 2, under an address-space limit that reading
//! them whole would exceed; and `--initrd` with the multiboot kernel, which takes none, is
//! refused.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `exitless run`'s status for its own errors.
const ERROR: i32 = 2;
/// The address space the run may have: the VMM and its threads, room for a 64 MiB guest,
/// far less than either file read whole.
const ADDRESS_SPACE: libc::rlim_t = 1 << 30;

/// The multiboot test kernel, beside the binary.
fn test_kernel() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_exitless")).with_file_name("testkernel.elf")
}

/// `exitless run --memory 64 ARGS` under [`ADDRESS_SPACE`]: its status and stderr.
fn run_limited(args: &[&str]) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_exitless"));
    cmd.args(["run", "--memory", "64", "--timeout", "30"])
        .args(args)
        .stdin(Stdio::null());
    // SAFETY: setrlimit is async-signal-safe (signal-safety(7)) and touches only the child
    // between fork and exec; the rlimit is a local it reads.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: ADDRESS_SPACE,
                rlim_max: ADDRESS_SPACE,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("exitless starts");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The run ended with status 2 and one error line containing `says`.
fn assert_refused(args: &[&str], says: &str) {
    let (status, stderr) = run_limited(args);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        status == Some(ERROR)
            && lines.len() == 1
            && lines[0].starts_with("exitless: error: ")
            && lines[0].contains(says),
        "{args:?}: status {status:?}, stderr {stderr:?}"
    );
}

/// A 16 GiB file of holes, removed on drop.
struct Sparse(PathBuf);

impl Sparse {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("exitless-{name}-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(16 << 30).unwrap();
        Sparse(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Sparse {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_kernel_larger_than_ram_is_refused_by_its_size() {
    let huge = Sparse::new("huge-kernel");
    assert_refused(
        &["--kernel", huge.path()],
        "is 17179869184 bytes, more than the machine's 64 MiB of RAM can hold (--memory)",
    );
}

#[test]
fn an_initrd_larger_than_ram_is_refused_by_its_size() {
    let huge = Sparse::new("huge-initrd");
    let kernel = test_kernel();
    assert_refused(
        &[
            "--kernel",
            kernel.to_str().unwrap(),
            "--initrd",
            huge.path(),
        ],
        "is 17179869184 bytes, more than the machine's 64 MiB of RAM can hold (--memory)",
    );
}

#[test]
fn dev_zero_is_refused_as_kernel_and_as_initrd() {
    assert_refused(
        &["--kernel", "/dev/zero"],
        "--kernel /dev/zero: it is a character device, not a regular file",
    );
    let kernel = test_kernel();
    assert_refused(
        &[
            "--kernel",
            kernel.to_str().unwrap(),
            "--initrd",
            "/dev/zero",
        ],
        "--initrd /dev/zero: it is a character device, not a regular file",
    );
}

#[test]
fn a_directory_and_a_fifo_are_refused_without_blocking() {
    let dir = std::env::temp_dir();
    assert_refused(&["--kernel", dir.to_str().unwrap()], "it is a directory");
    let fifo = dir.join(format!("exitless-fifo-{}", std::process::id()));
    let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path that lives across the call.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    // Opening a FIFO for reading blocks until a writer comes, unless O_NONBLOCK (fifo(7)).
    assert_refused(&["--kernel", fifo.to_str().unwrap()], "it is a FIFO");
    std::fs::remove_file(&fifo).unwrap();
}

#[test]
fn an_initrd_for_the_multiboot_kernel_is_refused() {
    let kernel = test_kernel();
    let initrd = test_kernel();
    assert_refused(
        &[
            "--kernel",
            kernel.to_str().unwrap(),
            "--initrd",
            initrd.to_str().unwrap(),
        ],
        "a multiboot kernel is given no initrd",
    );
}
