/* Shared by entry.S and main.c of the test kernel. */
#pragma once

/* Where the application processors' real-mode start-up code is copied: the start-up IPI's
 * vector is this address's page number (Intel SDM vol. 3 §9.4.4.1). Below the 1 MiB line, in
 * RAM a multiboot loader leaves free (QEMU's and exitless's memory maps both list it). */
#define TRAMPOLINE 0x6000
