//! The Linux guest every case boots, and the job that boots it: Debian's generic kernel with a
//! busybox initramfs whose `/init` loads the virtio drivers, runs the case's script and powers
//! off; the job runs it under exitless, each run's console and status in a file of its own.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::debian;
use crate::common::initramfs::Initramfs;
use crate::lab::{Finished, KERNEL_PACKAGE, Lab};

/// Drivers the guest loads, with what they depend on: both virtio transports, the disk, the
/// card, ext4 (which mounts the ext2 file systems busybox makes) and its checksum.
const GUEST_MODULES: [&str; 6] = [
    "virtio_pci",
    "virtio_mmio",
    "virtio_blk",
    "virtio_net",
    "ext4",
    // ext4 asks the crypto API for crc32c at mount, which only modprobe would load.
    "crc32c_generic",
];

/// The start of the case's part of `/init`: a line saying the guest is up. The case's script
/// follows; then the guest powers off (ACPI S5: status 0 under exitless).
const PRELUDE: &str = r#"
echo "GUEST up after $(cut -d' ' -f1 /proc/uptime) s, $(grep -c ^processor /proc/cpuinfo) CPUs"
"#;

/// What every guest's kernel command line starts with: the serial console, the initramfs's init,
/// and a panic that resets at once rather than hanging until the run's timeout.
pub const CMDLINE: &str = "console=ttyS0 rdinit=/init panic=-1";

/// A guest: the kernel and its initramfs (paths this host and the lab share).
pub struct Guest {
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
}

impl Guest {
    /// The guest whose `/init` runs `script` (sh, busybox's applets, and this host's
    /// `programs` at their paths), written into `dir` as `NAME.cpio`.
    pub fn new(dir: &Path, name: &str, script: &str, programs: &[&str]) -> Guest {
        let kernel = debian::kernel(KERNEL_PACKAGE).expect("Debian's kernel");
        let init = format!("{PRELUDE}{script}\necho GUEST done\npoweroff -f\n");
        let mut archive = Initramfs::new(&debian::busybox().expect("busybox"), &init).unwrap();
        for module in GUEST_MODULES {
            archive.module(&kernel, module).unwrap();
        }
        for program in programs {
            archive
                .program(Path::new(program))
                .unwrap_or_else(|e| panic!("{program} for the guest: {e}"));
        }
        let initramfs = dir.join(format!("{name}.cpio"));
        std::fs::write(&initramfs, archive.finish()).unwrap();
        Guest {
            kernel: kernel.vmlinuz,
            initramfs,
        }
    }
}

/// A job: shell lines run in order in its folder, among them runs of a guest whose console and
/// status each go to `NAME.console` and `NAME.status`.
pub struct Job {
    pub dir: PathBuf,
    script: String,
}

/// One guest's run: its status and its console (exitless's standard output and error).
pub struct Run {
    pub name: String,
    pub status: i32,
    pub console: String,
}

impl Run {
    /// The value after `GUEST key ` on the console's last such line.
    pub fn value(&self, key: &str) -> Option<&str> {
        let prefix = format!("GUEST {key} ");
        self.console
            .lines()
            .rev()
            .find_map(|l| l.trim_start_matches(|c| c != 'G').strip_prefix(&prefix))
            .map(str::trim)
    }

    /// Panic unless the console has `GUEST key value`.
    pub fn expect(&self, key: &str, value: &str) {
        assert_eq!(
            self.value(key),
            Some(value),
            "{}: GUEST {key}; {}",
            self.name,
            self.tail()
        );
    }

    /// Panic unless the guest ran its whole script and exitless ended with `status`.
    pub fn expect_done(&self, status: i32) {
        assert!(
            self.console.contains("GUEST done"),
            "{}: the guest did not finish its script; {}",
            self.name,
            self.tail()
        );
        assert_eq!(
            self.status,
            status,
            "{}: the run's status; {}",
            self.name,
            self.tail()
        );
    }

    /// The last lines of the console, for a failure's message.
    pub fn tail(&self) -> String {
        let lines: Vec<&str> = self.console.lines().collect();
        let from = lines.len().saturating_sub(25);
        format!("its console ends:\n{}", lines[from..].join("\n"))
    }
}

impl Job {
    /// A job in a fresh folder named after the test.
    pub fn new(test: &str) -> Job {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("linux-lab")
            .join(test);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Job {
            dir,
            script: String::from("set -u\n"),
        }
    }

    /// A path in the job's folder.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Add shell lines.
    pub fn sh(&mut self, lines: &str) {
        self.script.push_str(lines);
        self.script.push('\n');
    }

    /// Run `guest` under exitless with `args` and `extra` on its command line, as `name`.
    pub fn exitless(&mut self, name: &str, guest: &Guest, extra_cmdline: &str, args: &str) {
        let line = format!(
            "{exitless} run --kernel {kernel} --initrd {initrd} --cmdline '{CMDLINE} {extra_cmdline}' \
             --timeout 600 {args}",
            exitless = env!("CARGO_BIN_EXE_exitless"),
            kernel = guest.kernel.display(),
            initrd = guest.initramfs.display(),
        );
        self.record(name, &line);
    }

    fn record(&mut self, name: &str, line: &str) {
        self.sh(&format!(
            "echo 'job: {name}'\n{line} < /dev/null > {name}.console 2>&1\necho $? > {name}.status"
        ));
    }

    /// Run the job in `lab`, at most `limit`; panics if the job itself failed (its status is
    /// not 0), with its output.
    pub fn run(self, lab: &Lab, limit: Duration) -> Done {
        let finished = lab.run(&self.dir, &self.script, limit);
        assert_eq!(
            finished.status, 0,
            "the job failed; its output:\n{}",
            finished.output
        );
        Done {
            dir: self.dir,
            finished,
        }
    }
}

/// A job that has run.
pub struct Done {
    pub dir: PathBuf,
    pub finished: Finished,
}

impl Done {
    /// The guest run `name`.
    pub fn run(&self, name: &str) -> Run {
        let read = |ext: &str| std::fs::read_to_string(self.dir.join(format!("{name}.{ext}")));
        let console = read("console").unwrap_or_default();
        let status = read("status")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "{name} left no status; the job said:\n{}",
                    self.finished.output
                )
            });
        let run = Run {
            name: name.to_owned(),
            status,
            console,
        };
        let up = run.console.lines().find(|l| l.contains("GUEST up after"));
        println!(
            "{name}: status {status}; {}",
            up.unwrap_or("never up").trim()
        );
        run
    }
}
