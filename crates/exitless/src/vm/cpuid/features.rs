//! The CPU features `--cpu` names: where each lives in CPUID (Intel SDM vol. 2A, CPUID,
//! tables 3-8 to 3-10 for leaf 1, table 3-8's leaf 07H and leaf 0DH entries, and
//! 8000_0001H). Names are QEMU's (`-cpu host,-xsave`), which mostly match Linux's
//! /proc/cpuinfo with `-` for `_`. OSXSAVE and OSPKE are left out: they mirror CR4, which the
//! guest sets, and KVM computes them.

use kvm_bindings::kvm_cpuid_entry2;

/// A CPUID output register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reg {
    /// EAX.
    Eax,
    /// EBX.
    Ebx,
    /// ECX.
    Ecx,
    /// EDX.
    Edx,
}

impl Reg {
    /// This register of `entry`.
    pub fn of(self, entry: &mut kvm_cpuid_entry2) -> &mut u32 {
        match self {
            Reg::Eax => &mut entry.eax,
            Reg::Ebx => &mut entry.ebx,
            Reg::Ecx => &mut entry.ecx,
            Reg::Edx => &mut entry.edx,
        }
    }
}

/// One feature flag: CPUID leaf `leaf`, subleaf `index`, register `reg`, bit `bit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Feature {
    /// Its name on the command line.
    pub name: &'static str,
    /// The leaf (EAX input).
    pub leaf: u32,
    /// The subleaf (ECX input); 0 for leaves without.
    pub index: u32,
    /// The output register.
    pub reg: Reg,
    /// The bit in it.
    pub bit: u8,
}

impl Feature {
    /// Whether `entries` (a CPUID table) show it; not when its leaf is missing.
    pub fn shown_in(&self, entries: &[kvm_cpuid_entry2]) -> bool {
        entries
            .iter()
            .filter(|e| e.function == self.leaf && e.index == self.index)
            .any(|e| *self.reg.of(&mut e.clone()) & 1 << self.bit != 0)
    }
}

const fn f(name: &'static str, leaf: u32, index: u32, reg: Reg, bit: u8) -> Feature {
    Feature {
        name,
        leaf,
        index,
        reg,
        bit,
    }
}

use Reg::{Eax, Ebx, Ecx, Edx};

/// Every feature `--cpu` knows, in leaf order.
pub const FEATURES: &[Feature] = &[
    // CPUID.01H:EDX (table 3-11).
    f("fpu", 1, 0, Edx, 0),
    f("vme", 1, 0, Edx, 1),
    f("de", 1, 0, Edx, 2),
    f("pse", 1, 0, Edx, 3),
    f("tsc", 1, 0, Edx, 4),
    f("msr", 1, 0, Edx, 5),
    f("pae", 1, 0, Edx, 6),
    f("mce", 1, 0, Edx, 7),
    f("cx8", 1, 0, Edx, 8),
    f("apic", 1, 0, Edx, 9),
    f("sep", 1, 0, Edx, 11),
    f("mtrr", 1, 0, Edx, 12),
    f("pge", 1, 0, Edx, 13),
    f("mca", 1, 0, Edx, 14),
    f("cmov", 1, 0, Edx, 15),
    f("pat", 1, 0, Edx, 16),
    f("pse36", 1, 0, Edx, 17),
    f("clflush", 1, 0, Edx, 19),
    f("ds", 1, 0, Edx, 21),
    f("acpi", 1, 0, Edx, 22),
    f("mmx", 1, 0, Edx, 23),
    f("fxsr", 1, 0, Edx, 24),
    f("sse", 1, 0, Edx, 25),
    f("sse2", 1, 0, Edx, 26),
    f("ss", 1, 0, Edx, 27),
    f("ht", 1, 0, Edx, 28),
    // CPUID.01H:ECX (table 3-10).
    f("sse3", 1, 0, Ecx, 0),
    f("pclmulqdq", 1, 0, Ecx, 1),
    f("monitor", 1, 0, Ecx, 3),
    f("vmx", 1, 0, Ecx, 5),
    f("ssse3", 1, 0, Ecx, 9),
    f("fma", 1, 0, Ecx, 12),
    f("cx16", 1, 0, Ecx, 13),
    f("pdcm", 1, 0, Ecx, 15),
    f("pcid", 1, 0, Ecx, 17),
    f("sse4.1", 1, 0, Ecx, 19),
    f("sse4.2", 1, 0, Ecx, 20),
    f("x2apic", 1, 0, Ecx, 21),
    f("movbe", 1, 0, Ecx, 22),
    f("popcnt", 1, 0, Ecx, 23),
    f("tsc-deadline", 1, 0, Ecx, 24),
    f("aes", 1, 0, Ecx, 25),
    f("xsave", 1, 0, Ecx, 26),
    f("avx", 1, 0, Ecx, 28),
    f("f16c", 1, 0, Ecx, 29),
    f("rdrand", 1, 0, Ecx, 30),
    f("hypervisor", 1, 0, Ecx, 31),
    // CPUID.(EAX=07H,ECX=0):EBX.
    f("fsgsbase", 7, 0, Ebx, 0),
    f("tsc-adjust", 7, 0, Ebx, 1),
    f("bmi1", 7, 0, Ebx, 3),
    f("hle", 7, 0, Ebx, 4),
    f("avx2", 7, 0, Ebx, 5),
    f("smep", 7, 0, Ebx, 7),
    f("bmi2", 7, 0, Ebx, 8),
    f("erms", 7, 0, Ebx, 9),
    f("invpcid", 7, 0, Ebx, 10),
    f("rtm", 7, 0, Ebx, 11),
    f("mpx", 7, 0, Ebx, 14),
    f("avx512f", 7, 0, Ebx, 16),
    f("avx512dq", 7, 0, Ebx, 17),
    f("rdseed", 7, 0, Ebx, 18),
    f("adx", 7, 0, Ebx, 19),
    f("smap", 7, 0, Ebx, 20),
    f("avx512ifma", 7, 0, Ebx, 21),
    f("clflushopt", 7, 0, Ebx, 23),
    f("clwb", 7, 0, Ebx, 24),
    f("intel-pt", 7, 0, Ebx, 25),
    f("avx512cd", 7, 0, Ebx, 28),
    f("sha-ni", 7, 0, Ebx, 29),
    f("avx512bw", 7, 0, Ebx, 30),
    f("avx512vl", 7, 0, Ebx, 31),
    // CPUID.(EAX=07H,ECX=0):ECX.
    f("avx512vbmi", 7, 0, Ecx, 1),
    f("umip", 7, 0, Ecx, 2),
    f("pku", 7, 0, Ecx, 3),
    f("waitpkg", 7, 0, Ecx, 5),
    f("avx512vbmi2", 7, 0, Ecx, 6),
    f("gfni", 7, 0, Ecx, 8),
    f("vaes", 7, 0, Ecx, 9),
    f("vpclmulqdq", 7, 0, Ecx, 10),
    f("avx512vnni", 7, 0, Ecx, 11),
    f("avx512bitalg", 7, 0, Ecx, 12),
    f("avx512-vpopcntdq", 7, 0, Ecx, 14),
    f("la57", 7, 0, Ecx, 16),
    f("rdpid", 7, 0, Ecx, 22),
    f("cldemote", 7, 0, Ecx, 25),
    f("movdiri", 7, 0, Ecx, 27),
    f("movdir64b", 7, 0, Ecx, 28),
    // CPUID.(EAX=07H,ECX=0):EDX.
    f("fsrm", 7, 0, Edx, 4),
    f("md-clear", 7, 0, Edx, 10),
    f("serialize", 7, 0, Edx, 14),
    f("tsx-ldtrk", 7, 0, Edx, 16),
    f("amx-bf16", 7, 0, Edx, 22),
    f("avx512-fp16", 7, 0, Edx, 23),
    f("amx-tile", 7, 0, Edx, 24),
    f("amx-int8", 7, 0, Edx, 25),
    f("spec-ctrl", 7, 0, Edx, 26),
    f("stibp", 7, 0, Edx, 27),
    f("flush-l1d", 7, 0, Edx, 28),
    f("arch-capabilities", 7, 0, Edx, 29),
    f("core-capability", 7, 0, Edx, 30),
    f("ssbd", 7, 0, Edx, 31),
    // CPUID.(EAX=0DH,ECX=1):EAX.
    f("xsaveopt", 0xd, 1, Eax, 0),
    f("xsavec", 0xd, 1, Eax, 1),
    f("xgetbv1", 0xd, 1, Eax, 2),
    f("xsaves", 0xd, 1, Eax, 3),
    // CPUID.80000001H:ECX and EDX.
    f("lahf-lm", 0x8000_0001, 0, Ecx, 0),
    f("abm", 0x8000_0001, 0, Ecx, 5),
    f("3dnowprefetch", 0x8000_0001, 0, Ecx, 8),
    f("syscall", 0x8000_0001, 0, Edx, 11),
    f("nx", 0x8000_0001, 0, Edx, 20),
    f("pdpe1gb", 0x8000_0001, 0, Edx, 26),
    f("rdtscp", 0x8000_0001, 0, Edx, 27),
    f("lm", 0x8000_0001, 0, Edx, 29),
];

/// Features that need another: with the second hidden, the first is too (SDM vol. 1 §13.2:
/// AVX and later state is managed by XSAVE; §14.3: AVX2/FMA/F16C and VEX encodings need AVX;
/// §15.2: AVX-512 needs AVX2's checks; AMX's tile state is an XSAVE component).
pub const NEEDS: &[(&str, &str)] = &[
    ("avx", "xsave"),
    ("xsaveopt", "xsave"),
    ("xsavec", "xsave"),
    ("xgetbv1", "xsave"),
    ("xsaves", "xsave"),
    ("mpx", "xsave"),
    ("pku", "xsave"),
    ("amx-tile", "xsave"),
    ("amx-bf16", "amx-tile"),
    ("amx-int8", "amx-tile"),
    ("fma", "avx"),
    ("f16c", "avx"),
    ("avx2", "avx"),
    ("vaes", "avx"),
    ("vpclmulqdq", "avx"),
    ("avx512f", "avx2"),
    ("avx512dq", "avx512f"),
    ("avx512ifma", "avx512f"),
    ("avx512cd", "avx512f"),
    ("avx512bw", "avx512f"),
    ("avx512vl", "avx512f"),
    ("avx512vbmi", "avx512f"),
    ("avx512vbmi2", "avx512f"),
    ("avx512vnni", "avx512f"),
    ("avx512bitalg", "avx512f"),
    ("avx512-vpopcntdq", "avx512f"),
    ("avx512-fp16", "avx512f"),
];

/// The feature named `name`, if `--cpu` knows it.
pub fn by_name(name: &str) -> Option<&'static Feature> {
    FEATURES.iter().find(|f| f.name == name)
}

/// Every name, space-separated, for an error message.
pub fn names() -> String {
    FEATURES
        .iter()
        .map(|f| f.name)
        .collect::<Vec<_>>()
        .join(" ")
}
