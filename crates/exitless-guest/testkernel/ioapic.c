/* Interrupts through the IOAPIC (ioapic=1): the RTC's periodic interrupt on IRQ 8, which the
 * MADT puts on IOAPIC pin 8, programmed edge- then level-triggered in compatibility format
 * (82093AA datasheet §3.2.4); a level-triggered interrupt comes again only after the EOI of the
 * one before cleared its remote IRR. Then the PIT's channel 0 on pin 2 (IRQ 0's override). With ioapic=remap (a machine with a VT-d unit whose DMAR
 * sets INTR_REMAP), the unit's interrupt remapping is then turned on and pin 8 programmed in
 * remappable format (VT-d 3.x §5.1.5.1) through an IRTE (§9.10) whose vector differs from the
 * RTE's: interrupts on the IRTE's vector show the entry was used. Each wait is short (an RTC
 * rate of 32 Hz) and ends on the PM timer, so a lost interrupt fails a check, not the run. */
#include "testkernel.h"

#define IOAPIC_BASE     0xfec00000u
#define IOAPIC_REGSEL   0x00
#define IOAPIC_WINDOW   0x10
#define RTE_LEVEL       (1u << 15)
#define RTE_MASKED      (1u << 16)
#define RTE_REMOTE_IRR  (1u << 14)
#define RTE_REMAPPABLE  (1u << 16)      /* in the high half: bit 48 */
#define LAPIC_BASE      0xfee00000u
#define LAPIC_SVR       0xf0
#define RTC_PIN         8
#define PIT_PIN         2               /* IRQ 0, as the MADT's override puts it */
#define PIT_CHANNEL0    0x40
#define PIT_CONTROL     0x43
#define PIT_1MS         1193            /* 1.193182 MHz / 1000 */
#define REG_A_32HZ      0x2b            /* the 32.768 kHz divider, rate 11: 32 Hz */
#define REG_B_PIE       0x40
#define FIRST_VECTOR    0x40            /* vectors 0x40..0x43 count their interrupts */
#define VECTORS         4
#define WANTED          3               /* interrupts each check waits for */
/* The VT-d unit's registers (VT-d 3.x §10.4) and an IRTE's fields (§9.10). */
#define VTD_GCMD        0x18
#define VTD_GSTS        0x1c
#define VTD_IRTA        0xb8
#define GCMD_IRE        (1u << 25)
#define GCMD_SIRTP      (1u << 24)
#define IRTE_PRESENT    1u
#define IRTE_LEVEL      (1u << 4)
#define IRTE_SVT_SID    (1u << 18)      /* verify the requester's source-id, all 16 bits */
#define IRT_INDEX       5

volatile uint32_t irq_counts[VECTORS];

/* One handler per counted vector: count, EOI at the local APIC, return. Every other vector
 * gets only the return (none is expected). KVM's instruction emulator, which runs this ring-0
 * code here (docs/host-kvm.md), cannot do a protected-mode iret, so the return is the flags
 * restored with IF clear, sti, and a far return that drops the saved flags: sti's one-
 * instruction shadow keeps the next interrupt until the return is done. */
#define RETURN "pushl 8(%esp)\nandl $0xfffffdff, (%esp)\npopfl\nsti\nlret $4\n"
#define HANDLER(n)                                                                      \
    __asm__(".text\n.global irq_handler" #n "\nirq_handler" #n ":\n"                    \
            "lock incl irq_counts + 4 * " #n "\n"                                       \
            "movl $0, 0xfee000b0\n" RETURN);                                            \
    extern void irq_handler##n(void);
HANDLER(0)
HANDLER(1)
HANDLER(2)
HANDLER(3)
__asm__(".text\nirq_ignored:\n" RETURN);
extern void irq_ignored(void);

static uint64_t idt[256];
static uint32_t irt[2 * 256 * 2] __attribute__((aligned(4096))); /* 256 entries of 16 bytes */

/* A flat GDT of our own: an interrupt reloads CS from the GDT, and the one the loader left
 * may be gone (Multiboot 0.6.96 §3.2: "the OS image must create its own"). */
static const uint64_t gdt[3] = {0, 0x00cf9a000000ffffull, 0x00cf92000000ffffull};
#define CODE_SELECTOR 0x08
#define DATA_SELECTOR 0x10

static void load_gdt(void)
{
    struct __attribute__((packed)) { uint16_t limit; uint32_t base; } d = {
        sizeof(gdt) - 1, (uint32_t)gdt};
    __asm__ volatile("lgdt %0\n"
                     "ljmp %1, $1f\n"
                     "1: movw %w2, %%ax\n"
                     "movw %%ax, %%ds\nmovw %%ax, %%es\nmovw %%ax, %%ss\n"
                     : : "m"(d), "i"(CODE_SELECTOR), "i"(DATA_SELECTOR) : "eax", "memory");
}

static uint64_t gate(void (*handler)(void))
{
    uint32_t at = (uint32_t)handler;
    /* A 32-bit interrupt gate, present, DPL 0 (SDM vol. 3A §6.11). */
    return (uint64_t)(at & 0xffff) | (uint64_t)CODE_SELECTOR << 16 | (uint64_t)0x8e00 << 32 |
           (uint64_t)(at >> 16) << 48;
}

static void load_idt(void)
{
    load_gdt();
    void (*const handlers[VECTORS])(void) = {irq_handler0, irq_handler1, irq_handler2,
                                             irq_handler3};
    for (uint32_t v = 0; v < 256; v++)
        idt[v] = gate(v >= FIRST_VECTOR && v < FIRST_VECTOR + VECTORS
                          ? handlers[v - FIRST_VECTOR] : irq_ignored);
    struct __attribute__((packed)) { uint16_t limit; uint32_t base; } d = {
        sizeof(idt) - 1, (uint32_t)idt};
    __asm__ volatile("lidt %0" : : "m"(d));
}

static uint32_t ioapic_read(uint32_t reg)
{
    mmio_write32(IOAPIC_BASE + IOAPIC_REGSEL, reg);
    return mmio32(IOAPIC_BASE + IOAPIC_WINDOW);
}

static void ioapic_write(uint32_t reg, uint32_t value)
{
    mmio_write32(IOAPIC_BASE + IOAPIC_REGSEL, reg);
    mmio_write32(IOAPIC_BASE + IOAPIC_WINDOW, value);
}

static void set_rte(uint32_t pin, uint32_t low, uint32_t high)
{
    ioapic_write(0x10 + 2 * pin, RTE_MASKED);
    ioapic_write(0x11 + 2 * pin, high);
    ioapic_write(0x10 + 2 * pin, low);
}

static void set_rtc_rte(uint32_t low, uint32_t high)
{
    set_rte(RTC_PIN, low, high);
}

/* The PIT's channel 0 as a 1 kHz rate generator (8254 mode 2) on pin 2, edge-triggered: the
 * interrupts counted on `vector` within a quarter second, halting between them (a guest that
 * waits for the tick sleeps until it comes). */
static uint32_t count_pit_irqs(uint32_t vector)
{
    irq_counts[vector - FIRST_VECTOR] = 0;
    outb(PIT_CONTROL, 0x34);            /* channel 0, LSB then MSB, mode 2 */
    outb(PIT_CHANNEL0, PIT_1MS & 0xff);
    outb(PIT_CHANNEL0, PIT_1MS >> 8);
    set_rte(PIT_PIN, vector, 0);
    uint32_t start = pm_timer();
    while (irq_counts[vector - FIRST_VECTOR] < WANTED &&
           ((pm_timer() - start) & pm_timer_mask) < PM_TIMER_HZ / 4)
        __asm__ volatile("sti; hlt; cli");
    set_rte(PIT_PIN, RTE_MASKED, 0);
    outb(PIT_CONTROL, 0x30);            /* mode 0 with no count: OUT low, no more edges */
    return irq_counts[vector - FIRST_VECTOR];
}

/* Interrupts counted on `vector` within a quarter second of RTC periodic interrupts (each
 * acknowledged by reading register C, so the RTC raises the next). */
static uint32_t count_irqs(uint32_t vector)
{
    for (uint32_t v = 0; v < VECTORS; v++)
        irq_counts[v] = 0;
    rtc_get(0x0c);
    __asm__ volatile("sti");
    uint32_t start = pm_timer();
    while (irq_counts[vector - FIRST_VECTOR] < WANTED &&
           ((pm_timer() - start) & pm_timer_mask) < PM_TIMER_HZ / 4)
        rtc_get(0x0c);
    __asm__ volatile("cli");
    return irq_counts[vector - FIRST_VECTOR];
}

/* Fill entry IRT_INDEX (`vector`, level-triggered, to APIC 0, for the IOAPIC's source-id from
 * the DMAR scope) and turn on the unit's interrupt remapping with `irt` as its table. */
static int remap_on(uint32_t unit, uint32_t vector, uint16_t ioapic_sid)
{
    uint32_t *e = irt + 4 * IRT_INDEX;
    e[0] = IRTE_PRESENT | IRTE_LEVEL | vector << 16;
    e[1] = 0;                   /* destination APIC 0 (xAPIC: bits 15:8) */
    e[2] = ioapic_sid | IRTE_SVT_SID;
    e[3] = 0;
    mmio_write32(unit + VTD_IRTA, (uint32_t)irt | 7); /* 2^(7+1) = 256 entries */
    mmio_write32(unit + VTD_IRTA + 4, 0);
    mmio_write32(unit + VTD_GCMD, GCMD_SIRTP);
    uint32_t status = mmio32(unit + VTD_GSTS);
    mmio_write32(unit + VTD_GCMD, (status & ~GCMD_SIRTP) | GCMD_IRE);
    return (mmio32(unit + VTD_GSTS) & GCMD_IRE) != 0;
}

void check_ioapic(int remap)
{
    load_idt();
    mmio_write32(LAPIC_BASE + LAPIC_SVR, mmio32(LAPIC_BASE + LAPIC_SVR) | 0x1ff);
    uint8_t a = rtc_get(0x0a), b = rtc_get(0x0b);
    rtc_set(0x0a, REG_A_32HZ);
    rtc_set(0x0b, b | REG_B_PIE);

    set_rtc_rte(FIRST_VECTOR, 0);
    uint32_t edge = count_irqs(FIRST_VECTOR);
    check(edge >= WANTED, "ioapic: %u edge-triggered RTC interrupts on pin 8, vector %x", edge,
          FIRST_VECTOR);
    set_rtc_rte(RTE_LEVEL | (FIRST_VECTOR + 1), 0);
    uint32_t level = count_irqs(FIRST_VECTOR + 1);
    check(level >= WANTED && !(ioapic_read(0x10 + 2 * RTC_PIN) & RTE_REMOTE_IRR),
          "ioapic: %u level-triggered RTC interrupts, each EOI clearing remote IRR", level);

    set_rtc_rte(RTE_MASKED, 0);
    uint32_t ticks = count_pit_irqs(FIRST_VECTOR);
    check(ticks >= WANTED, "ioapic: %u PIT channel 0 interrupts on pin 2, each awaited in hlt",
          ticks);

    if (remap) {
        uint32_t unit = 0;
        uint16_t sid = 0;
        /* Masked first: a compatibility-format entry the unit would block (CFI clear). */
        set_rtc_rte(RTE_MASKED, 0);
        int ok = dmar_ioapic_scope(&unit, &sid) && remap_on(unit, FIRST_VECTOR + 3, sid);
        /* Remappable format: index in bits 63:49 (and 11), format bit 48; the RTE's vector is
         * what its EOI names (the IRTE's, §5.1.5.1). */
        set_rtc_rte(RTE_LEVEL | (FIRST_VECTOR + 3), IRT_INDEX << 17 | RTE_REMAPPABLE);
        uint32_t remapped = ok ? count_irqs(FIRST_VECTOR + 3) : 0;
        check(ok && remapped >= WANTED,
              "ioapic: %u level-triggered interrupts through IRTE %u (remappable RTE, source-id %x)",
              remapped, IRT_INDEX, sid);
        /* Another entry (not cached yet: changing one would need an invalidation), edge,
         * whose vector differs from the RTE's: what arrives is the IRTE's. */
        irt[4 * (IRT_INDEX + 1)] = IRTE_PRESENT | (FIRST_VECTOR + 2) << 16;
        irt[4 * (IRT_INDEX + 1) + 2] = sid | IRTE_SVT_SID;
        set_rtc_rte(FIRST_VECTOR + 3, (IRT_INDEX + 1) << 17 | RTE_REMAPPABLE);
        uint32_t moved = ok ? count_irqs(FIRST_VECTOR + 2) : 0;
        check(moved >= WANTED && irq_counts[3] == 0,
              "ioapic: %u edge-triggered interrupts on the IRTE's vector %x, none on the RTE's",
              moved, FIRST_VECTOR + 2);
    }
    set_rtc_rte(RTE_MASKED, 0);
    rtc_set(0x0b, b);
    rtc_set(0x0a, a);
    rtc_get(0x0c);
}
