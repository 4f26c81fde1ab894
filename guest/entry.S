/* Probe entry, at CPL 0 in 64-bit mode as the VMM leaves it (see src/vm/boot.rs).
 * %rdi = vCPU index. Ring-0 code is emulated on this host (~1 us per instruction), so the
 * bootstrap processor leaves ring 0 at once with iretq; other vCPUs park in hlt. */
#include "contract.h"

    .section .text.entry, "ax"
    .code64
    .global _start
_start:
    test    %rdi, %rdi
    jnz     park
    pushq   $USER_DS
    pushq   $PROBE_STACK_TOP
    pushq   $0x2                /* RFLAGS: reserved bit 1 only, interrupts off */
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
