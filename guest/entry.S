/* Probe entry, at CPL 0 in 64-bit mode as the VMM leaves it (see src/vm/boot.rs), and the
 * interrupt entry points. %rdi = vCPU index. Ring-0 code is emulated on this host (~1 us per
 * instruction), so the bootstrap processor loads the IDT register and leaves ring 0 at once with
 * iretq; the IDT itself is filled in at CPL 3 by probe.c. Other vCPUs park in hlt. */
#include "contract.h"

    .section .text.entry, "ax"
    .code64
    .global _start
_start:
    test    %rdi, %rdi
    jnz     park
    lidt    idt_descriptor
    pushq   $USER_DS
    pushq   $PROBE_STACK_TOP
    pushq   $0x202              /* RFLAGS: IF, so device interrupts reach the probe at CPL 3 */
    pushq   $USER_CS
    pushq   $user_entry
    iretq
park:
    cli
    hlt
    jmp     park

user_entry:                     /* CPL 3 from here on */
    call    probe_main
1:  jmp     1b                  /* probe_main ends the run through PORT_DONE */

/* One 16-byte stub per vector: IDT entry v points at isr_stubs + 16 * v.
 * - exceptions (0..31) end the run with DONE_EXCEPTION + v, instead of a triple fault;
 * - the virtio-mmio legacy line reads InterruptStatus and writes InterruptACK, as the
 *   virtio spec's handler does (virtio 1.2 §4.2.3.4);
 * - every other vector counts itself in irq_counts[v] (the CPL-3 driver waits on it).
 * Each ends with an EOI to the local APIC: seven ring-0 instructions for an MSI. */
    .text
    .align  16
    .global isr_stubs
isr_stubs:
    .set    vec, 0
    .rept   256
    .org    isr_stubs + 16 * vec    /* the assembler fails if a stub outgrew 16 bytes */
    .if     vec < 32
    movl    $(DONE_EXCEPTION + vec), %eax
    jmp     exception_exit
    .elseif vec == IRQ_VECTOR_LEGACY
    jmp     legacy_irq
    .else
    lock incq irq_counts + 8 * vec
    jmp     irq_exit
    .endif
    .set    vec, vec + 1
    .endr

irq_exit:
    push    %rax
    xor     %eax, %eax
    movabs  %eax, LAPIC_BASE + LAPIC_EOI
    pop     %rax
    iretq

legacy_irq:
    push    %rax
    push    %rcx
    mov     legacy_mmio_base, %rcx
    mov     VIRTIO_MMIO_INTERRUPT_STATUS(%rcx), %eax
    mov     %eax, VIRTIO_MMIO_INTERRUPT_ACK(%rcx)
    lock orl %eax, legacy_status
    lock incq irq_counts + 8 * IRQ_VECTOR_LEGACY
    xor     %eax, %eax
    movabs  %eax, LAPIC_BASE + LAPIC_EOI
    pop     %rcx
    pop     %rax
    iretq

exception_exit:
    mov     $PORT_DONE, %dx
    out     %eax, %dx
1:  hlt
    jmp     1b

    .data
    .align  8
idt_descriptor:
    .word   256 * 16 - 1
    .quad   idt

    .bss
    .align  16
    .global idt, irq_counts, legacy_mmio_base, legacy_status
idt:
    .space  256 * 16
irq_counts:
    .space  256 * 8
legacy_mmio_base:
    .space  8
legacy_status:
    .space  4
