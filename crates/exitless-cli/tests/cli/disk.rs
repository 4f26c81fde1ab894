//! `exitless run --disk` as an operator meets it (the binary, seccomp on): an image is locked
//! as QEMU locks its own, so that a second exitless or a QEMU never writes it beside a first;
//! one image is never two disks; what is not a file or a block device is refused without
//! blocking; a block device is a disk of its size; a path may hold any bytes and commas; an
//! option given twice is refused. QEMU's side is checked where `qemu-system-x86_64` and
//! `qemu-storage-daemon` are installed, and the loop device where `losetup` works.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// `exitless run`'s status for its own errors.
const ERROR: i32 = 2;
/// The test kernel's `exit=debug` status when every check passed: (0x10 << 1) | 1.
const PASSED: i32 = 0x21;
/// `exitless run`'s status when the guest outlives `--timeout`: it got as far as running.
const TIMED_OUT: i32 = 124;
/// Longer than any run here takes; a run that outlives it hangs, and fails the test.
const LIMIT: Duration = Duration::from_secs(60);

/// A kernel image beside the binary.
fn kernel(name: &str) -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_exitless")).with_file_name(name)
}

/// A directory of this test's own, removed with what it holds when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("exitless-disk-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        Scratch(dir)
    }

    /// An image of 16 KiB (32 sectors) of zeros, named `name` (any bytes).
    fn image(&self, name: impl AsRef<OsStr>) -> PathBuf {
        let path = self.0.join(name.as_ref());
        std::fs::write(&path, vec![0u8; 16 << 10]).unwrap();
        path
    }

    /// A multiboot kernel (a flat image loaded by its header's address fields) that prints
    /// "ready" on COM1 and halts for good: a guest that runs until it is killed.
    fn waiting_kernel(&self) -> PathBuf {
        const MAGIC: u32 = 0x1bad_b002;
        const FLAGS: u32 = 1 << 16; // the address fields are valid
        const BASE: u32 = 0x10_0000;
        let mut image = Vec::new();
        for word in [
            MAGIC,
            FLAGS,
            0u32.wrapping_sub(MAGIC + FLAGS),
            BASE,      // header_addr
            BASE,      // load_addr
            0,         // load_end_addr: the whole file
            0,         // bss_end_addr: none
            BASE + 32, // entry_addr: after this header
        ] {
            image.extend_from_slice(&word.to_le_bytes());
        }
        image.extend_from_slice(&[0x66, 0xba, 0xf8, 0x03]); // mov dx, 0x3f8
        for &byte in b"ready\n" {
            image.extend_from_slice(&[0xb0, byte, 0xee]); // mov al, byte; out dx, al
        }
        image.extend_from_slice(&[0xfa, 0xf4, 0xeb, 0xfd]); // cli; hlt; jmp to the hlt
        let path = self.0.join("waiting.bin");
        std::fs::write(&path, image).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `cmd` run to its end with `input` on stdin; killed, and the test failed, if it outlives
/// [`LIMIT`] (an open that blocks must fail the test, not hang it).
fn finish(cmd: &mut Command, input: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the program starts");
    let _ = child.stdin.take().unwrap().write_all(input);
    let deadline = Instant::now() + LIMIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{cmd:?} still ran after {LIMIT:?}");
        }
        thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `exitless run ARGS`, to its end.
fn exitless(args: &[&OsStr]) -> Output {
    finish(
        Command::new(env!("CARGO_BIN_EXE_exitless"))
            .arg("run")
            .args(args),
        b"",
    )
}

/// The waiting kernel on `disk` (a `--disk` value) for at most a second: `TIMED_OUT` if its
/// disk was taken and the guest ran, `ERROR` and one line if not.
fn briefly(kernel: &Path, disk: impl AsRef<OsStr>) -> Output {
    let args = [
        "--kernel".as_ref(),
        kernel.as_os_str(),
        "--timeout".as_ref(),
        "1".as_ref(),
    ];
    exitless(&[&args[..], &["--disk".as_ref(), disk.as_ref()]].concat())
}

/// `value` (a path, options) as one argument.
fn arg(path: &Path, options: &str) -> std::ffi::OsString {
    let mut arg = path.as_os_str().to_owned();
    arg.push(options);
    arg
}

/// The line a refused run printed, once its status (2) and its being one line are checked.
fn refusal(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(ERROR),
        "refused with status 2; stderr:\n{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    stderr.trim_end().to_owned()
}

/// The run got as far as its guest, which outlived `--timeout`.
fn assert_ran(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(TIMED_OUT),
        "the guest ran; stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether another process holds the lock that says it uses `image` for writing: byte 101, QEMU's
/// RAW_LOCK_PERM_BASE (100) + the bit of BLK_PERM_WRITE (1). QEMU takes its locks in steps (the
/// read permission when it opens the image, write only once the device is realized), so a
/// lock on any byte is not yet the writer's. F_OFD_GETLK reports another open file's lock, and
/// this one holds none.
fn write_locked(image: &Path) -> bool {
    let file = File::open(image).unwrap();
    let mut lock = libc::flock {
        l_type: libc::F_WRLCK.try_into().unwrap(),
        l_whence: libc::SEEK_SET.try_into().unwrap(),
        l_start: 101,
        l_len: 1,
        l_pid: 0,
    };
    // SAFETY: F_OFD_GETLK reads and rewrites the flock passed, which outlives the call.
    let ret = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut lock) };
    assert_eq!(ret, 0, "{}", std::io::Error::last_os_error());
    i32::from(lock.l_type) != libc::F_UNLCK
}

/// A VMM that holds an image while the test tries it from another process; killed when
/// dropped.
struct Holder(Child);

impl Holder {
    /// `exitless run` of the waiting kernel on `disk`, once its guest runs (its disks are
    /// open by then).
    fn exitless(kernel: &Path, disk: impl AsRef<OsStr>) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_exitless"))
            .args(["run".as_ref(), "--kernel".as_ref(), kernel.as_os_str()])
            .args(["--timeout", "120", "--disk"])
            .arg(disk)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut console = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        // A run that ends first (refused, say) closes its stdout: an empty line.
        while console.read_line(&mut line).unwrap() > 0 && line != "ready\n" {
            line.clear();
        }
        let holder = Holder(child);
        assert_eq!(line, "ready\n", "the first run reached its guest");
        holder
    }

    /// `program ARGS`, once it holds `image` for writing.
    fn qemu(program: &str, args: &[impl AsRef<OsStr>], image: &Path) -> Self {
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut holder = Holder(child);
        let deadline = Instant::now() + LIMIT;
        while !write_locked(image) {
            assert!(
                holder.0.try_wait().unwrap().is_none() && Instant::now() < deadline,
                "{program} took no write lock on {}",
                image.display()
            );
            thread::sleep(Duration::from_millis(20));
        }
        holder
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether `program` is installed; if not, say why the test that needs it does nothing.
fn installed(program: &str, test: &str) -> bool {
    let found = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        println!("{test}: skipped, {program} is not installed");
    }
    found
}

#[test]
fn a_second_run_cannot_take_an_image_a_first_is_writing() {
    let dir = Scratch::new("second");
    let (kernel, image) = (dir.waiting_kernel(), dir.image("shared.img"));
    let _first = Holder::exitless(&kernel, &image);
    for disk in [arg(&image, ""), arg(&image, ",ro")] {
        let line = refusal(&briefly(&kernel, &disk));
        assert_eq!(
            line,
            format!(
                "exitless: error: the disk {} is in use by another process (its \"write\" \
                 lock): stop that process first, or add ,locking=off if the two may share the \
                 image",
                image.display()
            )
        );
    }
    // The operator who knows better.
    assert_ran(&briefly(&kernel, arg(&image, ",locking=off")));
}

#[test]
fn read_only_runs_share_an_image_and_keep_writers_out() {
    let dir = Scratch::new("readers");
    let (kernel, image) = (dir.waiting_kernel(), dir.image("shared.img"));
    let _first = Holder::exitless(&kernel, arg(&image, ",ro"));
    assert_ran(&briefly(&kernel, arg(&image, ",ro")));
    let line = refusal(&briefly(&kernel, &image));
    assert!(line.contains("in use by another process"), "{line}");
}

#[test]
fn an_image_qemu_holds_is_refused() {
    let test = "an_image_qemu_holds_is_refused";
    let dir = Scratch::new("qemu-holds");
    let (kernel, image) = (dir.waiting_kernel(), dir.image("qemu.img"));
    if installed("qemu-system-x86_64", test) {
        let _qemu = Holder::qemu("qemu-system-x86_64", &qemu_args(&image, ""), &image);
        for disk in [arg(&image, ""), arg(&image, ",ro")] {
            let line = refusal(&briefly(&kernel, &disk));
            assert!(line.contains("in use by another process"), "{line}");
        }
    }
    if installed("qemu-storage-daemon", test) {
        let socket = dir.0.join("nbd.sock");
        let blockdev = format!("driver=file,node-name=n,filename={}", image.display());
        let server = format!("addr.type=unix,addr.path={}", socket.display());
        let _daemon = Holder::qemu(
            "qemu-storage-daemon",
            &[
                "--blockdev",
                &blockdev,
                "--nbd-server",
                &server,
                "--export",
                "type=nbd,id=e,node-name=n,writable=on",
            ],
            &image,
        );
        let line = refusal(&briefly(&kernel, &image));
        assert!(line.contains("in use by another process"), "{line}");
    }
}

/// `qemu-system-x86_64`'s arguments for a stopped q35 machine (`-S`: it takes the image's
/// locks, and runs nothing) with a virtio-blk disk on `image`, the drive's `options` added,
/// and its monitor on stdio. A drive with no device takes only the reading lock.
fn qemu_args(image: &Path, options: &str) -> Vec<String> {
    let drive = format!("file={},format=raw,if=none,id=d{options}", image.display());
    let args = "-M q35 -accel tcg -S -nodefaults -display none -monitor stdio -drive";
    let mut args: Vec<String> = args.split(' ').map(String::from).collect();
    args.extend([drive, "-device".into(), "virtio-blk-pci,drive=d".into()]);
    args
}

/// `qemu-system-x86_64` opening `image` with `options`, then quitting from its monitor: its
/// status and stderr.
fn qemu_opens(image: &Path, options: &str) -> (Option<i32>, String) {
    let mut qemu = Command::new("qemu-system-x86_64");
    let out = finish(qemu.args(qemu_args(image, options)), b"quit\n");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn qemu_cannot_write_an_image_exitless_holds() {
    if !installed(
        "qemu-system-x86_64",
        "qemu_cannot_write_an_image_exitless_holds",
    ) {
        return;
    }
    let dir = Scratch::new("exitless-holds");
    let (kernel, image) = (dir.waiting_kernel(), dir.image("exitless.img"));
    for disk in [arg(&image, ""), arg(&image, ",ro")] {
        let _exitless = Holder::exitless(&kernel, &disk);
        let (status, stderr) = qemu_opens(&image, "");
        assert_eq!(status, Some(1), "QEMU refused it: {stderr}");
        assert!(stderr.contains("Failed to get \"write\" lock"), "{stderr}");
    }
    // A reader beside a reader, as between two QEMUs.
    let _exitless = Holder::exitless(&kernel, arg(&image, ",ro"));
    let (status, stderr) = qemu_opens(&image, ",readonly=on");
    assert_eq!(status, Some(0), "QEMU read it: {stderr}");
}

#[test]
fn one_image_is_never_two_disks() {
    let dir = Scratch::new("twice");
    let (kernel, image) = (dir.waiting_kernel(), dir.image("one.img"));
    let link = dir.0.join("link.img");
    std::fs::hard_link(&image, &link).unwrap();
    let roundabout = dir
        .0
        .join("..")
        .join(dir.0.file_name().unwrap())
        .join("one.img");
    for (second, options) in [(&image, ",ro"), (&link, ""), (&roundabout, ",locking=off")] {
        let first = arg(&image, ",locking=off");
        let out = exitless(&[
            "--kernel".as_ref(),
            kernel.as_os_str(),
            "--disk".as_ref(),
            &first,
            "--disk".as_ref(),
            &arg(second, options),
        ]);
        assert_eq!(
            refusal(&out),
            format!(
                "exitless: error: the disk {} is the same image as the disk {}: each disk \
                 needs an image of its own",
                second.display(),
                image.display()
            )
        );
    }
}

#[test]
fn what_is_not_a_file_or_a_block_device_is_refused_without_blocking() {
    let dir = Scratch::new("kinds");
    let kernel = dir.waiting_kernel();
    let fifo = dir.0.join("fifo");
    let c_fifo = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path, which outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
    let socket = dir.0.join("socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let cases = [
        (fifo.as_path(), "a FIFO"),
        (dir.0.as_path(), "a directory"),
        (Path::new("/dev/null"), "a character device"),
        (Path::new("/dev/zero"), "a character device"),
        (socket.as_path(), "a socket"),
    ];
    for (path, what) in cases {
        for options in ["", ",ro"] {
            let line = refusal(&briefly(&kernel, arg(path, options)));
            assert_eq!(
                line,
                format!(
                    "exitless: error: the disk {} is {what}, not a disk image: give a regular \
                     file or a block device",
                    path.display()
                )
            );
        }
    }
}

/// The test kernel drives `disk` (write, flush, read back, ID, a read past the end): the
/// run's output, once every check passed.
fn drives(disk: &OsStr) -> String {
    let elf = kernel("testkernel.elf");
    let out = exitless(&[
        "--kernel".as_ref(),
        elf.as_os_str(),
        "--cmdline".as_ref(),
        "disk=1".as_ref(),
        "--disk".as_ref(),
        disk,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(PASSED),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("FAIL "), "{stdout}");
    stdout
}

/// A loop device on an image, detached when dropped.
struct LoopDevice(String);

impl LoopDevice {
    /// `image` on the first free loop device, or why there is none.
    fn attach(image: &Path) -> Result<Self, String> {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(image)
            .output()
            .map_err(|e| format!("no losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(LoopDevice(
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        ))
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// The guest wrote sector 1 of `image`.
fn assert_written(image: &Path) {
    let written = std::fs::read(image).unwrap();
    assert!(
        written[512..1024].iter().any(|&b| b != 0),
        "the guest's sector reached the image"
    );
}

#[test]
fn a_block_device_is_a_disk_of_its_size() {
    let dir = Scratch::new("loop");
    let image = dir.image("loop.img");
    let device = match LoopDevice::attach(&image) {
        Ok(device) => device,
        Err(why) => {
            println!("a_block_device_is_a_disk_of_its_size: skipped, {why}");
            return;
        }
    };
    let stdout = drives(device.0.as_ref());
    assert!(
        stdout.contains("PASS disk: FEATURES_OK, 32 sectors"),
        "{stdout}"
    );
    drop(device);
    assert_written(&image);
}

#[test]
fn a_disk_path_may_hold_any_bytes_and_commas() {
    let dir = Scratch::new("names");
    let name = OsStr::from_bytes(b"a,b-\xff.img");
    let image = dir.image(name);
    // The comma written twice, as QEMU's options write one.
    let escaped = OsStr::from_bytes(&image.as_os_str().as_bytes().iter().fold(
        Vec::new(),
        |mut v, &b| {
            v.push(b);
            if b == b',' {
                v.push(b',');
            }
            v
        },
    ))
    .to_owned();
    drives(&escaped);
    assert_written(&image);
}

#[test]
fn an_option_given_twice_is_refused() {
    let dir = Scratch::new("options");
    let (kernel, image) = (dir.waiting_kernel(), dir.image("one.img"));
    for (options, name) in [
        (",transport=pci,transport=mmio", "transport"),
        (",ro,ro", "ro"),
        (",locking=off,locking=on", "locking"),
    ] {
        let line = refusal(&briefly(&kernel, arg(&image, options)));
        assert!(
            line.ends_with(&format!(
                "`{name}` given twice: give each option once (see --help)"
            )),
            "{line}"
        );
    }
    for net in [
        "none,queues=2,queues=3",
        "none,mac=52:54:00:00:00:01,mac=52:54:00:00:00:02",
    ] {
        let out = exitless(&[
            "--kernel".as_ref(),
            kernel.as_os_str(),
            "--net".as_ref(),
            net.as_ref(),
        ]);
        let line = refusal(&out);
        assert!(line.contains("given twice"), "{line}");
    }
}
