//! The Linux guest every case boots, and the job that boots it: Debian's generic kernel with a
//! busybox initramfs whose `/init` loads the virtio drivers, runs the case's script and powers
//! off; the job runs it under exitless, each run's console and status in a file of its own.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::debian;
use crate::common::initramfs::Initramfs;
use crate::lab::{self, Finished, KERNEL_PACKAGE, Lab};

/// Drivers the guest loads, with what they depend on: both virtio transports, the disk, the
/// card, ext4 (which mounts the ext2 file systems busybox makes) and its checksum, and the
/// pvpanic port's driver, so a guest that panics ends its run with the panic's status.
const GUEST_MODULES: [&str; 7] = [
    "virtio_pci",
    "virtio_mmio",
    "virtio_blk",
    "virtio_net",
    "ext4",
    // ext4 asks the crypto API for crc32c at mount, which only modprobe would load.
    "crc32c_generic",
    "pvpanic_mmio",
];

/// The start of the case's part of `/init`: a line saying the guest is up. The case's script
/// follows; then the guest powers off (ACPI S5: status 0 under exitless).
const PRELUDE: &str = r#"
echo "GUEST up after $(cut -d' ' -f1 /proc/uptime) s, $(grep -c ^processor /proc/cpuinfo) CPUs"
"#;

/// What every guest's kernel command line starts with: the serial console, the initramfs's init,
/// and a panic that resets at once rather than hanging until the run's timeout (after the
/// pvpanic driver has told exitless, which then ends the run with status 4: no panic reads as
/// a reboot's 0).
pub const CMDLINE: &str = "console=ttyS0 rdinit=/init panic=-1";

/// The longest one guest may run, seconds: twice the longest any case's guest has taken in
/// the nested lab (150 s of uptime, a snapshot's restored run), so a guest that hangs costs
/// CI minutes, not ten.
pub const GUEST_TIMEOUT_S: u32 = 300;

/// A guest: the kernel and its initramfs (paths this host and the lab share).
pub struct Guest {
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
}

impl Guest {
    /// The guest whose `/init` runs `script` (sh, busybox's applets, and this host's
    /// `programs` at their paths), written into `dir` as `NAME.cpio`.
    pub fn new(dir: &Path, name: &str, script: &str, programs: &[&str]) -> Guest {
        Guest::with_kernel(dir, name, script, programs, KERNEL_PACKAGE)
    }

    /// The same on the kernel of Debian's `package` rather than [`KERNEL_PACKAGE`].
    pub fn with_kernel(
        dir: &Path,
        name: &str,
        script: &str,
        programs: &[&str],
        package: &str,
    ) -> Guest {
        let kernel = debian::kernel(package).expect("Debian's kernel");
        // The pause lets the console's UART drain what the script wrote before the kernel's
        // own "reboot: Power down" is written over it (a report line was seen cut that way).
        let init = format!("{PRELUDE}{script}\necho GUEST done\nsleep 1\npoweroff -f\n");
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

/// What exitless logs after `vCPU N` when a vCPU shut down on a triple fault.
const TRIPLE_FAULT: &str = " shut down (a triple fault)";

/// What Linux logs when one CPU finds another not answering for 21 s (an RCU stall it did not
/// detect on itself). `watch_wedge NAME PID` (in [`JOB_START`]) stops a run whose console says
/// it with SIGQUIT, so exitless reports where its vCPUs are (`VcpuState::summary`) at once
/// rather than at its timeout.
const STALL: &str = "detected stalls on CPUs";

/// What exitless's report at SIGQUIT or the timeout says of a vCPU that sits on a page fault
/// KVM has not delivered (`VcpuState::summary`).
const UNDELIVERED_PAGE_FAULT: &str = "exception 14 pending or injected";

/// How long a guest run may take to reach its `/init` (`GUEST up after`), seconds: five times
/// the longest boot seen in the nested lab (about 30 s of wall time, QEMU's microvm and a
/// 4-vCPU guest), so a guest that hangs at boot costs the job minutes less than its timeout.
pub const BOOT_LIMIT_S: u32 = 150;

/// How every job's script starts: `$RUN` names a fresh folder on the machine the job runs on,
/// removed when the job ends, for what the shared job folder cannot hold (9p has no sockets or
/// FIFOs) or must not keep from one attempt to the next (pid files). Then the faults a guest
/// run can end on that the guest did not ask for, run again in the nested lab: it hung before
/// its `/init` (stopped by `watch_boot` after [`BOOT_LIMIT_S`] with the VMM's signal, exitless's SIGQUIT making it say
/// where its vCPUs were first, leaving `NAME.hung`; seen
/// under exitless now and then: the lab's nested SVM, docs/linux-lab.md);
/// exitless's line for a triple fault; under
/// QEMU (`-no-reboot`), an exit 0 with neither the script done nor a reboot, power-off or panic
/// of the guest's kernel, which is how QEMU ends a triple fault under KVM (a reset, as a reboot
/// is), saying nothing of it. `wait_watched NAME PID` waits for the run `NAME` (process
/// `PID`, started by the job's own lines) to end, its status in `NAME.status`, `watch_wedge`
/// watching it meanwhile. `wait_for FILE TEXT [PID]` waits up to ten minutes for `TEXT`
/// in `FILE`, or until the process `PID` has ended; `wait_for_socket PATH` a minute for a
/// Unix socket to appear. A run that does not end within 30 s of its signal is killed; one that
/// outlives SIGKILL too sits in a kernel that no longer runs it (seen once: a boot hang whose
/// VMM neither answered SIGQUIT nor its own timeout, holding its job for ten minutes), so
/// `give_up` ends the job there: in the nested lab it resets the outer VM with the reason in
/// [`lab::GAVE_UP`], and [`Lab::run`] takes that for the outer VM's death and starts the job
/// again on a new one. `@TRIPLE_FAULT@` is [`TRIPLE_FAULT`], `@BOOT_LIMIT@` [`BOOT_LIMIT_S`],
/// `@GAVE_UP@` [`lab::GAVE_UP`].
const JOB_START: &str = r#"set -u
RUN=$(mktemp -d)
trap 'rm -rf "$RUN"' EXIT
rm -f ./*.console.fault* ./*.console.boot-fault* ./*.hung
watch_boot() {
  waited=0
  until grep -q 'GUEST up after' "$1.console"; do
    if [ $waited -ge @BOOT_LIMIT@ ]; then touch "$1.hung"; kill -"$3" "$2"; end_or_give_up "$1" "$2"; return; fi
    sleep 1; waited=$((waited + 1))
  done
}
end_or_give_up() {
  for i in $(seq 30); do kill -0 "$2" 2>/dev/null || return 0; sleep 1; done
  kill -KILL "$2" 2>/dev/null
  for i in $(seq 15); do kill -0 "$2" 2>/dev/null || return 0; sleep 1; done
  give_up "$1: its VMM (pid $2) outlived SIGKILL by 15 s"
}
watch_wedge() {
  while kill -0 "$2" 2>/dev/null; do
    if grep -q '@STALL@' "$1.console"; then kill -QUIT "$2"; return; fi
    sleep 2
  done
}
wait_watched() {
  watch_wedge "$1" "$2" & watcher=$!
  wait "$2"; echo $? > "$1.status"
  kill $watcher 2>/dev/null; wait $watcher
}
wait_for() {
  for i in $(seq 600); do
    grep -q "$2" "$1" && return 0
    [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null && break
    sleep 1
  done
  echo "no $2 in $1"; return 1
}
wait_for_socket() {
  for i in $(seq 60); do [ -S "$1" ] && return 0; sleep 1; done
  echo "no socket $1"; return 1
}
give_up() {
  echo "$1" > @GAVE_UP@; echo "lab: $1"
  if [ "$LAB_NESTED" = 1 ]; then sync; echo b > /proc/sysrq-trigger; fi
  kill -TERM $$
}
hung() { [ -e "$1.hung" ]; }
restart_servers() { :; }
exitless_faulted() { hung "$1" || grep -q '@TRIPLE_FAULT@' "$1.console"; }
qemu_faulted() {
  hung "$1" || { [ "$(cat "$1.status")" = 0 ] && ! grep -q -e 'GUEST done' -e 'reboot: ' -e 'Kernel panic' "$1.console"; }
}
fault() {
  if hung "$1"; then echo "did not reach its /init within @BOOT_LIMIT@ s"; else echo "shut down on a fault"; fi
}
"#;
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

    /// The guest's uptime when its `/init` started, in seconds (PRELUDE's line).
    pub fn up_after_s(&self) -> Option<f64> {
        self.value("up")?
            .strip_prefix("after ")?
            .split(' ')
            .next()?
            .parse()
            .ok()
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

    /// Panic unless the driver negotiated every feature bit of `bits`: `GUEST key` is a virtio
    /// device's `features` in sysfs, one character per bit.
    pub fn expect_features(&self, key: &str, bits: &[usize]) {
        let features = self.value(key).unwrap_or_default();
        let missing: Vec<usize> = bits
            .iter()
            .copied()
            .filter(|&bit| features.as_bytes().get(bit) != Some(&b'1'))
            .collect();
        assert!(
            missing.is_empty(),
            "{}: {key}: bits {missing:?} not negotiated: {features}",
            self.name
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
            script: JOB_START
                .replace("@TRIPLE_FAULT@", TRIPLE_FAULT)
                .replace("@STALL@", STALL)
                .replace("@BOOT_LIMIT@", &BOOT_LIMIT_S.to_string())
                .replace("@GAVE_UP@", lab::GAVE_UP),
        }
    }

    /// A path in the job's folder.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A sparse disk image of `len` bytes in the job's folder, all zeros.
    pub fn image(&self, name: &str, len: u64) -> PathBuf {
        let image = self.path(name);
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(len))
            .unwrap_or_else(|e| panic!("{}: {e}", image.display()));
        image
    }

    /// Add shell lines.
    pub fn sh(&mut self, lines: &str) {
        self.script.push_str(lines);
        self.script.push('\n');
    }

    /// Run `guest` under exitless with `args` and `extra` on its command line, as `name`.
    pub fn exitless(&mut self, name: &str, guest: &Guest, extra_cmdline: &str, args: &str) {
        let line = exitless_command(guest, extra_cmdline, args);
        self.record(name, &line, ("exitless_faulted", "QUIT"));
    }

    /// Run `guest` under QEMU with KVM, `machine` (q35, microvm) and `args`, as `name`: the
    /// same kernel, initramfs and command line (and `extra` on it), the console on its
    /// standard output, a reboot ending the run as exitless's does (`-no-reboot`).
    pub fn qemu(
        &mut self,
        name: &str,
        guest: &Guest,
        machine: &str,
        extra_cmdline: &str,
        args: &str,
    ) {
        let line = format!(
            "timeout {GUEST_TIMEOUT_S} qemu-system-x86_64 -accel kvm -machine {machine} \\
             -cpu host,arch-capabilities=off -nodefaults -display none -serial stdio \\
             -monitor none -no-reboot -kernel {kernel} -initrd {initrd} \\
             -append '{CMDLINE} {extra_cmdline}' {args}",
            kernel = guest.kernel.display(),
            initrd = guest.initramfs.display(),
        );
        self.record(name, &line, ("qemu_faulted", "TERM"));
    }

    /// Run `line` as the guest run `name`, stopped by `signal` if it has not reached its
    /// `/init` within [`BOOT_LIMIT_S`]; in the nested lab, again (up to `$GUEST_ATTEMPTS`
    /// times, saying so) while `faulted` (a function of [`JOB_START`]) says it hung at boot or
    /// shut down on a fault: the lab's nested SVM does both to QEMU's guests too, now and then, on any vCPU
    /// (docs/linux-lab.md), so only a fault that comes back is the guest's. A faulted
    /// attempt's console is kept as `NAME.console.faultN`, and the job's servers (iperf3's,
    /// [`crate::net::start_iperf3_servers`]) start afresh before the next.
    fn record(&mut self, name: &str, line: &str, (faulted, signal): (&str, &str)) {
        self.attempts(name, line, (faulted, signal), "", "fault");
    }

    /// Start `guest_line` (an [`exitless_command`]) as the guest run `name` in the background,
    /// its process's id in `$guest`, and wait until its console says `GUEST marker`; a run
    /// that ended before that has its status in `NAME.status` already. One that ended on one
    /// of the nested lab's faults (a hang at boot, a triple fault) starts again, as
    /// [`Job::exitless`]'s do, its console kept as `NAME.console.boot-faultN`: a name the
    /// job's own retry ([`Job::run`]) does not take for a run retried to the end, so a fault
    /// after the marker still runs the whole job again.
    pub fn start_exitless_until(&mut self, name: &str, guest_line: &str, marker: &str) {
        let until = format!("wait_for {name}.console 'GUEST {marker}' $guest && break");
        self.attempts(
            name,
            guest_line,
            ("exitless_faulted", "QUIT"),
            &until,
            "boot-fault",
        );
    }

    /// The loop of [`Job::record`] and [`Job::start_exitless_until`]: `line` started as the
    /// guest run `name`, watched at boot (stopped by `signal`), then `until` (which may leave
    /// the loop with `break`), then the run's end awaited and `faulted` asked whether to start
    /// it again; a faulted attempt's console is kept as `NAME.console.KEPTN`.
    fn attempts(
        &mut self,
        name: &str,
        line: &str,
        (faulted, signal): (&str, &str),
        until: &str,
        kept: &str,
    ) {
        self.sh(&format!(
            r#"echo 'job: {name}'
attempt=1
while :; do
  rm -f {name}.hung {name}.status
  {line} < /dev/null > {name}.console 2>&1 & guest=$!
  watch_boot {name} $guest {signal} & watcher=$!
  {until}
  wait $guest; echo $? > {name}.status
  kill $watcher 2>/dev/null; wait $watcher
  {faulted} {name} && [ $attempt -lt $GUEST_ATTEMPTS ] || break
  echo "lab: {name}: the guest $(fault {name}); attempt $((attempt + 1)) of $GUEST_ATTEMPTS"
  mv {name}.console {name}.console.{kept}$attempt
  restart_servers
  attempt=$((attempt + 1))
done"#
        ));
    }

    /// Run the job in `lab`, at most `limit`; panics if the job itself failed (its status is
    /// not 0), with its output. Prints the job's `lab:` lines (a guest run attempted again).
    ///
    /// In the nested lab a guest run that shut down on a fault runs again within the job
    /// ([`Job::record`]); a job one of whose other guest runs (written with their own lines)
    /// ended on a fault ([`job_fault`]) runs again as a whole, saying so, up to
    /// [`FAULT_ATTEMPTS`] times in all, the faulted console kept as `NAME.console.job-faultN`.
    /// On hardware KVM a fault is never retried.
    pub fn run(self, lab: &Lab, limit: Duration) -> Done {
        let nested = matches!(lab, Lab::Nested { .. });
        let attempts = if nested { FAULT_ATTEMPTS } else { 1 };
        let script = format!(
            "GUEST_ATTEMPTS={attempts}\nLAB_NESTED={}\n{}",
            u8::from(nested),
            self.script
        );
        let mut finished = lab.run(&self.dir, &script, limit);
        for attempt in 2..=attempts {
            let Some((console, fault)) = job_fault(&self.dir) else {
                break;
            };
            // Kept apart: the next attempt writes the same console anew.
            let kept = console.with_extension(format!("console.job-fault{}", attempt - 1));
            let _ = std::fs::rename(&console, &kept);
            println!(
                "lab: {fault} (its console kept as {}): job attempt {attempt} of {attempts}",
                kept.display()
            );
            finished = lab.run(&self.dir, &script, limit);
        }
        for line in finished.output.lines().filter(|l| l.starts_with("lab: ")) {
            println!("{line}");
        }
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

/// How many times a guest run (or a job) whose guest shut down on a fault in the nested lab
/// is run in all.
const FAULT_ATTEMPTS: u32 = 3;

/// The first console in `dir` whose run ended on a fault and was not run again within the job:
/// the console, and what happened. A fault is exitless's report of a triple fault (`vCPU N shut
/// down (a triple fault)`), which the nested lab's guests do under QEMU too; a hang before
/// `/init` (`watch_boot` left `NAME.hung`); or a vCPU wedged on a page fault KVM never
/// delivers (exitless's report at SIGQUIT or the timeout shows it), seen at boot and after,
/// with and without pauses: the outer VM's own registers stored as the guest's at `vmrun`
/// (docs/linux-lab.md, "The wedged vCPU"), run again as a boot hang is.
fn job_fault(dir: &Path) -> Option<(PathBuf, String)> {
    let mut consoles: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "console"))
        .filter(|p| !p.with_extension("console.fault1").exists())
        .collect();
    consoles.sort();
    consoles.iter().find_map(|path| {
        if path.with_extension("hung").exists() {
            let fault = format!(
                "{}: the guest did not reach its /init within {BOOT_LIMIT_S} s, as the nested lab's guests do now and then (docs/linux-lab.md)",
                path.display()
            );
            return Some((path.clone(), fault));
        }
        let text = std::fs::read_to_string(path).ok()?;
        if let Some(at) = text.find(UNDELIVERED_PAGE_FAULT) {
            let line = &text[text[..at].rfind('\n').map_or(0, |n| n + 1)..at];
            let vcpu = line.rsplit("vCPU ").next()?.split(' ').next()?;
            let fault = format!(
                "{}: vCPU {vcpu} sat on a page fault KVM did not deliver, the outer VM's registers in its place (the nested lab's defect: docs/linux-lab.md)",
                path.display()
            );
            return Some((path.clone(), fault));
        }
        let at = text.find(TRIPLE_FAULT)?;
        let vcpu = text[..at].rsplit("vCPU ").next()?;
        let fault = format!(
            "{}: vCPU {vcpu} triple-faulted, as the nested lab's guests do under both VMMs",
            path.display()
        );
        Some((path.clone(), fault))
    })
}

/// The shell command that runs `guest` under exitless with `args`, and `extra` on its command
/// line, for at most 600 s (without redirections: the caller's).
pub fn exitless_command(guest: &Guest, extra_cmdline: &str, args: &str) -> String {
    format!(
        "{exitless} run --kernel {kernel} --initrd {initrd} --cmdline '{CMDLINE} {extra_cmdline}' \
         --timeout {GUEST_TIMEOUT_S} {args}",
        exitless = env!("CARGO_BIN_EXE_exitless"),
        kernel = guest.kernel.display(),
        initrd = guest.initramfs.display(),
    )
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
        let hung = self.dir.join(format!("{name}.hung")).exists();
        let up = match up {
            Some(line) => line.trim().to_owned(),
            None if hung => format!("stopped: no /init within {BOOT_LIMIT_S} s"),
            None => "never up".to_owned(),
        };
        println!("{name}: status {status}; {up}");
        run
    }
}

/// `job_fault` finds exitless's triple fault, a vCPU wedged on an undelivered page fault and a
/// boot hang on a console as the lab's runs leave them.
#[test]
fn a_triple_fault_a_wedged_vcpu_and_a_boot_hang_are_job_faults() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("job-faults");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let found = |console: &str| {
        std::fs::write(dir.join("run.console"), console).unwrap();
        job_fault(&dir).map(|(_, fault)| fault)
    };
    let fault = found(
        "GUEST rounds_so_far 20 9.1\nexitless: error: vCPU 1 shut down (a triple fault); KVM left it at rip 0xfff0\n",
    );
    assert!(fault.unwrap().ends_with(
        "run.console: vCPU 1 triple-faulted, as the nested lab's guests do under both VMMs"
    ));
    let wedged = "[ 66.8] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:\n\
        exitless: warn: on SIGQUIT vCPU 1 was runnable at RIP 0xffffffffc071920c; exception 14 pending or injected\n";
    assert!(
        found(wedged)
            .unwrap()
            .contains("run.console: vCPU 1 sat on a page fault")
    );
    std::fs::write(dir.join("run.hung"), "").unwrap();
    let fault = found("[    5.659617] clocksource: Switche");
    assert!(
        fault
            .unwrap()
            .contains("did not reach its /init within 150 s")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A run started with `start_exitless_until` that triple-faults before its marker starts
/// again, its console kept, and the job goes on with the run that reached the marker; the
/// job's own retry still sees a fault after it. The job runs here, in bash, with a stand-in
/// for exitless that faults on its first start only.
#[test]
fn a_run_that_faults_before_its_marker_starts_again_within_the_job() {
    let mut job = Job::new("boot-fault-retry");
    let stand_in = format!(
        "sh -c 'if [ -e started ]; then echo GUEST up after 1; echo GUEST io started; sleep 1; \
         echo \"vCPU 0{TRIPLE_FAULT}\"; else touch started; echo \"vCPU 0{TRIPLE_FAULT}\"; exit 2; fi'"
    );
    job.start_exitless_until("run", &stand_in, "io started");
    job.sh("echo marker > after-the-marker");
    job.sh("[ -e run.status ] || { wait $guest; echo $? > run.status; }");
    let status = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("GUEST_ATTEMPTS=3\n{}", job.script))
        .current_dir(&job.dir)
        .status()
        .unwrap();
    assert!(status.success());
    let read = |name: &str| std::fs::read_to_string(job.path(name)).unwrap_or_default();
    assert!(read("run.console.boot-fault1").contains(TRIPLE_FAULT));
    assert!(read("run.console").contains("GUEST io started"));
    assert_eq!(read("after-the-marker"), "marker\n");
    assert_eq!(read("run.status"), "0\n");
    let (console, _) = job_fault(&job.dir).expect("the fault after the marker");
    assert_eq!(console, job.path("run.console"));
}
