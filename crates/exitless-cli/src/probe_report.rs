//! `exitless probe`: boot the probe guest, let it enumerate PCI as an OS would, and show what it
//! found and what that cost in exits: the guest's view of the machine, like `lspci -v`.

use std::fmt::Write as _;

use exitless::contract::{ENUM_FLAG_CAPS_TRUNCATED, ENUM_FLAG_NOT_TYPE0, EnumRecord, METHOD_ECAM};
use exitless::exits::ExitKind;
use exitless::machine::{ProbeConfig, ProbeError, ProbeRun, ops, run_probe};
use exitless::pci::{EcamMode, PciAddress};
use exitless::vm::VmError;
use exitless::vm::cpuid::CpuTemplate;
use exitless::vm::cpuid::features::FEATURES;
use exitless_bench::format::human_ns;

/// Boot the probe with ECAM served as `cfg.ecam` (`None`: not described) and have it
/// enumerate by `method` (a `METHOD_*`); `cfg.ops` is replaced.
pub fn enumerate(mut cfg: ProbeConfig, method: u64) -> Result<ProbeRun, ProbeError> {
    cfg.ops = vec![ops::enumerate(method)];
    run_probe(&cfg)
}

fn capability_name(id: u64) -> String {
    let name = match id {
        0x01 => "power-management",
        0x05 => "msi",
        0x09 => "vendor",
        0x10 => "pci-express",
        0x11 => "msi-x",
        0x1_000b => "ext:vendor",
        id if id > 0xffff => return format!("ext:{:#06x}", id & 0xffff),
        _ => return format!("{id:#04x}"),
    };
    name.into()
}

fn describe_record(out: &mut String, r: &EnumRecord) {
    let (address, _) = PciAddress::from_ecam_offset(r.address);
    let [id, class] = [r.header[0], r.header[2]];
    let _ = writeln!(
        out,
        "{address} {:04x}:{:04x} class {:06x} rev {:02x}",
        id & 0xffff,
        id >> 16,
        class >> 8,
        class & 0xff
    );
    if r.flags & ENUM_FLAG_NOT_TYPE0 != 0 {
        let _ = writeln!(out, "    (not a type-0 header: BARs not sized)");
    }
    for (slot, &size) in r.bar_sizes.iter().enumerate().filter(|(_, s)| **s != 0) {
        let bar = r.header[4 + slot];
        let kind = match (bar & 1, bar >> 1 & 3) {
            (1, _) => "io",
            (_, 2) => "mem64",
            _ => "mem32",
        };
        let base = if kind == "mem64" {
            (r.header[5 + slot] << 32) | (bar & !0xf)
        } else {
            bar & !if kind == "io" { 0x3 } else { 0xf }
        };
        let _ = writeln!(out, "    BAR{slot} {kind:<5} {base:#x} size {size:#x}");
    }
    let caps: Vec<String> = r.caps[..r.cap_count.min(8) as usize]
        .iter()
        .map(|&c| capability_name(c))
        .collect();
    if !caps.is_empty() {
        let more = if r.flags & ENUM_FLAG_CAPS_TRUNCATED != 0 {
            " ..."
        } else {
            ""
        };
        let _ = writeln!(out, "    capabilities: {}{more}", caps.join(" "));
    }
}

/// What the guest found and what the enumeration cost.
pub fn describe(run: &ProbeRun, ecam: Option<EcamMode>) -> String {
    let mut out = String::new();
    let result = run.results[0];
    let method = if result.method_used == METHOD_ECAM {
        "ECAM"
    } else {
        "port I/O (0xCF8/0xCFC)"
    };
    let served = match ecam {
        Some(EcamMode::Shadow) => "ECAM served from a read-only shadow",
        Some(EcamMode::Trap) => "ECAM trapped",
        None => "no ECAM described",
    };
    let _ = writeln!(
        out,
        "probe guest enumerated bus 0 by {method} ({served}): {} functions\n",
        result.value
    );
    for r in &run.enum_records {
        describe_record(&mut out, r);
    }
    let exits = run.exits(0);
    let kinds: Vec<String> = ExitKind::ALL
        .into_iter()
        .filter(|&k| exits.of_kind(k) > 0)
        .map(|k| format!("{} {}", k.name(), exits.of_kind(k)))
        .collect();
    let time = run
        .tsc_khz
        .map_or(f64::NAN, |khz| result.cycles as f64 * 1e6 / f64::from(khz));
    let _ = writeln!(
        out,
        "\nenumeration took {} and {} exits to the VMM ({})",
        human_ns(time),
        exits.total(),
        if kinds.is_empty() {
            "none".into()
        } else {
            kinds.join(", ")
        }
    );
    let errors = run.total_exits.guest_errors_by_name(&run.devices);
    if !errors.is_empty() {
        let list: Vec<String> = errors.iter().map(|(d, n)| format!("{d} {n}")).collect();
        let _ = writeln!(out, "guest errors by device: {}", list.join(", "));
    }
    out
}

/// `exitless probe --cpuid`: the CPUID leaves a guest of `template` sees on this host, as
/// exitless gives them to vCPU 0 (`KVM_SET_CPUID2`), one line per leaf and subleaf, then the
/// named features it shows.
pub fn cpuid(template: &CpuTemplate) -> Result<String, VmError> {
    let cpuid = exitless::vm::cpuid::for_host(template)?;
    let mut out = format!("CPUID for --cpu {template}\n");
    for e in cpuid.as_slice() {
        let _ = writeln!(
            out,
            "{:#010x}.{:<2} eax={:08x} ebx={:08x} ecx={:08x} edx={:08x}",
            e.function, e.index, e.eax, e.ebx, e.ecx, e.edx
        );
    }
    let shown: Vec<&str> = FEATURES
        .iter()
        .filter(|f| f.shown_in(cpuid.as_slice()))
        .map(|f| f.name)
        .collect();
    let _ = writeln!(out, "features: {}", shown.join(" "));
    Ok(out)
}
