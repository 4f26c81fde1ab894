/* The test kernel's multiboot header, its 32-bit entry, and the application processors'
 * start-up code. A multiboot loader enters _start in 32-bit protected mode, paging off, flat
 * segments, EAX = 0x2BADB002 and EBX = the multiboot information (Multiboot 0.6.96 §3.2); the
 * stack and the GDT are ours to set up. */
#include "testkernel.h"
#include "../multiboot.h"

#ifdef AOUT_KLUDGE
/* For the flat image (objcopy -O binary): the header is at its first byte. */
#define MB_FLAGS        (MB_FLAG_MEMORY_INFO | MB_FLAG_ADDRESSES)
#else
#define MB_FLAGS        MB_FLAG_MEMORY_INFO
#endif

    .section .multiboot, "a"
    MULTIBOOT_HEADER MB_FLAGS, _image_start, _edata, _end, _start

    .text
    .code32
    .global _start
_start:
    movl    $stack_top, %esp
    pushl   %ebx
    pushl   %eax
    call    kmain           /* kmain(magic, info) never returns */
1:  cli
    hlt
    jmp     1b

/* Application processors: after INIT and a start-up IPI they run this, copied to TRAMPOLINE,
 * in real mode at TRAMPOLINE >> 4 : 0. It loads a flat GDT, enters protected mode, counts
 * itself in ap_count and halts. */
    .code16
    .global ap_trampoline, ap_trampoline_end
ap_trampoline:
    cli
    movw    %cs, %ax
    movw    %ax, %ds
    lgdtl   ap_gdt_descriptor - ap_trampoline
    movl    %cr0, %eax
    orl     $1, %eax
    movl    %eax, %cr0
    ljmpl   $0x08, $ap_protected
    .align  8
ap_gdt:
    .quad   0
    .quad   0x00cf9a000000ffff      /* 0x08: flat 32-bit code */
    .quad   0x00cf92000000ffff      /* 0x10: flat 32-bit data */
ap_gdt_descriptor:
    .word   3 * 8 - 1
    .long   TRAMPOLINE + (ap_gdt - ap_trampoline)
ap_trampoline_end:

    .code32
ap_protected:
    movw    $0x10, %ax
    movw    %ax, %ds
    movw    %ax, %es
    movw    %ax, %ss
    lock incl ap_count
1:  cli
    hlt
    jmp     1b

    .section .note.GNU-stack, "", @progbits     /* no executable stack */

    .bss
    .align  16
stack:
    .skip   16384
stack_top:
