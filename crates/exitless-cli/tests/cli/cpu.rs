//! `--cpu`: what the guest sees. The test kernel executes CPUID at ring 0 (`cpuid=1`) and
//! prints the feature leaves; each adjustment must show in them. `exitless probe --cpuid`
//! prints the leaves exitless gives KVM. Bad names and features the host cannot give get one
//! line and status 2.
//!
//! This project's software KVM (kvm_pvm, docs/host-kvm.md) answers some CPUID bits from the
//! host whatever the VMM sets: leaf 1 EDX, most instruction-set bits of leaf 1 ECX (xsave and
//! avx among them), leaf 7 and leaf 0DH. Only on hardware KVM are those checked in the guest;
//! here the probe's table shows them.

use std::path::Path;
use std::process::{Command, Output};

/// The test kernel's status when every check passed (isa-debug-exit 0x10).
const PASSED: i32 = 0x21;
/// `exitless`'s status for bad input.
const ERROR: i32 = 2;

fn exitless(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(args)
        .output()
        .expect("exitless starts")
}

/// Whether KVM runs guests on the CPU's virtualization extensions (not kvm_pvm).
fn hardware_kvm() -> bool {
    let loaded = |m: &str| Path::new("/sys/module").join(m).exists();
    (loaded("kvm_intel") || loaded("kvm_amd")) && !loaded("kvm_pvm")
}

/// The guest's registers for `leaf.subleaf` in lines `cpuid L.S eax=… ebx=… ecx=… edx=…`,
/// from the test kernel or from `exitless probe --cpuid` (`0x0000000L.S  eax=…`).
fn registers(text: &str, leaf: u32, subleaf: u32) -> [u32; 4] {
    let line = text
        .lines()
        .find(|l| {
            let key = l.split_whitespace().find(|w| w.contains('.')).unwrap_or("");
            let (l, s) = key.split_once('.').unwrap_or(("", ""));
            let l = u32::from_str_radix(l.trim_start_matches("0x"), 16);
            l == Ok(leaf) && s.parse() == Ok(subleaf)
        })
        .unwrap_or_else(|| panic!("no leaf {leaf:#x}.{subleaf} in:\n{text}"));
    let mut regs = [0; 4];
    for (i, name) in ["eax=", "ebx=", "ecx=", "edx="].iter().enumerate() {
        let value = line.split_whitespace().find_map(|w| w.strip_prefix(name));
        regs[i] = u32::from_str_radix(value.expect("all four registers"), 16).unwrap();
    }
    regs
}

/// What the test kernel sees under `--cpu cpu`; every check of its own passes.
fn guest_sees(cpu: &str) -> String {
    let elf = Path::new(env!("CARGO_BIN_EXE_exitless")).with_file_name("testkernel.elf");
    let out = exitless(&[
        "run",
        "--kernel",
        elf.to_str().unwrap(),
        "--cmdline",
        "cpuid=1",
        "--timeout",
        "60",
        "--cpu",
        cpu,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(PASSED), "--cpu {cpu}:\n{stdout}");
    stdout
}

fn bit(regs: [u32; 4], reg: usize, bit: u32) -> bool {
    regs[reg] & 1 << bit != 0
}

const ECX: usize = 2;
const EDX: usize = 3;
const EBX: usize = 1;

#[test]
fn each_adjustment_reaches_the_guest() {
    // (template, leaf, register, bit, what the guest must see)
    let cases: &[(&str, u32, usize, u32, bool)] = &[
        ("host", 1, ECX, 13, false), // cx16: host hides it
        ("host", 1, ECX, 31, true),  // hypervisor
        ("host", 1, ECX, 21, true),  // x2apic
        ("host,-x2apic", 1, ECX, 21, false),
        ("host,-x2apic,+x2apic", 1, ECX, 21, true),
        ("host,-hypervisor", 1, ECX, 31, false),
        ("host,-syscall", 0x8000_0001, EDX, 11, false),
        ("host,-lahf-lm", 0x8000_0001, ECX, 0, false),
        ("host", 0x8000_0001, EDX, 11, true),
    ];
    for &(cpu, leaf, reg, b, want) in cases {
        let seen = guest_sees(cpu);
        assert_eq!(
            bit(registers(&seen, leaf, 0), reg, b),
            want,
            "--cpu {cpu}: leaf {leaf:#x}"
        );
    }
}

#[test]
fn leaf_7_and_xsave_reach_the_guest_on_hardware_kvm() {
    if !hardware_kvm() {
        println!("skipped: this KVM answers leaf 7 and XSAVE from the host (docs/host-kvm.md)");
        return;
    }
    let seen = guest_sees("host,-tsc-adjust,-arch-capabilities");
    assert!(!bit(registers(&seen, 7, 0), EBX, 1), "tsc-adjust");
    assert!(!bit(registers(&seen, 7, 0), EDX, 29), "arch-capabilities");
    let seen = guest_sees("host");
    assert!(!bit(registers(&seen, 1, 0), ECX, 26), "xsave");
    assert_eq!(registers(&seen, 0xd, 0), [0; 4]);
}

#[test]
fn probe_prints_the_leaves_the_guest_is_given() {
    let out = exitless(&["probe", "--cpuid", "--cpu", "host,-x2apic,-tsc-adjust"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("CPUID for --cpu host,-x2apic,-tsc-adjust\n"),
        "{text}"
    );
    assert!(!bit(registers(&text, 1, 0), ECX, 21));
    assert!(!bit(registers(&text, 7, 0), EBX, 1));
    assert!(!bit(registers(&text, 1, 0), ECX, 26), "xsave is hidden");
    assert_eq!(registers(&text, 0xd, 0), [0; 4], "and with it leaf 0xd");
    let features = text.lines().last().unwrap();
    assert!(features.starts_with("features: ") && features.contains(" hypervisor"));
    assert!(!features.contains("x2apic") && !features.contains("tsc-adjust"));
}

/// One line on stderr that contains `says`, and status 2.
fn refused(args: &[&str], says: &str) {
    let out = exitless(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(ERROR), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(says), "{stderr}");
}

#[test]
fn bad_names_and_features_the_host_lacks_get_one_line() {
    let elf = Path::new(env!("CARGO_BIN_EXE_exitless")).with_file_name("testkernel.elf");
    let run = |cpu: &'static str| {
        let elf = elf.to_str().unwrap().to_owned();
        move |says: &str| refused(&["run", "--kernel", &elf, "--cpu", cpu], says)
    };
    run("host,-sse9")("unknown feature `sse9`; known: fpu vme de");
    run("max")("the template is `host` or `baseline`");
    run("host,x2apic")("needs a + (show) or - (hide)");
    // KVM never gives the debug store (KVM_GET_SUPPORTED_CPUID leaves leaf 1 EDX[21] clear).
    run("host,+ds")("this host's KVM cannot give ds");
    refused(&["probe", "--cpuid", "--cpu", "host,+ds"], "cannot give ds");
}
