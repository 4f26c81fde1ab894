//! x86 interrupt-controller facts that the VMM's MSI routing and the probe guest's handlers both
//! use. The guest's build script puts every constant in its `contract.h`. References: Intel SDM
//! vol. 3A §11 (local APIC, MSI format §11.11), 82093AA IOAPIC datasheet.

contract_consts! {
    IRQ_REGS;
    /// Local APIC MMIO base (the reset value of IA32_APIC_BASE).
    LAPIC_BASE: u64 = 0xfee0_0000;
    /// Local APIC end-of-interrupt register.
    LAPIC_EOI: u64 = 0xb0;
    /// Local APIC spurious-interrupt vector register; bit 8 enables the APIC.
    LAPIC_SVR: u64 = 0xf0;
    /// SVR bit 8: APIC software enable.
    LAPIC_SVR_ENABLE: u32 = 0x100;
    /// IOAPIC MMIO base.
    IOAPIC_BASE: u64 = 0xfec0_0000;
    /// IOAPIC register select (offset).
    IOAPIC_REGSEL: u64 = 0x00;
    /// IOAPIC register window (offset).
    IOAPIC_WINDOW: u64 = 0x10;
    /// IOAPIC EOI register (offset; IOAPICs of version 0x20): writing a vector ends the
    /// level-triggered interrupts of that vector awaiting their EOI.
    IOAPIC_EOI: u64 = 0x40;
    /// First redirection-table register; pin n uses registers 0x10 + 2n (low) and 0x11 + 2n.
    IOAPIC_REDTBL: u32 = 0x10;
    /// Redirection entry bit 15: level-triggered.
    IOAPIC_REDIR_LEVEL: u32 = 0x8000;
    /// Redirection entry bit 16: masked.
    IOAPIC_REDIR_MASKED: u32 = 0x1_0000;
    /// MSI address: bits 31:20 are 0xFEE (Intel SDM §11.11.1).
    MSI_ADDRESS_BASE: u64 = 0xfee0_0000;
    /// MSI address bits that must equal `MSI_ADDRESS_BASE`.
    MSI_ADDRESS_MASK: u64 = 0xfff0_0000;
    /// MSI address bits 19:12: destination APIC ID.
    MSI_ADDRESS_DEST_SHIFT: u32 = 12;
    /// MSI data bits 10:8: delivery mode (Intel SDM vol. 3 §11.11.2).
    MSI_DATA_DELIVERY_MODE_SHIFT: u32 = 8;
    /// Delivery mode: fixed, to the vector in data bits 7:0.
    MSI_DELIVERY_FIXED: u32 = 0;
    /// Delivery mode: lowest priority, to the vector in data bits 7:0.
    MSI_DELIVERY_LOWEST: u32 = 1;
    /// Delivery mode: SMI (the vector field must be 0 and is ignored).
    MSI_DELIVERY_SMI: u32 = 2;
    /// Delivery mode: NMI (the vector field is ignored).
    MSI_DELIVERY_NMI: u32 = 4;
    /// Delivery mode: INIT (the vector field is ignored).
    MSI_DELIVERY_INIT: u32 = 5;
}
