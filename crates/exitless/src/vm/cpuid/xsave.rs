//! Leaf 0DH, the XSAVE state components (Intel SDM vol. 1 §13.2, vol. 2A CPUID leaf 0DH):
//! only the components of features the guest sees, sizes to match, nothing without XSAVE.

use kvm_bindings::kvm_cpuid_entry2;

/// The legacy region and the XSAVE header: x87 and SSE state, always there (SDM vol. 1
/// §13.4.1, §13.4.2).
const LEGACY_AND_HEADER: u32 = 512 + 64;

/// The user state components (XCR0 bits) a feature owns (SDM vol. 1 §13.1): AVX's upper YMM
/// halves; MPX's bounds registers and configuration; AVX-512's opmask, upper ZMM halves of
/// ZMM0-15 and ZMM16-31; PKRU; AMX's tile configuration and data.
pub(super) const COMPONENTS: &[(u32, &str)] = &[
    (2, "avx"),
    (3, "mpx"),
    (4, "mpx"),
    (5, "avx512f"),
    (6, "avx512f"),
    (7, "avx512f"),
    (9, "pku"),
    (17, "amx-tile"),
    (18, "amx-tile"),
];

/// Whether user component `i` stays: x87 and SSE always, those of [`COMPONENTS`] with their
/// feature, any other the host has as it is.
fn keeps(i: u32, on: &impl Fn(&str) -> bool) -> bool {
    COMPONENTS
        .iter()
        .find(|(c, _)| *c == i)
        .is_none_or(|(_, feature)| on(feature))
}

/// Restrict leaf 0DH to what `on` (is the feature shown?) allows; everything zero without
/// xsave. Subleaf 0's EBX (the size for the current XCR0) is KVM's to update as the guest
/// sets XCR0; it starts at the legacy size, for XCR0's reset value of 1.
pub fn restrict(entries: &mut [kvm_cpuid_entry2], on: impl Fn(&str) -> bool) {
    let leaf = |e: &&mut kvm_cpuid_entry2| e.function == 0xd;
    if !on("xsave") {
        for e in entries.iter_mut().filter(leaf) {
            (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0);
        }
        return;
    }
    let Some(mask) = entries
        .iter()
        .find(|e| e.function == 0xd && e.index == 0)
        .map(|e| {
            (0..32)
                .filter(|&i| e.eax & 1 << i != 0 && keeps(i, &on))
                .fold(0u32, |m, i| m | 1 << i)
        })
    else {
        return;
    };
    let mut size = LEGACY_AND_HEADER;
    for e in entries.iter_mut().filter(leaf) {
        let component = e.index;
        // Subleaves 2..31 describe user components by their XCR0 bit: size in EAX, offset in
        // EBX. A supervisor one (IA32_XSS, ECX bit 0 set) is KVM's business.
        if (2..32).contains(&component) && e.ecx & 1 == 0 {
            if mask & 1 << component == 0 {
                (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0);
            } else {
                size = size.max(e.eax.saturating_add(e.ebx));
            }
        }
    }
    if let Some(e) = entries
        .iter_mut()
        .find(|e| e.function == 0xd && e.index == 0)
    {
        e.eax &= mask;
        e.ebx = LEGACY_AND_HEADER;
        e.ecx = size;
    }
}
