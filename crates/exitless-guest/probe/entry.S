/* Probe entry, at CPL 0 in 64-bit mode as the VMM leaves it (see crates/exitless/src/vm/boot.rs), and the
 * interrupt entry points. %rdi = vCPU index, %rsi = MULTIBOOT_BOOTLOADER_MAGIC when the
 * multiboot entry below came first (QEMU), 0 from exitless. Ring-0 code is emulated on this host
 * (~1 us per instruction), so the bootstrap processor loads the IDT register and leaves ring 0
 * at once with iretq; the IDT itself is filled in at CPL 3 by irq.c. Other vCPUs park in hlt. */
#include "contract.h"
#include "../multiboot.h"

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
    mov     %rsi, %rdi
    call    probe_main          /* probe_main(loader magic) */
1:  jmp     1b                  /* probe_main ends the run through PORT_DONE */

/* The multiboot header, for QEMU's -kernel: in the image's first 8 KiB, after the 64-bit
 * entry exitless jumps to. With its address fields QEMU loads the flat image (probe.bin) at
 * load_addr as it is, where it would otherwise want an ELF32, which the probe is not. .bss is
 * part of the image (probe.ld). */
    MULTIBOOT_HEADER MB_FLAG_ADDRESSES, PROBE_LOAD_ADDR, _image_end, _image_end, multiboot_entry

/* A multiboot loader enters here in 32-bit protected mode, paging off, flat segments, IF
 * clear, EAX = 0x2BADB002 (Multiboot 0.6.96 §3.2). Build what exitless's VMM writes before it
 * enters _start (crates/exitless/src/vm/boot.rs), at the same places (the contract's BOOT_*_ADDR), switch to
 * long mode (Intel SDM vol. 3 §10.8.5) and go the same way. About 4,000 ring-0 instructions and
 * as many rep-string iterations with 1 GiB pages (2 MiB pages add ~12,000): a few ms on this
 * host's emulated ring 0, against SeaBIOS's seconds. PDPT entry 4 and up stay zero with 2 MiB
 * pages: qemu_boot.c looks there to see which map it has. */
#define PTE_TABLE   (PTE_PRESENT | PTE_WRITABLE | PTE_USER)
#define CR0_LONG    0x80010033          /* PG, WP, NE, ET, MP, PE: exitless's CR0 */
#define CR4_PAE     0x20
#define MSR_EFER    0xc0000080
#define EFER_LME    0x100
    .code32
multiboot_entry:
    /* Mask both 8259 PICs first: the BIOS left the timer ticking on IRQ 0, and the IDT is
     * filled only at CPL 3, after interrupts are on (irq.c masks them again there). */
    movb    $0xff, %al
    outb    %al, $0x21
    outb    %al, $0xa1
    cld
    /* The TSS: zeros (every port allowed at CPL 3), RSP0, the I/O map base and the bitmap's
     * terminating all-ones byte (Intel SDM vol. 1 §19.5.2). */
    movl    $BOOT_TSS_ADDR, %edi
    xorl    %eax, %eax
    movl    $((TSS_IOMAP_BASE + TSS_IOMAP_LEN) / 4), %ecx
    rep stosl
    movl    $INTERRUPT_STACK_TOP, BOOT_TSS_ADDR + 4
    movw    $TSS_IOMAP_BASE, BOOT_TSS_ADDR + 0x66
    movb    $0xff, BOOT_TSS_ADDR + TSS_IOMAP_BASE + TSS_IOMAP_LEN
    /* PML4 and PDPT (adjacent pages): zeros, then PML4[0] -> PDPT. */
    .if     BOOT_PDPT_ADDR != BOOT_PML4_ADDR + 0x1000
    .error  "the PML4 and PDPT are zeroed as one block"
    .endif
    movl    $BOOT_PML4_ADDR, %edi
    movl    $2048, %ecx
    rep stosl
    movl    $(BOOT_PDPT_ADDR | PTE_TABLE), BOOT_PML4_ADDR
    movl    $0x80000001, %eax
    cpuid
    btl     $26, %edx           /* CPUID.80000001H:EDX[26]: 1-GByte pages */
    jnc     2f
    /* 0..512 GiB in 1 GiB pages: RAM, ECAM, the APICs and the BARs firmware placed, above
     * 4 GiB too. */
    movl    $BOOT_PDPT_ADDR, %edi
    movl    $(PTE_TABLE | PTE_HUGE), %eax
    xorl    %edx, %edx
1:  movl    %eax, (%edi)
    movl    %edx, 4(%edi)
    addl    $0x40000000, %eax
    adcl    $0, %edx
    addl    $8, %edi
    cmpl    $(BOOT_PDPT_ADDR + 0x1000), %edi
    jne     1b
    jmp     4f
    /* Without them (this project's KVM offers none), exitless's map: 0..4 GiB in 2 MiB pages
     * (2048 entries, a few ms here); qemu_boot.c maps 4..64 GiB at CPL 3, where that is fast. */
2:  movl    $BOOT_PDPT_ADDR, %edi
    movl    $(BOOT_PD_ADDR | PTE_TABLE), %eax
3:  movl    %eax, (%edi)
    addl    $0x1000, %eax
    addl    $8, %edi
    cmpl    $(BOOT_PDPT_ADDR + 8 * BOOT_PD_COUNT), %edi
    jne     3b
    movl    $BOOT_PD_ADDR, %edi
    movl    $(PTE_TABLE | PTE_HUGE), %eax
5:  movl    %eax, (%edi)
    movl    $0, 4(%edi)
    addl    $0x200000, %eax
    addl    $8, %edi
    cmpl    $(BOOT_PD_ADDR + 0x1000 * BOOT_PD_COUNT), %edi
    jne     5b
    /* Long mode: PAE, the page tables, EFER.LME, then paging on. */
4:  movl    %cr4, %eax
    orl     $CR4_PAE, %eax
    movl    %eax, %cr4
    movl    $BOOT_PML4_ADDR, %eax
    movl    %eax, %cr3
    movl    $MSR_EFER, %ecx
    rdmsr
    orl     $EFER_LME, %eax
    wrmsr
    lgdt    mb_gdt_descriptor
    movl    $CR0_LONG, %eax
    movl    %eax, %cr0
    ljmp    $KERNEL_CS, $multiboot_long

    .code64
multiboot_long:
    movl    $KERNEL_DS, %eax
    movl    %eax, %ds
    movl    %eax, %es
    movl    %eax, %fs
    movl    %eax, %gs
    movl    %eax, %ss
    movl    $TSS_SELECTOR, %eax
    ltr     %ax
    movq    $(PROBE_STACK_TOP - 0x1000), %rsp   /* as exitless's vCPU 0 starts */
    xorl    %edi, %edi
    movl    $MULTIBOOT_BOOTLOADER_MAGIC, %esi
    jmp     _start

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

exception_exit:                 /* exitless stops at PORT_DONE, QEMU at its isa-debug-exit */
    mov     $PORT_DONE, %dx
    out     %eax, %dx
    out     %eax, $QEMU_DEBUG_EXIT_PORT
1:  hlt
    jmp     1b

    .data
    .align  8
/* The multiboot entry's GDT: exitless's (crates/exitless/src/vm/boot.rs, whose unit test holds the same
 * encodings), with the TSS available (type 9) for ltr to mark busy. */
mb_gdt:
    .quad   0
    .org    mb_gdt + KERNEL_CS
    .quad   0x00af9b000000ffff      /* 64-bit code, DPL 0 */
    .org    mb_gdt + KERNEL_DS
    .quad   0x00cf93000000ffff      /* data, DPL 0 */
    .org    mb_gdt + (USER_CS & ~3)
    .quad   0x00affb000000ffff      /* 64-bit code, DPL 3 */
    .org    mb_gdt + (USER_DS & ~3)
    .quad   0x00cff3000000ffff      /* data, DPL 3 */
    .org    mb_gdt + TSS_SELECTOR
    .quad   0x0000890000000000 | (BOOT_TSS_ADDR << 16) | (TSS_IOMAP_BASE + TSS_IOMAP_LEN)
    .quad   0                       /* the 16-byte system descriptor's high half */
mb_gdt_end:
mb_gdt_descriptor:
    .word   mb_gdt_end - mb_gdt - 1
    .long   mb_gdt
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
