//! The CPUID every vCPU of a machine reports, made from what KVM supports and a
//! [`CpuTemplate`]: feature bits first, then what follows from them (features that need
//! another, OSXSAVE, leaf 0DH's state components).

use kvm_bindings::{CpuId, kvm_cpuid_entry2};

use super::features::{FEATURES, Feature, NEEDS};
use super::template::{BASELINE, Base, CpuError, CpuTemplate, HOST_HIDDEN};
use super::xsave;

/// Which of [`FEATURES`] the guest sees, by index.
type Shown = Vec<bool>;

/// Whether KVM can give `feature`: its bit in `KVM_GET_SUPPORTED_CPUID`. The hypervisor bit is
/// the VMM's to set (SDM vol. 2A table 3-10: reserved for hypervisors), so always.
fn available(entries: &[kvm_cpuid_entry2], feature: &Feature) -> bool {
    feature.name == "hypervisor" || feature.shown_in(entries)
}

fn index_of(name: &str) -> usize {
    FEATURES
        .iter()
        .position(|f| f.name == name)
        .expect("names in the template tables are in FEATURES")
}

/// The template's features before its changes.
fn base_set(entries: &[kvm_cpuid_entry2], base: Base) -> Result<Shown, CpuError> {
    let mut shown: Shown = FEATURES.iter().map(|f| available(entries, f)).collect();
    match base {
        Base::Host => {
            shown[index_of("hypervisor")] = true;
            HOST_HIDDEN.iter().for_each(|n| shown[index_of(n)] = false);
        }
        Base::Baseline => {
            let mut only = vec![false; FEATURES.len()];
            for name in BASELINE {
                let i = index_of(name);
                if !shown[i] {
                    return Err(CpuError::Unavailable(FEATURES[i].name));
                }
                only[i] = true;
            }
            shown = only;
        }
    }
    Ok(shown)
}

/// Apply `template` to the feature set: each change, then hide whatever needs a hidden
/// feature, refusing a shown one that does.
fn feature_set(entries: &[kvm_cpuid_entry2], template: &CpuTemplate) -> Result<Shown, CpuError> {
    let mut shown = base_set(entries, template.base)?;
    for &(feature, show) in &template.changes {
        if show && !available(entries, feature) {
            return Err(CpuError::Unavailable(feature.name));
        }
        shown[index_of(feature.name)] = show;
    }
    let asked = |name: &str| template.changes.iter().any(|(f, s)| *s && f.name == name);
    // NEEDS lists each feature after the ones it needs, so one pass settles chains.
    for &(feature, needs) in NEEDS {
        let (i, j) = (index_of(feature), index_of(needs));
        if shown[i] && !shown[j] {
            if asked(feature) {
                return Err(CpuError::Needs(FEATURES[i].name, FEATURES[j].name));
            }
            shown[i] = false;
        }
    }
    Ok(shown)
}

/// Feature registers `baseline` empties before setting its own bits: leaf 1 ECX/EDX, leaf 7
/// (every subleaf), leaf 0DH subleaf 1 EAX, 8000_0001H ECX/EDX. Bits no name covers stay
/// off there, so the guest sees nothing of the host's beyond the list.
fn clear_feature_leaves(entries: &mut [kvm_cpuid_entry2]) {
    for e in entries {
        match (e.function, e.index) {
            (1, _) | (0x8000_0001, _) => (e.ecx, e.edx) = (0, 0),
            (7, _) => (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0),
            (0xd, 1) => e.eax = 0,
            _ => {}
        }
    }
}

/// CPUID.01H:ECX.OSXSAVE[bit 27] (table 3-10): mirrors CR4.OSXSAVE, which a guest without
/// XSAVE can never set.
const ECX_OSXSAVE: u32 = 1 << 27;

/// The CPUID every vCPU of the machine reports (the per-vCPU APIC IDs come after, in
/// [`super::for_vcpu`]), from `supported` (`KVM_GET_SUPPORTED_CPUID`) and `template`.
pub fn guest(supported: &CpuId, template: &CpuTemplate) -> Result<CpuId, CpuError> {
    let mut entries = supported.as_slice().to_vec();
    let shown = feature_set(&entries, template)?;
    if template.base == Base::Baseline {
        clear_feature_leaves(&mut entries);
    }
    for (feature, &on) in FEATURES.iter().zip(&shown) {
        for e in entries
            .iter_mut()
            .filter(|e| e.function == feature.leaf && e.index == feature.index)
        {
            let r = feature.reg.of(e);
            *r = if on {
                *r | 1 << feature.bit
            } else {
                *r & !(1 << feature.bit)
            };
        }
    }
    let on = |name: &str| shown[index_of(name)];
    if !on("xsave") {
        entries
            .iter_mut()
            .filter(|e| e.function == 1)
            .for_each(|e| e.ecx &= !ECX_OSXSAVE);
    }
    xsave::restrict(&mut entries, on);
    Ok(CpuId::from_entries(&entries).expect("no more entries than KVM gave"))
}
