/* The multiboot v1 header (Multiboot 0.6.96 §3.1), for assembly: the test kernel and the
 * probe each carry one, for QEMU's -kernel (and exitless run's). */
#pragma once

#define MB_HEADER_MAGIC     0x1badb002
#define MB_FLAG_MEMORY_INFO 0x00000002      /* bit 1: the loader passes the memory map */
#define MB_FLAG_ADDRESSES   0x00010000      /* bit 16: the address fields are valid */

/* The header, 4-byte aligned. With MB_FLAG_ADDRESSES the loader takes the image as flat bytes
 * (no ELF needed): header_addr (this header, filled in here), load_addr, load_end_addr,
 * bss_end_addr and entry_addr follow; without it they are left out. */
.macro MULTIBOOT_HEADER flags:req, load_addr=0, load_end_addr=0, bss_end_addr=0, entry_addr=0
    .align  4
.Lmultiboot_header\@:
    .long   MB_HEADER_MAGIC
    .long   \flags
    .long   -(MB_HEADER_MAGIC + (\flags))
    .if     (\flags) & MB_FLAG_ADDRESSES
    .long   .Lmultiboot_header\@, \load_addr, \load_end_addr, \bss_end_addr, \entry_addr
    .endif
.endm
