/* Interrupts: the IDT (filled here, at CPL 3), the local APIC and the IOAPIC. The handlers are
 * in entry.S: each counts its vector in irq_counts, where the drivers wait for it. Builds on
 * cpu.h. */

struct idt_gate {
    u16 offset_low, selector;
    u8 ist, type_attr;
    u16 offset_mid;
    u32 offset_high, reserved;
};

extern struct idt_gate idt[256];
extern char isr_stubs[];
extern volatile u64 irq_counts[256];
extern volatile u64 legacy_mmio_base;
extern volatile u32 legacy_status;

static void interrupts_init(void)
{
    for (int v = 0; v < 256; v++) {
        u64 a = (u64)isr_stubs + 16 * (u64)v;
        idt[v].offset_low = (u16)a;
        idt[v].selector = (u16)KERNEL_CS;
        idt[v].ist = 0;
        idt[v].type_attr = 0x8e; /* present, DPL 0, 64-bit interrupt gate (Intel SDM §6.14.1) */
        idt[v].offset_mid = (u16)(a >> 16);
        idt[v].offset_high = (u32)(a >> 32);
        idt[v].reserved = 0;
    }
    /* Mask both 8259 PICs: KVM wires the PIC to the BSP's LINT0 at reset, and an
     * uninitialised PIC would deliver ISA interrupts on exception vectors. */
    outb(0x21, 0xff);
    outb(0xa1, 0xff);
    /* Software-enable the local APIC; spurious interrupts go to vector 0xff. */
    mem_write(LAPIC_BASE + LAPIC_SVR, 4, LAPIC_SVR_ENABLE | 0xff);
}

static void ioapic_write(u32 reg, u32 v)
{
    mem_write(IOAPIC_BASE + IOAPIC_REGSEL, 4, reg);
    mem_write(IOAPIC_BASE + IOAPIC_WINDOW, 4, v);
}

/* Set IOAPIC pin `pin`'s redirection entry to `rte` (masked while the halves change); 0 masks
 * it. */
static void ioapic_set(u64 pin, u64 rte)
{
    u32 reg = (u32)(IOAPIC_REDTBL + 2 * pin);
    ioapic_write(reg, IOAPIC_REDIR_MASKED);
    ioapic_write(reg + 1, (u32)(rte >> 32));
    ioapic_write(reg, rte ? (u32)rte : IOAPIC_REDIR_MASKED);
}
