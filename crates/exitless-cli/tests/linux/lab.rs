//! The lab: where a Linux guest can reach userspace. A job (a shell script) runs on a KVM that
//! runs guest ring 0 on the CPU's virtualization extensions, and its output and status come back.
//!
//! - Where this host's `/dev/kvm` is hardware KVM, the job runs here, directly.
//! - Elsewhere (this project's hosts: a software KVM, docs/host-kvm.md) it runs in an outer VM:
//!   QEMU's TCG emulating an AMD CPU with SVM and nested paging, booting Debian's generic kernel,
//!   whose `kvm-amd` gives the job a `/dev/kvm` of that kind. The outer VM sees this host's root
//!   read-only over 9p, under a tmpfs overlay, so every tool and build here is there too at the
//!   same path; the job's own folder is a second, writable 9p share mounted at its own path, so
//!   what the job writes there (its output, disk images a guest wrote) is here when it ends.
//!
//! The outer VM is not steady (docs/linux-lab.md): its kernel sometimes panics in a vCPU thread.
//! A run whose outer VM died without the job's status is told apart from a job that failed: it
//! is said as such and retried, and only a job's own status is ever reported as the job's.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::debian::{self, Kernel};
use crate::common::hardware_kvm;
use crate::common::initramfs::Initramfs;

/// The kernel metapackage of both the outer VM and the guests: Debian's generic kernel (the
/// cloud flavour has no KVM). `EXITLESS_LAB_KERNEL` gives the outer VM another
/// (`linux-image-6.12-amd64`: the data-path issue's figures are stated only where both outer
/// kernels agree).
pub const KERNEL_PACKAGE: &str = "linux-image-amd64";

/// How many outer VMs a job may use up before the lab gives up on it. Five: about one outer VM
/// in six dies (docs/linux-lab.md, "Steadiness"), and one job (`--iommu`) lost 4 of its 7.
const ATTEMPTS: u32 = 5;

/// Time the outer VM needs besides the job: its boot (~5 s) and power-off, with margin for a
/// loaded host.
const OUTER_OVERHEAD: Duration = Duration::from_secs(120);

/// How long the outer VM's heartbeat may go unwritten before the host takes the VM for wedged
/// (its kernel seen stuck in its own KVM, neither panicking nor answering, docs/linux-lab.md):
/// a job waiting on a hung guest goes on beating, so this never takes a guest's fault for the
/// lab's.
const HEARTBEAT_SILENCE: Duration = Duration::from_secs(120);

/// The file (in the job's folder) where a job that found the outer VM unable to run it any more
/// says why, before it resets the outer VM: a process that outlived SIGKILL
/// (`crate::guest::Job`'s `give_up`). The lab takes it for the outer VM's death.
pub const GAVE_UP: &str = "outer-gave-up";

/// Guest RAM of the outer VM, MiB: room for a 4608 MiB guest and the host tools beside it (TCG
/// allocates it only as it is touched).
const OUTER_MEMORY_MIB: u32 = 8192;

/// The outer VM's machine, each overridable for experiments on the lab's steadiness by
/// `EXITLESS_LAB_ACCEL`, `_CPU`, `_SMP` and `_APPEND` (extra kernel parameters; module
/// parameters as `kvm_amd.KEY=V`), its kernel by `_KERNEL` ([`KERNEL_PACKAGE`]) and its
/// emulator by `EXITLESS_LAB_QEMU` ([`OuterQemu`]).
/// docs/linux-lab.md says what was tried.
const OUTER_ACCEL: &str = "tcg,thread=multi";
const OUTER_CPU: &str = "max";
const OUTER_SMP: &str = "2";
/// kvm-amd without virtual GIF: with it, 4 in 16 outer VMs died; without it, 7 in about 41,
/// not shown to be better (docs/linux-lab.md, "Steadiness").
const OUTER_APPEND: &str = "kvm_amd.vgif=0";

/// `EXITLESS_LAB_<NAME>` if set, else `default`.
fn outer_setting(name: &str, default: &str) -> String {
    std::env::var(format!("EXITLESS_LAB_{name}")).unwrap_or_else(|_| default.to_owned())
}

/// Modules the outer VM loads: 9p and the overlay for its root, KVM on the emulated SVM, tun for
/// the jobs' taps, vhost-net for the jobs that use it.
const OUTER_MODULES: [&str; 7] = [
    "virtio_pci",
    "9pnet_virtio",
    "9p",
    "overlay",
    "kvm_amd",
    "tun",
    "vhost_net",
];

/// The outer VM's `/init`: mount this host's root (tag `host`) as the lower layer of an overlay,
/// the job's folder (tag `job`, path from `lab.dir=` on the command line) over its own path,
/// run `job.sh` there in a chroot with a time limit, write its status, power off. Beside the
/// job it writes its uptime to `heartbeat` every 10 s, so the host can tell an outer VM that
/// stopped answering from a job that is slow.
const OUTER_INIT: &str = r#"
for word in $(cat /proc/cmdline); do
  case "$word" in lab.dir=*) dir="${word#lab.dir=}" ;; lab.limit=*) limit="${word#lab.limit=}" ;; esac
done
mkdir -p /host /upper /root
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000 host /host
mount -t tmpfs -o size=4g tmpfs /upper
mkdir -p /upper/data /upper/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/upper/data,workdir=/upper/work /root
mount -t proc proc /root/proc
mount -t sysfs sysfs /root/sys
mount -o bind /dev /root/dev
mkdir -p /root/dev/pts /root/dev/shm
mount -t devpts devpts /root/dev/pts
mount -t tmpfs tmpfs /root/dev/shm
mount -t tmpfs tmpfs /root/run
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 job "/root$dir"
[ -c /dev/kvm ] && echo "lab: /dev/kvm is up after $(cut -d' ' -f1 /proc/uptime) s"
echo "lab: kvm_amd $(cd /sys/module/kvm_amd/parameters && grep -H . npt vgif nested avic | tr '\n' ' ')"
(while :; do cut -d' ' -f1 /proc/uptime > "/root$dir/heartbeat"; sleep 10; done) &
chroot /root /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  /usr/bin/timeout "$limit" /bin/sh -c "cd '$dir' && exec /bin/sh job.sh" > "/root$dir/output" 2>&1
echo $? > "/root$dir/status.part"
mv "/root$dir/status.part" "/root$dir/status"
sync
poweroff -f
"#;

/// Where jobs run.
pub enum Lab {
    /// On this host: its KVM is hardware KVM.
    Direct,
    /// In an outer VM that `qemu` runs, booted from `kernel` with `initramfs` (see the
    /// module's docs).
    Nested {
        qemu: OuterQemu,
        kernel: Kernel,
        initramfs: PathBuf,
    },
}

/// What a job left: its exit status and everything it printed.
pub struct Finished {
    pub status: i32,
    pub output: String,
}

impl Lab {
    /// The lab of this host, built on first use; why there is none (no QEMU, no Debian
    /// packages), if there is none.
    pub fn get() -> Result<Lab, String> {
        if hardware_kvm() {
            return Ok(Lab::Direct);
        }
        let qemu = OuterQemu::get()?;
        let kernel = debian::kernel(&outer_setting("KERNEL", KERNEL_PACKAGE))?;
        // Built anew by every test process (a few MB, a second): a cached one could be an
        // older OUTER_INIT's.
        let initramfs = kernel
            .vmlinuz
            .with_file_name(format!("lab-outer-{}.cpio", std::process::id()));
        let mut archive = Initramfs::new(&debian::busybox()?, OUTER_INIT)?;
        for module in OUTER_MODULES {
            archive.module(&kernel, module)?;
        }
        std::fs::write(&initramfs, archive.finish()).map_err(|e| e.to_string())?;
        Ok(Lab::Nested {
            qemu,
            kernel,
            initramfs,
        })
    }

    /// The lab, or the test's end: skipped with a line where this host has none, unless
    /// `EXITLESS_LAB=required` (CI sets it), where that is a failure.
    pub fn or_skip(test: &str) -> Option<Lab> {
        match Lab::get() {
            Ok(lab) => Some(lab),
            Err(why) if std::env::var("EXITLESS_LAB").as_deref() == Ok("required") => {
                panic!("{test}: EXITLESS_LAB=required, but there is no lab here: {why}")
            }
            Err(why) => {
                println!("skipped {test}: no lab here: {why}");
                None
            }
        }
    }

    /// A word for the output: where the jobs run.
    pub fn describe(&self) -> String {
        match self {
            Lab::Direct => "directly on this host's hardware KVM".to_owned(),
            Lab::Nested { qemu, kernel, .. } => format!(
                "in the nested lab ({} TCG outer VM on {}, kvm-amd inside; TCG-timed)",
                qemu.version,
                kernel
                    .vmlinuz
                    .file_name()
                    .map_or("?".into(), |n| n.to_string_lossy())
            ),
        }
    }

    /// Run `script` (sh) in `dir` (made fresh for it: the job's files go there) for at most
    /// `limit`; its status and output. Panics, naming the cause, if the outer VM died on every
    /// attempt: that is the lab's failure, not the job's.
    pub fn run(&self, dir: &Path, script: &str, limit: Duration) -> Finished {
        std::fs::write(dir.join("job.sh"), script).unwrap();
        let (status, output) = (dir.join("status"), dir.join("output"));
        let mut deaths = Vec::new();
        for attempt in 1..=ATTEMPTS {
            let _ = std::fs::remove_file(&status);
            let _ = std::fs::remove_file(&output);
            let _ = std::fs::remove_file(dir.join(GAVE_UP));
            let started = Instant::now();
            match self {
                Lab::Direct => direct(dir, limit),
                Lab::Nested {
                    qemu,
                    kernel,
                    initramfs,
                } => {
                    if let Err(death) = nested(qemu, kernel, initramfs, dir, limit) {
                        println!(
                            "lab: the outer VM died after {:.0} s, attempt {attempt} of {ATTEMPTS}: {death}",
                            started.elapsed().as_secs_f64()
                        );
                        deaths.push(death);
                        continue;
                    }
                }
            }
            let output = std::fs::read_to_string(&output).unwrap_or_default();
            let status = std::fs::read_to_string(&status)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            let Some(status) = status else {
                panic!("the job left no status; its output: {output}")
            };
            println!(
                "lab: the job ran {} in {:.0} s, status {status}",
                self.describe(),
                started.elapsed().as_secs_f64()
            );
            return Finished { status, output };
        }
        panic!("the lab's outer VM died {ATTEMPTS} times, not the job: {deaths:?}");
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Lab::Nested { initramfs, .. } = self {
            let _ = std::fs::remove_file(initramfs);
        }
    }
}

/// `path` of `program`, if it is on PATH.
pub fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

/// The outer VM's emulator. Debian bookworm's QEMU 7.2 runs it, but its kernel died in about
/// one job in six there; QEMU 10.0 (bookworm-backports) is the default since
/// (docs/linux-lab.md, "Steadiness").
pub struct OuterQemu {
    binary: PathBuf,
    /// Its own firmware folder (`-L`), for one not installed where it looks.
    data: Option<PathBuf>,
    /// What `--version` says, for the output.
    version: String,
}

/// The packages of a QEMU that runs x86 guests, with its firmware.
const QEMU_PACKAGES: [&str; 3] = ["qemu-system-x86", "qemu-system-common", "qemu-system-data"];

impl OuterQemu {
    /// `EXITLESS_LAB_QEMU` (a path) if set; else QEMU from the host's Debian release's
    /// backports, downloaded on first use; else, saying why, the host's own.
    fn get() -> Result<OuterQemu, String> {
        if let Ok(binary) = std::env::var("EXITLESS_LAB_QEMU") {
            return OuterQemu::at(PathBuf::from(binary), None);
        }
        let backports = debian::extracted_from_backports("qemu-backports", &QEMU_PACKAGES)
            .and_then(|root| {
                OuterQemu::at(
                    root.join("usr/bin/qemu-system-x86_64"),
                    Some(root.join("usr/share/qemu")),
                )
            });
        backports.or_else(|why| {
            println!("lab: no QEMU from backports ({why}); the outer VM runs on this host's");
            let binary = which("qemu-system-x86_64")
                .ok_or("the lab's outer VM needs qemu-system-x86_64 (Debian's qemu-system-x86)")?;
            OuterQemu::at(binary, None)
        })
    }

    /// The QEMU at `binary`, if it runs here.
    fn at(binary: PathBuf, data: Option<PathBuf>) -> Result<OuterQemu, String> {
        let said = debian::sh(Path::new("/"), &binary.to_string_lossy(), &["--version"])?;
        let version = said
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("QEMU emulator version "))
            .and_then(|v| v.split_whitespace().next())
            .map(|v| format!("QEMU {v}"))
            .ok_or(format!("{}: no version in {said:?}", binary.display()))?;
        Ok(OuterQemu {
            binary,
            data,
            version,
        })
    }
}

/// Run the job here, as the outer VM's init would.
fn direct(dir: &Path, limit: Duration) {
    let out = std::fs::File::create(dir.join("output")).unwrap();
    let status = Command::new("timeout")
        .arg(limit.as_secs().to_string())
        .args(["sh", "job.sh"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .status()
        .expect("timeout(1) runs");
    let code = status.code().unwrap_or(128 + 9);
    std::fs::write(dir.join("status"), code.to_string()).unwrap();
}

/// Boot the outer VM for the job in `dir`; why it died, if it ended without the job's status.
fn nested(
    qemu: &OuterQemu,
    kernel: &Kernel,
    initramfs: &Path,
    dir: &Path,
    limit: Duration,
) -> Result<(), String> {
    let console_path = dir.join("outer-console.log");
    let console = std::fs::File::create(&console_path).unwrap();
    let append = format!(
        "console=ttyS0 panic=-1 oops=panic loglevel=4 lab.dir={} lab.limit={} {}",
        dir.display(),
        limit.as_secs(),
        outer_setting("APPEND", OUTER_APPEND)
    );
    let mut child = Command::new(&qemu.binary)
        .args(qemu.data.iter().flat_map(|d| [Path::new("-L"), d]))
        .arg("-accel")
        .arg(outer_setting("ACCEL", OUTER_ACCEL))
        .arg("-cpu")
        .arg(outer_setting("CPU", OUTER_CPU))
        .arg("-smp")
        .arg(outer_setting("SMP", OUTER_SMP))
        .arg("-m")
        .arg(OUTER_MEMORY_MIB.to_string())
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        .args(["-append", &append])
        .arg("-virtfs")
        .arg("local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap")
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=job,security_model=none",
            dir.display()
        ))
        .args([
            "-nographic",
            "-nodefaults",
            "-no-reboot",
            "-serial",
            "stdio",
        ])
        .stdin(Stdio::null())
        .stdout(console.try_clone().unwrap())
        .stderr(console)
        .spawn()
        .map_err(|e| format!("qemu-system-x86_64: {e}"))?;
    let started = Instant::now();
    let deadline = started + limit + OUTER_OVERHEAD;
    let heartbeat = dir.join("heartbeat");
    let _ = std::fs::remove_file(&heartbeat);
    let mut wedged = false;
    let exited = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        // Silent since the last beat, or since its boot was due to have ended.
        let silent = std::fs::metadata(&heartbeat)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|beat| beat.elapsed().ok())
            .unwrap_or_else(|| started.elapsed().saturating_sub(OUTER_OVERHEAD));
        wedged = silent > HEARTBEAT_SILENCE;
        if wedged || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if dir.join("status").exists() {
        return Ok(());
    }
    let log = std::fs::read_to_string(&console_path).unwrap_or_default();
    // Kept apart, so the next attempt's console does not overwrite the dead VM's.
    let kept = (1..)
        .map(|n| dir.join(format!("outer-console.died-{n}.log")))
        .find(|p| !p.exists())
        .expect("a free name");
    let kept = match std::fs::rename(&console_path, &kept) {
        Ok(()) => kept,
        Err(_) => console_path,
    };
    let gave_up = std::fs::read_to_string(dir.join(GAVE_UP)).ok();
    let cause = gave_up.or_else(|| {
        log.lines()
            .find(|l| {
                l.contains("Kernel panic") || l.contains("BUG:") || l.contains("corrupted stack")
            })
            .map(str::to_owned)
    });
    let cause = cause.map(|c| c.trim().to_owned());
    let why = match (exited, cause) {
        (_, Some(cause)) => cause,
        (Some(status), None) => format!("QEMU ended ({status}) with no job status"),
        (None, None) if wedged => format!(
            "its heartbeat stopped for {} s",
            HEARTBEAT_SILENCE.as_secs()
        ),
        (None, None) => format!("no answer within {} s", (limit + OUTER_OVERHEAD).as_secs()),
    };
    Err(format!("{why}; console in {}", kept.display()))
}
