//! `--cpu`: a CPU template (`host` or `baseline`) and the features added to or taken from it,
//! as Firecracker's CPU templates and Cloud Hypervisor's `--cpus features=` shape a guest's
//! CPUID. Parsed without KVM; what the host can give is checked when the vCPUs are made
//! ([`super::guest`]).

use std::fmt;
use std::str::FromStr;

use super::features::{self, Feature};

/// The feature set a template starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Base {
    /// What KVM supports (`KVM_GET_SUPPORTED_CPUID`) with the hypervisor bit, less xsave and
    /// cx16, which this host's ring-0 emulator lacks (docs/host-kvm.md).
    #[default]
    Host,
    /// [`BASELINE`] and nothing else in the feature leaves: the same guest CPU on any x86-64
    /// host whose KVM supports those.
    Baseline,
}

/// `baseline`'s features: x86-64-v2 (the psABI's level: CMPXCHG16B, LAHF/SAHF in 64-bit
/// mode, POPCNT, SSE3 to SSE4.2) over the x86-64 base, with x2APIC and the hypervisor bit,
/// which KVM emulates on every host. No XSAVE: the guest's FPU state is x87 and SSE only.
pub const BASELINE: &[&str] = &[
    "fpu",
    "vme",
    "de",
    "pse",
    "tsc",
    "msr",
    "pae",
    "mce",
    "cx8",
    "apic",
    "sep",
    "mtrr",
    "pge",
    "mca",
    "cmov",
    "pat",
    "pse36",
    "clflush",
    "mmx",
    "fxsr",
    "sse",
    "sse2",
    "sse3",
    "ssse3",
    "cx16",
    "sse4.1",
    "sse4.2",
    "x2apic",
    "popcnt",
    "hypervisor",
    "lahf-lm",
    "syscall",
    "nx",
    "lm",
];

/// Features `host` hides: this host's KVM emulates ring 0 without `xsave`/`xrstor` and
/// `lock cmpxchg16b` (docs/host-kvm.md). `+xsave,+cx16` give them back.
pub const HOST_HIDDEN: &[&str] = &["cx16", "xsave"];

/// A `--cpu` value: `host|baseline[,+FEATURE|,-FEATURE]...`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuTemplate {
    /// What it starts from.
    pub base: Base,
    /// Features shown (`true`) or hidden (`false`), in the order given; a later one wins.
    pub changes: Vec<(&'static Feature, bool)>,
}

/// A `--cpu` value that cannot be, or a feature the host cannot give. Each message is one line
/// that says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuError {
    /// The first word is neither template.
    #[error("--cpu {0}: the template is `host` or `baseline`, then `,+FEATURE` or `,-FEATURE`")]
    Template(String),
    /// A change without its sign.
    #[error("--cpu: `{0}` needs a + (show) or - (hide) before the feature's name")]
    Sign(String),
    /// A feature name not in the table.
    #[error("--cpu: unknown feature `{0}`; known: {names}", names = features::names())]
    Unknown(String),
    /// A feature shown that KVM cannot give on this host.
    #[error(
        "--cpu: this host's KVM cannot give {0} (it is not in KVM_GET_SUPPORTED_CPUID); drop +{0}, \
         or use the host template, which asks only for what KVM supports"
    )]
    Unavailable(&'static str),
    /// A feature shown while one it needs is hidden.
    #[error("--cpu: +{0} needs {1}, which is hidden: add +{1} or drop +{0}")]
    Needs(&'static str, &'static str),
}

impl FromStr for CpuTemplate {
    type Err = CpuError;

    fn from_str(s: &str) -> Result<Self, CpuError> {
        let mut words = s.split(',');
        let base = match words.next().unwrap_or_default() {
            "host" => Base::Host,
            "baseline" => Base::Baseline,
            other => return Err(CpuError::Template(other.to_owned())),
        };
        let changes = words
            .map(|word| {
                let (show, name) = match word.split_at_checked(1) {
                    Some(("+", name)) => (true, name),
                    Some(("-", name)) => (false, name),
                    _ => return Err(CpuError::Sign(word.to_owned())),
                };
                let feature =
                    features::by_name(name).ok_or_else(|| CpuError::Unknown(name.to_owned()))?;
                Ok((feature, show))
            })
            .collect::<Result<_, _>>()?;
        Ok(CpuTemplate { base, changes })
    }
}

/// The form it was given in, normalised: what a machine's configuration records.
impl fmt::Display for CpuTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.base {
            Base::Host => "host",
            Base::Baseline => "baseline",
        })?;
        for (feature, show) in &self.changes {
            write!(f, ",{}{}", if *show { '+' } else { '-' }, feature.name)?;
        }
        Ok(())
    }
}
