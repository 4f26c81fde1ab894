/* Port I/O, shared by the probe (64-bit, at CPL 3, where the TSS I/O bitmap allows it) and the
 * test kernel (32-bit, ring 0). */
#pragma once
#include <stdint.h>

static inline void outb(uint16_t port, uint8_t v) { __asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port)); }
static inline void outw(uint16_t port, uint16_t v) { __asm__ volatile("outw %0, %1" : : "a"(v), "Nd"(port)); }
static inline void outl(uint16_t port, uint32_t v) { __asm__ volatile("outl %0, %1" : : "a"(v), "Nd"(port)); }
static inline uint8_t inb(uint16_t port) { uint8_t v; __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port)); return v; }
static inline uint16_t inw(uint16_t port) { uint16_t v; __asm__ volatile("inw %1, %0" : "=a"(v) : "Nd"(port)); return v; }
static inline uint32_t inl(uint16_t port) { uint32_t v; __asm__ volatile("inl %1, %0" : "=a"(v) : "Nd"(port)); return v; }

/* `rep insb`: n bytes of one port in one string instruction (a VMM splits it per byte). The
 * count is register-wide (unsigned long: ECX or RCX), so no stale upper half reaches RCX. */
static inline void insb(uint16_t port, void *buf, unsigned long n)
{
    __asm__ volatile("rep insb" : "+D"(buf), "+c"(n) : "d"(port) : "memory");
}
