//! One line saying where a vCPU stands, for a run that hung (its timeout, SIGQUIT): enough to
//! tell a guest looping with interrupts off from one whose local APIC holds an interrupt it
//! never ends, or one KVM cannot give an NMI.

use super::VcpuState;

/// The local APIC's In-Service and Interrupt Request registers: eight 32-bit registers each,
/// 16 bytes apart (Intel SDM Vol. 3A §11.8.4, Table 11-1).
const ISR: usize = 0x100;
const IRR: usize = 0x200;
/// The Task Priority Register (Intel SDM Vol. 3A §11.8.3.1).
const TPR: usize = 0x80;
/// The Spurious-Interrupt Vector Register, whose bit 8 enables the APIC (Intel SDM Vol. 3A
/// §11.9).
const SVR: usize = 0xf0;

/// The vectors set in the 256-bit register at `base` of the local APIC page `regs`.
fn vectors(regs: &[std::ffi::c_char], base: usize) -> Vec<u8> {
    (0..=u8::MAX)
        .filter(|&v| {
            let word = base + usize::from(v / 32) * 0x10;
            let bytes: [u8; 4] = std::array::from_fn(|i| regs[word + i] as u8);
            u32::from_le_bytes(bytes) & (1 << (v % 32)) != 0
        })
        .collect()
}

fn hex_list(vectors: &[u8]) -> String {
    match vectors {
        [] => "none".into(),
        _ => vectors
            .iter()
            .map(|v| format!("{v:#04x}"))
            .collect::<Vec<_>>()
            .join(","),
    }
}

impl VcpuState {
    /// Where the vCPU was (RIP, RSP, RFLAGS, CR3), and what KVM held for it to deliver: the
    /// NMI state, an interrupt or exception being injected, the interrupt shadow, the local
    /// APIC's in-service and requested vectors, its TPR and SVR.
    pub fn summary(&self) -> String {
        let events = &self.events;
        let mut line = format!(
            "at RIP {:#x}, RSP {:#x}, RFLAGS {:#x}, CR3 {:#x}, CR2 {:#x}; NMI masked {}, pending {}, injected {}",
            self.regs.rip,
            self.regs.rsp,
            self.regs.rflags,
            self.sregs.cr3,
            self.sregs.cr2,
            events.nmi.masked,
            events.nmi.pending,
            events.nmi.injected,
        );
        if events.interrupt.injected != 0 {
            line += &format!("; interrupt {:#04x} being injected", events.interrupt.nr);
        }
        if events.interrupt.shadow != 0 {
            line += &format!("; interrupt shadow {:#x}", events.interrupt.shadow);
        }
        let exception = &events.exception;
        if exception.injected != 0 || exception.pending != 0 {
            // KVM_GET_VCPU_EVENTS (api.rst): a pending exception is not yet delivered (with
            // KVM_CAP_EXCEPTION_PAYLOAD its payload, a page fault's CR2, not yet written);
            // an injected one is being delivered.
            line += &format!(
                "; exception {} pending or injected ({}, error code {})",
                exception.nr,
                if exception.pending != 0 {
                    "pending"
                } else {
                    "injected"
                },
                if exception.has_error_code != 0 {
                    format!("{:#x}", exception.error_code)
                } else {
                    "none".into()
                },
            );
            if events.exception_has_payload != 0 {
                line += &format!(", payload {:#x}", events.exception_payload);
            }
        }
        let regs = &self.lapic.regs;
        line += &format!(
            "; local APIC in service {}, requested {}, TPR {:#x}, SVR {:#x}",
            hex_list(&vectors(regs, ISR)),
            hex_list(&vectors(regs, IRR)),
            regs[TPR] as u8,
            u16::from_le_bytes([regs[SVR] as u8, regs[SVR + 1] as u8]),
        );
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state all zeros (kvm-bindings' structs are plain data) but for what `edit` sets.
    fn state(edit: impl FnOnce(&mut VcpuState)) -> VcpuState {
        let mut state = VcpuState {
            mp_state: Default::default(),
            regs: Default::default(),
            sregs: Default::default(),
            xsave: None,
            xcrs: None,
            debug_regs: Default::default(),
            lapic: Default::default(),
            tsc_khz: None,
            msrs: Vec::new(),
            events: Default::default(),
        };
        edit(&mut state);
        state
    }

    #[test]
    fn the_summary_names_the_vectors_in_service_and_requested_and_the_nmi_state() {
        let line = state(|s| {
            s.regs.rip = 0xffff_ffff_c04d_520c;
            s.events.nmi.masked = 1;
            // Vector 0xec in service (bit 12 of ISR's eighth word), 0x31 requested.
            s.lapic.regs[ISR + 7 * 0x10 + 1] = 0x10;
            s.lapic.regs[IRR + 0x10 + 2] = 0x02;
            s.lapic.regs[TPR] = 0x20;
        })
        .summary();
        assert!(line.starts_with("at RIP 0xffffffffc04d520c, "), "{line}");
        assert!(line.contains("NMI masked 1, pending 0"), "{line}");
        assert!(
            line.ends_with("in service 0xec, requested 0x31, TPR 0x20, SVR 0x0"),
            "{line}"
        );
    }

    #[test]
    fn an_idle_local_apic_reads_none() {
        let line = state(|_| {}).summary();
        assert!(
            line.ends_with("in service none, requested none, TPR 0x0, SVR 0x0"),
            "{line}"
        );
        assert!(!line.contains("being injected"), "{line}");
    }

    #[test]
    fn a_pending_page_fault_says_its_error_code_and_payload() {
        let line = state(|s| {
            s.sregs.cr2 = 0x1234;
            let e = &mut s.events;
            (e.exception.pending, e.exception.nr) = (1, 14);
            (e.exception.has_error_code, e.exception.error_code) = (1, 0x10);
            (e.exception_has_payload, e.exception_payload) = (1, 0xffff_ffff_c071_320c);
        })
        .summary();
        assert!(line.contains(", CR2 0x1234;"), "{line}");
        assert!(
            line.contains(
                "; exception 14 pending or injected (pending, error code 0x10), payload 0xffffffffc071320c;"
            ),
            "{line}"
        );
    }
}
