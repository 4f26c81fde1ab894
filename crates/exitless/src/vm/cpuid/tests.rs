use kvm_bindings::{CpuId, kvm_cpuid_entry2};

use super::features::by_name;
use super::*;

fn entry(function: u32, index: u32, [eax, ebx, ecx, edx]: [u32; 4]) -> kvm_cpuid_entry2 {
    kvm_cpuid_entry2 {
        function,
        index,
        eax,
        ebx,
        ecx,
        edx,
        ..Default::default()
    }
}

/// A host with everything in leaves 1, 7 and 8000_0001H, and XSAVE with x87, SSE, AVX and
/// AVX-512 state (standard offsets: AVX at 576, 256 bytes; opmask at 1088, ZMM_Hi256 at
/// 1152, Hi16_ZMM at 1664, ending at 2688).
fn host() -> CpuId {
    let all = !(1u32 << 31); // KVM leaves the hypervisor bit to the VMM.
    CpuId::from_entries(&[
        entry(0, 0, [0xd, 0, 0, 0]),
        entry(1, 0, [0, 0x0001_0800, all, u32::MAX]),
        entry(7, 0, [0, u32::MAX, u32::MAX, u32::MAX]),
        entry(0xd, 0, [0xe7, 2688, 2688, 0]),
        entry(0xd, 1, [0xf, 0, 0, 0]),
        entry(0xd, 2, [256, 576, 0, 0]),
        entry(0xd, 5, [64, 1088, 0, 0]),
        entry(0xd, 6, [512, 1152, 0, 0]),
        entry(0xd, 7, [1024, 1664, 0, 0]),
        entry(0x8000_0001, 0, [0, 0, u32::MAX, u32::MAX]),
    ])
    .unwrap()
}

fn shows(cpuid: &CpuId, name: &str) -> bool {
    by_name(name).unwrap().shown_in(cpuid.as_slice())
}

fn leaf(cpuid: &CpuId, function: u32, index: u32) -> [u32; 4] {
    let e = cpuid
        .as_slice()
        .iter()
        .find(|e| e.function == function && e.index == index)
        .unwrap();
    [e.eax, e.ebx, e.ecx, e.edx]
}

fn guest_of(template: &str) -> Result<CpuId, CpuError> {
    guest(&host(), &template.parse()?)
}

#[test]
fn host_hides_xsave_and_cx16_and_what_needs_xsave() {
    let g = guest_of("host").unwrap();
    assert!(shows(&g, "hypervisor") && shows(&g, "sse4.2") && shows(&g, "tsc-adjust"));
    for hidden in ["xsave", "cx16", "avx", "avx2", "avx512f", "fma", "xsaveopt"] {
        assert!(!shows(&g, hidden), "{hidden}");
    }
    assert_eq!(leaf(&g, 1, 0)[2] & 1 << 27, 0, "OSXSAVE");
    assert_eq!(leaf(&g, 0xd, 0), [0; 4]);
    assert_eq!(leaf(&g, 0xd, 2), [0; 4]);
}

#[test]
fn xsave_back_keeps_only_the_shown_state_components() {
    let g = guest_of("host,+xsave,-avx512f").unwrap();
    assert!(shows(&g, "xsave") && shows(&g, "avx") && !shows(&g, "avx512bw"));
    // x87, SSE, AVX; the size ends with AVX's component.
    assert_eq!(leaf(&g, 0xd, 0), [0x7, 576, 832, 0]);
    assert_eq!(leaf(&g, 0xd, 2), [256, 576, 0, 0]);
    assert_eq!(leaf(&g, 0xd, 6), [0; 4]);
    let g = guest_of("host,+xsave").unwrap();
    assert_eq!(leaf(&g, 0xd, 0), [0xe7, 576, 2688, 0]);
}

#[test]
fn changes_apply_in_order() {
    let g = guest_of("host,-x2apic,-tsc-adjust,-arch-capabilities,+cx16,-sse4.2,+sse4.2").unwrap();
    assert!(!shows(&g, "x2apic") && !shows(&g, "tsc-adjust"));
    assert!(!shows(&g, "arch-capabilities"));
    assert!(shows(&g, "cx16") && shows(&g, "sse4.2"));
}

#[test]
fn baseline_is_its_list_and_nothing_else() {
    let g = guest_of("baseline").unwrap();
    let shown: Vec<&str> = features::FEATURES
        .iter()
        .filter(|f| shows(&g, f.name))
        .map(|f| f.name)
        .collect();
    assert_eq!(shown, template::BASELINE);
    // Bits no name covers are off too.
    assert_eq!(leaf(&g, 7, 0), [0; 4]);
    assert_eq!(leaf(&g, 1, 0)[3] & 1 << 31, 0);
    assert_eq!(leaf(&g, 0xd, 0), [0; 4]);
}

#[test]
fn what_the_host_lacks_is_refused() {
    let mut poor = host();
    poor.as_mut_slice()[2].ebx = 0; // no leaf-7 EBX feature
    let t: CpuTemplate = "host,+avx2".parse().unwrap();
    assert_eq!(guest(&poor, &t), Err(CpuError::Unavailable("avx2")));
    poor.as_mut_slice()[1].ecx &= !(1 << 20);
    let t: CpuTemplate = "baseline".parse().unwrap();
    assert_eq!(guest(&poor, &t), Err(CpuError::Unavailable("sse4.2")));
    assert_eq!(
        guest_of("host,+avx").unwrap_err(),
        CpuError::Needs("avx", "xsave")
    );
}

#[test]
fn bad_values_get_one_line() {
    let err = |s: &str| s.parse::<CpuTemplate>().unwrap_err().to_string();
    assert!(err("max").starts_with("--cpu max: the template is `host` or `baseline`"));
    assert_eq!(
        err("host,xsave"),
        "--cpu: `xsave` needs a + (show) or - (hide) before the feature's name"
    );
    let unknown = err("host,-sse9");
    assert!(unknown.starts_with("--cpu: unknown feature `sse9`; known: fpu vme"));
    assert!(!unknown.contains('\n'));
    let t: CpuTemplate = "baseline,+x2apic,-cx16".parse().unwrap();
    assert_eq!(t.to_string(), "baseline,+x2apic,-cx16");
}

#[test]
fn each_vcpu_gets_its_apic_id() {
    let g = for_vcpu(guest_of("host").unwrap(), 5);
    assert_eq!(leaf(&g, 1, 0)[1] >> 24, 5);
}

#[test]
fn every_name_the_tables_use_is_a_feature() {
    let names = features::NEEDS
        .iter()
        .flat_map(|(a, b)| [*a, *b])
        .chain(template::BASELINE.iter().copied())
        .chain(template::HOST_HIDDEN.iter().copied())
        .chain(xsave::COMPONENTS.iter().map(|(_, f)| *f));
    for name in names {
        assert!(by_name(name).is_some(), "{name}");
    }
    // NEEDS lists each feature after what it needs, so one pass settles a chain.
    for (i, (_, needs)) in features::NEEDS.iter().enumerate() {
        assert!(
            !features::NEEDS[i..].iter().any(|(f, _)| f == needs),
            "{needs}"
        );
    }
}
