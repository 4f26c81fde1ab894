/* The probe's CPU primitives, at CPL 3: port I/O (allowed by the TSS I/O bitmap, portio.h),
 * memory-mapped I/O, barriers, the TSC and the boot info the VMM wrote. */
#pragma once
#include "contract.h"

typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;

#include "../portio.h"

#include "../firmware.h"

static inline u64 rdtsc(void)
{
    u32 lo, hi;
    /* lfence keeps the loads being timed from moving across the timestamp. */
    __asm__ volatile("lfence; rdtsc; lfence" : "=a"(lo), "=d"(hi)::"memory");
    return ((u64)hi << 32) | lo;
}

/* Stops the compiler from moving memory accesses across it; the CPU may still reorder. */
static inline void compiler_barrier(void) { __asm__ volatile("" ::: "memory"); }

/* A full fence (Intel SDM vol. 1 §11.4.4.3): every earlier load and store is globally visible
 * before any later one, as a device reading guest memory must see them. */
static inline void mfence(void) { __asm__ volatile("mfence" ::: "memory"); }

static int running_under_hypervisor(void)
{
    u32 eax = 1, ebx, ecx = 0, edx;
    __asm__ volatile("cpuid" : "+a"(eax), "=b"(ebx), "+c"(ecx), "=d"(edx));
    return (ecx >> 31) & 1; /* CPUID.01H:ECX[31], "hypervisor present" */
}

/* Plain memory access of `size` bytes; volatile so every access really happens. */
static u64 mem_read(u64 addr, u64 size)
{
    switch (size) {
    case 1: return *(volatile u8 *)addr;
    case 2: return *(volatile u16 *)addr;
    case 4: return *(volatile u32 *)addr;
    default: return *(volatile u64 *)addr;
    }
}

static void mem_write(u64 addr, u64 size, u64 v)
{
    switch (size) {
    case 1: *(volatile u8 *)addr = (u8)v; break;
    case 2: *(volatile u16 *)addr = (u16)v; break;
    case 4: *(volatile u32 *)addr = (u32)v; break;
    default: *(volatile u64 *)addr = v; break;
    }
}

static void serial_puts(const char *s)
{
    for (; *s; s++)
        outb(PORT_SERIAL, (u8)*s);
}

/* What the VMM wrote before the probe started (or qemu_boot.c, under QEMU). */
static const struct boot_info *boot = (const struct boot_info *)BOOT_INFO_ADDR;

static u64 tsc_timeout(void)
{
    u64 khz = boot->tsc_khz ? boot->tsc_khz : 3000000; /* 3 GHz if unknown */
    return rdtsc() + khz * 1000; /* one second */
}

/* TSC cycles per millisecond: its frequency in kHz, 3 GHz if unknown. */
static u64 tsc_per_ms(void) { return boot->tsc_khz ? boot->tsc_khz : 3000000; }

/* A one-second deadline that the VM's being stopped does not use up: a wait the VMM pauses,
 * snapshots and restores later goes on with the time it had left. The TSC cannot always tell
 * (a host that cannot restore a guest's TSC, docs/snapshot.md, shows the gap as time run), so
 * a gap of more than 100 ms between two looks, which no spinning loop here takes, is counted
 * as the VM stopped, not as waiting. */
struct deadline {
    u64 at, last;
};

static struct deadline deadline_in_a_second(void)
{
    u64 now = rdtsc();
    return (struct deadline){now + tsc_per_ms() * 1000, now};
}

static int deadline_passed(struct deadline *d)
{
    u64 now = rdtsc();
    if (now - d->last > tsc_per_ms() * 100)
        d->at += now - d->last;
    d->last = now;
    return now > d->at;
}

/* Spin for about `us` microseconds. */
static void spin_us(u64 us)
{
    u64 until = rdtsc() + us * (boot->tsc_khz ? boot->tsc_khz : 3000000) / 1000;
    while (rdtsc() < until)
        ;
}
