//! The probe under QEMU: Debian's `qemu-system-x86` (`qemu-system-x86_64`), q35 with KVM.
//!
//! [`Qemu::run_probe`] writes the embedded probe image, its ops and an empty serial log into a
//! temporary directory, then runs
//!
//! ```text
//! qemu-system-x86_64 -machine q35,accel=kvm -cpu host,arch-capabilities=off -smp 1 -m MIB
//!     -nodefaults -display none -no-reboot
//!     -kernel probe.bin                               (its multiboot header: crates/exitless-guest/probe/entry.S)
//!     -fw_cfg name=opt/exitless/ops,file=ops.bin      (the Op array, as exitless writes it)
//!     -device isa-debug-exit,iobase=0xf4,iosize=4     (the probe's end: exit status 1 if good)
//!     -serial file:serial.txt                         (the results: `super::dump`)
//!     -device virtio-net-pci,addr=SLOT,mq=on,vectors=2Q+1,romfile=   (one per function)
//!     -netdev tap,id=n0,ifname=TAP,script=no,downscript=no,vhost=off  (with a tap: the first
//!                                                      function's backend, netdev=n0,mac=MAC)
//! ```
//!
//! With [`QemuMachine::vhost_user`] (issue 21), guest RAM is a shared memfd a backend can map
//! and function `i` is served by the vhost-user backend on socket `i` (QEMU docs, "vhost-user
//! back ends": the memory must be shared, or QEMU refuses the netdev):
//!
//! ```text
//!     -object memory-backend-memfd,id=mem,size=MIBM,share=on -numa node,memdev=mem
//!     -chardev socket,id=cI,path=SOCKET -netdev vhost-user,id=vI,chardev=cI,queues=PAIRS
//!     -device virtio-net-pci,...,netdev=vI
//! ```
//!
//! and with [`QemuMachine::iommu`], `-device intel-iommu,aw-bits=48,intremap=off` before the
//! functions, which are then modern only (`disable-legacy=on`), and from its index on behind
//! the unit (`iommu_platform=on`).
//!
//! SeaBIOS boots it (about 4–6 s on this project's hosts, most of a run), assigns the BARs and
//! turns decoding on; QEMU's own virtio-net-pci devices keep QEMU's defaults (ioeventfd on).
//! What works there: the `pci` scenario's ops (RAM and config read loops by port I/O and ECAM,
//! enumeration), MSI-X programming, Enable, masking and `msix_check` without sends, the
//! virtio-net driver with ICMP echo through a [`QemuTap`], and with [`QemuMachine::iommu`] the
//! `iommu` scenario's stream through QEMU's intel-iommu (the probe finds the unit in the DMAR).
//! Ops that need exitless's test port or built-in backends (`PORT_MSIX_SEND`, the built-in
//! request/response, the hostile burst, the IOMMU report) end with `STATUS_UNSUPPORTED`.
//!
//! [`migrate`]: the probe migrated to a file by one QEMU and resumed by a second
//! (`-qmp`, QMP `migrate` to `exec:cat > FILE`, `-incoming exec:cat FILE`).

pub mod migrate;

use std::fs;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use vmm_sys_util::tempdir::TempDir;
use zerocopy::IntoBytes;

use super::{PeerError, PeerRun, dump};
use exitless_contract::PROBE_MIN_RAM;
use exitless_contract::{MAX_OPS, Op, QEMU_DEBUG_EXIT_PORT, QEMU_OPS_FILE};
use exitless_guest::PROBE_IMAGE;

const BINARY: &str = "qemu-system-x86_64";
const PACKAGE: &str = "qemu-system-x86";

/// The last slot of q35's bus 0 free for devices: 31 holds the LPC bridge, SATA and SMBus.
const LAST_FREE_SLOT: u16 = 30;

/// QEMU's exit status when the probe wrote `DONE_OK` (0) to isa-debug-exit: `(0 << 1) | 1`.
const EXIT_DONE_OK: i32 = 1;

/// An installed QEMU.
#[derive(Clone, Debug)]
pub struct Qemu {
    binary: PathBuf,
    version: String,
}

/// The machine QEMU gives the probe: q35 with `virtio_net` virtio-net-pci functions on bus 0,
/// one per slot from `first_slot`.
#[derive(Clone, Debug)]
pub struct QemuMachine {
    /// Guest RAM in MiB: the probe's map and SeaBIOS's ACPI tables at the top of it.
    pub memory_mib: u32,
    /// virtio-net-pci functions.
    pub virtio_net: u8,
    /// Queue pairs each function's MSI-X table has vectors for: `2 × queue_pairs + 1` entries
    /// (a vector per queue and the configuration vector), as exitless's virtio-net has.
    pub queue_pairs: u16,
    /// Slot of the first function (q35 has the host bridge at 0 and the LPC bridge, SATA and
    /// SMBus controllers at 31).
    pub first_slot: u8,
    /// QEMU's VT-d unit (`-device intel-iommu`, described by a DMAR), translating the DMA of
    /// the virtio-net functions from this index on; `None`: no unit.
    pub iommu: Option<u8>,
    /// A host tap behind the first function; without one (and no `vhost_user`), no function
    /// has a backend.
    pub tap: Option<QemuTap>,
    /// vhost-user sockets: function `i` is served by the backend listening on `vhost_user[i]`
    /// (with `queue_pairs` queue pairs), guest RAM then a shared memfd. Functions past the
    /// list have no backend; a tap takes the first function before them.
    pub vhost_user: Vec<PathBuf>,
}

/// A host tap QEMU opens as a virtio-net function's backend: QEMU's own, in its main loop
/// (vhost off: this project's hosts have no /dev/vhost-net), set up by no script.
#[derive(Clone, Debug)]
pub struct QemuTap {
    /// The tap's name; it exists, and no one holds it.
    pub ifname: String,
    /// The function's MAC address.
    pub mac: [u8; 6],
}

impl Default for QemuMachine {
    /// 128 MiB, no devices; functions from slot 1 with one queue pair.
    fn default() -> Self {
        QemuMachine {
            memory_mib: 128,
            virtio_net: 0,
            queue_pairs: 1,
            first_slot: 1,
            tap: None,
            iommu: None,
            vhost_user: Vec::new(),
        }
    }
}

impl QemuMachine {
    /// The slot on bus 0 of virtio-net function `i` (`first_slot + i`, function 0;
    /// [`Qemu::run_probe`] refuses machines whose functions do not fit in slots 1 to 30).
    pub fn virtio_net_slot(&self, i: u8) -> u8 {
        self.first_slot.saturating_add(i)
    }

    /// Whether the probe fits in the RAM and the functions between the host bridge (slot 0)
    /// and q35's own devices (31).
    fn check(&self) -> Result<(), PeerError> {
        // SeaBIOS puts the ACPI tables at the top of RAM, above everything the probe uses.
        let need_mib = PROBE_MIN_RAM.div_ceil(1 << 20) + 1;
        if u64::from(self.memory_mib) < need_mib {
            return Err(PeerError::Memory {
                mib: self.memory_mib,
                need_mib,
            });
        }
        let end = u16::from(self.first_slot) + u16::from(self.virtio_net);
        if self.first_slot == 0 || end > LAST_FREE_SLOT + 1 {
            return Err(PeerError::Slots {
                first: self.first_slot,
                count: self.virtio_net,
            });
        }
        Ok(())
    }

    /// The vhost-user socket serving function `i`, if any: the list starts after a tap's
    /// function.
    fn vhost_socket(&self, i: u8) -> Option<&Path> {
        let first = u8::from(self.tap.is_some());
        let n = usize::from(i.checked_sub(first)?);
        self.vhost_user.get(n).map(PathBuf::as_path)
    }

    /// MSI-X table entries of each virtio-net function.
    pub fn msix_vectors(&self) -> u32 {
        2 * u32::from(self.queue_pairs) + 1
    }

    /// The machine's command-line arguments, before the files of a run.
    fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "-machine",
            "q35,accel=kvm",
            // `-cpu host`, less IA32_ARCH_CAPABILITIES, which the KVM of this project's hosts
            // refuses to set (QEMU aborts); the probe's code needs nothing from it.
            "-cpu",
            "host,arch-capabilities=off",
            "-smp",
            "1",
            "-nodefaults",
            "-display",
            "none",
            "-no-reboot",
        ]
        .map(String::from)
        .into();
        args.extend(["-m".into(), self.memory_mib.to_string()]);
        if !self.vhost_user.is_empty() {
            // A vhost-user backend maps guest RAM from the fds of SET_MEM_TABLE: a shared memfd
            // as the one NUMA node's memory (QEMU's documented vhost-user setup).
            args.extend([
                "-object".into(),
                format!(
                    "memory-backend-memfd,id=mem,size={}M,share=on",
                    self.memory_mib
                ),
                "-numa".into(),
                "node,memdev=mem".into(),
            ]);
        }
        args.extend([
            "-device".into(),
            format!("isa-debug-exit,iobase={QEMU_DEBUG_EXIT_PORT:#x},iosize=4"),
        ]);
        if self.iommu.is_some() {
            // Before the functions: each gets its DMA address space when it is created. A
            // 4-level table (aw-bits=48: SAGAW bit 2, VT-d §10.4.2), as exitless's unit has
            // and the probe's driver builds; no interrupt remapping, which would need
            // kernel-irqchip=split, and the probe's MSIs are not remapped.
            args.extend([
                "-device".into(),
                "intel-iommu,aw-bits=48,intremap=off".into(),
            ]);
        }
        for i in 0..self.virtio_net {
            self.add_virtio_net(i, &mut args);
        }
        args
    }

    /// Function `i`'s `-device virtio-net-pci` and the backend behind it: the host tap (the
    /// first function, where there is one), a vhost-user socket, or none (a sink).
    fn add_virtio_net(&self, i: u8, args: &mut Vec<String>) {
        // No option ROM: nothing here boots from the network, and iPXE's takes seconds.
        // With no netdev, what a function sends is dropped: the iommu stream's sink.
        let mut device = format!(
            "virtio-net-pci,addr={:#x},mq=on,vectors={},romfile=",
            self.virtio_net_slot(i),
            self.msix_vectors()
        );
        if let (0, Some(tap)) = (i, &self.tap) {
            device += &format!(
                ",netdev=n0,mac={}",
                tap.mac.map(|b| format!("{b:02x}")).join(":")
            );
            args.extend([
                "-netdev".into(),
                format!(
                    "tap,id=n0,ifname={},script=no,downscript=no,vhost=off",
                    tap.ifname
                ),
            ]);
        } else if let Some(socket) = self.vhost_socket(i) {
            device += &format!(",netdev=v{i}");
            args.extend([
                "-chardev".into(),
                format!("socket,id=c{i},path={}", socket.display()),
                "-netdev".into(),
                format!(
                    "vhost-user,id=v{i},chardev=c{i},queues={}",
                    self.queue_pairs
                ),
            ]);
        }
        if let Some(first) = self.iommu {
            // Modern only: QEMU's legacy devices lack VIRTIO_F_ACCESS_PLATFORM, with which
            // a function is behind the unit.
            device.push_str(",disable-legacy=on");
            if i >= first {
                device.push_str(",iommu_platform=on");
            }
        }
        args.extend(["-device".into(), device]);
    }
}

impl Qemu {
    /// Finds `qemu-system-x86_64` on PATH and asks it its version.
    pub fn find() -> Result<Qemu, PeerError> {
        let binary = std::env::var_os("PATH")
            .and_then(|path| {
                std::env::split_paths(&path)
                    .map(|dir| dir.join(BINARY))
                    .find(|p| p.is_file())
            })
            .ok_or(PeerError::NotFound {
                binary: BINARY,
                package: PACKAGE,
            })?;
        let out = Command::new(&binary)
            .arg("--version")
            .output()
            .map_err(|source| PeerError::Io {
                what: format!("run {} --version", binary.display()),
                source,
            })?;
        let version = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("QEMU, version unknown")
            .to_owned();
        Ok(Qemu { binary, version })
    }

    /// The first line of `qemu-system-x86_64 --version`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Boots the probe under QEMU on `machine` with `ops` and returns what the probe reported:
    /// one result per op and the last enumeration's records, parsed from the serial dump. QEMU
    /// is killed if it runs past `timeout`.
    pub fn run_probe(
        &self,
        machine: &QemuMachine,
        ops: &[Op],
        timeout: Duration,
    ) -> Result<PeerRun, PeerError> {
        if ops.len() as u64 > MAX_OPS {
            return Err(PeerError::TooManyOps(ops.len()));
        }
        machine.check()?;
        let dir = TempDir::new_with_prefix("/tmp/exitless-qemu-")
            .map_err(|e| io("create a temporary directory")(e.into()))?;
        let files = RunFiles::in_dir(dir.as_path());
        fs::write(&files.image, PROBE_IMAGE).map_err(io("write the probe image"))?;
        fs::write(&files.ops, ops.as_bytes()).map_err(io("write the ops file"))?;
        let mut cmd = self.command(machine, &files)?;
        let started = Instant::now();
        let child = Running(
            cmd.spawn()
                .map_err(io(&format!("run {}", self.binary.display())))?,
        );
        let status = wait(child, started + timeout).map_err(io("wait for QEMU"))?;
        let wall = started.elapsed();
        let serial = read_lossy(&files.serial);
        self.ended(status, serial, &files, ops.len(), wall, timeout)
    }

    /// The results of a run that ended with `status` (`None`: killed at its deadline).
    fn ended(
        &self,
        status: Option<std::process::ExitStatus>,
        serial: String,
        files: &RunFiles,
        sent: usize,
        wall: Duration,
        limit: Duration,
    ) -> Result<PeerRun, PeerError> {
        let Some(status) = status else {
            return Err(PeerError::Timeout {
                vmm: self.version.clone(),
                limit,
                serial: tail(&serial),
            });
        };
        if status.code() != Some(EXIT_DONE_OK) {
            return Err(PeerError::Failed {
                vmm: self.version.clone(),
                meaning: meaning(status),
                status,
                stderr: tail(&read_lossy(&files.stderr)),
                serial: tail(&serial),
            });
        }
        results(serial, sent, wall)
    }

    /// QEMU's command line for `machine`, booting `files.image` with `files.ops` as its ops;
    /// it dies with the thread that starts it.
    fn command(&self, machine: &QemuMachine, files: &RunFiles) -> Result<Command, PeerError> {
        let mut cmd = Command::new(&self.binary);
        cmd.args(machine.args())
            .arg("-kernel")
            .arg(&files.image)
            .arg("-fw_cfg")
            .arg(format!("name={QEMU_OPS_FILE},file={}", files.ops.display()))
            .arg("-serial")
            .arg(format!("file:{}", files.serial.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&files.stderr).map_err(io("create QEMU's stderr file"))?);
        // SAFETY: the closure runs in the child between fork and exec and only makes prctl,
        // which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                // QEMU dies with the thread that started it, even if exitless is killed.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        Ok(cmd)
    }
}

/// The files of one run, in its temporary directory.
struct RunFiles {
    /// The probe image QEMU boots.
    image: PathBuf,
    /// The ops, for the fw_cfg file.
    ops: PathBuf,
    /// What the serial port carries.
    serial: PathBuf,
    /// What QEMU prints on stderr.
    stderr: PathBuf,
    /// QEMU's trace log, where a run asks for one (`migrate`'s marker).
    trace: PathBuf,
}

impl RunFiles {
    fn in_dir(dir: &Path) -> RunFiles {
        RunFiles {
            image: dir.join("probe.bin"),
            ops: dir.join("ops.bin"),
            serial: dir.join("serial.txt"),
            stderr: dir.join("stderr.txt"),
            trace: dir.join("trace.txt"),
        }
    }
}

/// The error of an I/O step of a run, saying `what` it was doing.
fn io(what: &str) -> impl FnOnce(std::io::Error) -> PeerError {
    let what = what.to_owned();
    move |source| PeerError::Io { what, source }
}

/// The results of a good run, from its serial output: one per op sent (`sent` of them).
fn results(serial: String, sent: usize, wall: Duration) -> Result<PeerRun, PeerError> {
    let dump = dump::parse(&serial)?;
    if dump.results.len() != sent {
        return Err(PeerError::ResultCount {
            got: dump.results.len(),
            sent,
        });
    }
    Ok(PeerRun {
        results: dump.results,
        enum_records: dump.enum_records,
        tsc_khz: u32::try_from(dump.tsc_khz).ok().filter(|&k| k != 0),
        wall,
        serial,
    })
}

/// A QEMU process that is killed and reaped when dropped, on every path out of a run (an
/// error while waiting included), so it never outlives the run or writes into its removed
/// directory.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// Waits for `child` until `deadline`: its status, or `None` once it was killed for running
/// past it.
fn wait(mut child: Running, deadline: Instant) -> std::io::Result<Option<ExitStatus>> {
    loop {
        if let Some(status) = child.0.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None); // dropping `child` kills and reaps it
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// What QEMU's exit status says about the probe: isa-debug-exit makes a write of `v` exit
/// with `(v << 1) | 1` (QEMU hw/misc/debugexit.c), the low byte of which the status keeps.
fn meaning(status: ExitStatus) -> String {
    match status.code() {
        Some(0) => "QEMU stopped without the probe's isa-debug-exit write: a triple fault \
                    (-no-reboot) or QEMU's own error"
            .into(),
        Some(c) if c & 1 == 1 => format!(
            "the probe ended with status {:#x} in the low 7 bits, not DONE_OK: \
             DONE_BAD_BOOT_INFO is 1 (the serial output says what it missed), CPU exception \
             n is DONE_EXCEPTION + n",
            c >> 1
        ),
        Some(c) => format!("QEMU's own failure, status {c}"),
        None => "killed by a signal".into(),
    }
}

/// Most of a file QEMU wrote that is read: a whole dump of `MAX_OPS` results and
/// `MAX_ENUM_RECORDS` records is a few hundred KiB; a guest printing without end is cut here.
const READ_LIMIT: u64 = 4 << 20;

/// A file QEMU wrote, as text, up to [`READ_LIMIT`] bytes; empty if it wrote none.
fn read_lossy(path: &Path) -> String {
    let mut bytes = Vec::new();
    let _ = fs::File::open(path).and_then(|f| f.take(READ_LIMIT).read_to_end(&mut bytes));
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The last lines of what QEMU printed, for an error: enough to see where it stopped.
fn tail(text: &str) -> String {
    const KEEP: usize = 2048;
    match text.char_indices().rev().nth(KEEP) {
        Some((cut, _)) => format!("[… {cut} bytes before]{}", &text[cut..]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_function_gets_its_slot_and_the_vectors_of_its_queue_pairs() {
        let machine = QemuMachine {
            virtio_net: 2,
            queue_pairs: 32,
            first_slot: 4,
            ..QemuMachine::default()
        };
        let args = machine.args().join(" ");
        assert!(
            args.contains(
                "-device virtio-net-pci,addr=0x4,mq=on,vectors=65,romfile= \
                 -device virtio-net-pci,addr=0x5,mq=on,vectors=65,romfile="
            ),
            "{args}"
        );
        assert!(args.contains("-device isa-debug-exit,iobase=0xf4,iosize=4"));
        assert_eq!(machine.virtio_net_slot(1), 5);
    }

    #[test]
    fn a_tap_backs_the_first_function_alone_with_its_mac_and_no_vhost_or_scripts() {
        let machine = QemuMachine {
            virtio_net: 2,
            tap: Some(QemuTap {
                ifname: "t0".into(),
                mac: [0x02, 0, 0, 0, 0xab, 0x01],
            }),
            ..QemuMachine::default()
        };
        let args = machine.args().join(" ");
        assert!(
            args.contains(
                "-netdev tap,id=n0,ifname=t0,script=no,downscript=no,vhost=off \
                 -device virtio-net-pci,addr=0x1,mq=on,vectors=3,romfile=,netdev=n0,\
                 mac=02:00:00:00:ab:01 -device virtio-net-pci,addr=0x2,mq=on,vectors=3,romfile="
            ),
            "{args}"
        );
        assert_eq!(args.matches("-netdev").count(), 1, "{args}");
    }

    #[test]
    fn the_iommu_comes_before_the_functions_and_translates_those_from_its_index() {
        let machine = QemuMachine {
            virtio_net: 2,
            iommu: Some(1),
            ..QemuMachine::default()
        };
        let args = machine.args().join(" ");
        assert!(
            args.contains(
                "-device intel-iommu,aw-bits=48,intremap=off \
                 -device virtio-net-pci,addr=0x1,mq=on,vectors=3,romfile=,disable-legacy=on \
                 -device virtio-net-pci,addr=0x2,mq=on,vectors=3,romfile=,disable-legacy=on,\
                 iommu_platform=on"
            ),
            "{args}"
        );
        let plain = QemuMachine {
            virtio_net: 1,
            ..QemuMachine::default()
        };
        let args = plain.args().join(" ");
        assert!(
            !args.contains("intel-iommu") && !args.contains("disable-legacy"),
            "{args}"
        );
    }

    #[test]
    fn vhost_user_functions_get_their_sockets_after_the_tap_and_ram_is_a_shared_memfd() {
        let machine = QemuMachine {
            virtio_net: 3,
            tap: Some(QemuTap {
                ifname: "t0".into(),
                mac: [0x02, 0, 0, 0, 0xab, 0x01],
            }),
            vhost_user: vec!["/s/a.sock".into()],
            ..QemuMachine::default()
        };
        let args = machine.args().join(" ");
        assert!(
            args.contains(
                "-m 128 -object memory-backend-memfd,id=mem,size=128M,share=on \
                 -numa node,memdev=mem"
            ),
            "{args}"
        );
        assert!(
            args.contains(
                "-chardev socket,id=c1,path=/s/a.sock -netdev vhost-user,id=v1,chardev=c1,\
                 queues=1 -device virtio-net-pci,addr=0x2,mq=on,vectors=3,romfile=,netdev=v1 \
                 -device virtio-net-pci,addr=0x3,mq=on,vectors=3,romfile="
            ),
            "{args}"
        );
        assert_eq!(args.matches("-chardev").count(), 1, "{args}");
        // No vhost-user function: private RAM, as before.
        let plain = QemuMachine::default().args().join(" ");
        assert!(!plain.contains("memory-backend"), "{plain}");
    }

    #[test]
    fn functions_off_the_free_slots_are_refused() {
        let fits = |first_slot, virtio_net| {
            QemuMachine {
                virtio_net,
                first_slot,
                ..QemuMachine::default()
            }
            .check()
            .map_err(|e| e.to_string())
        };
        assert_eq!(fits(1, 30), Ok(()));
        assert_eq!(
            fits(2, 30),
            Err("30 functions from slot 2 do not fit on bus 0: q35 has slots 1 to 30 free".into())
        );
        assert!(fits(0, 1).is_err(), "slot 0 is the host bridge's");
        let small = QemuMachine {
            memory_mib: 15,
            ..QemuMachine::default()
        };
        assert_eq!(
            small.check().unwrap_err().to_string(),
            "15 MiB of RAM is too little: the probe and the firmware's tables need 16 MiB"
        );
    }

    #[test]
    fn the_exit_status_says_how_the_probe_ended() {
        use std::os::unix::process::ExitStatusExt;
        let status = |code: i32| ExitStatus::from_raw(code << 8);
        assert!(meaning(status(0)).contains("triple fault"));
        // DONE_BAD_BOOT_INFO (1) written to isa-debug-exit: (1 << 1) | 1.
        assert!(
            meaning(status(3)).starts_with("the probe ended with status 0x1 in the low 7 bits"),
            "{}",
            meaning(status(3))
        );
        assert!(meaning(ExitStatus::from_raw(9)).contains("signal"));
    }
}
