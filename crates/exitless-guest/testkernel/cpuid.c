/* cpuid=1: the CPUID the kernel sees, executed here at ring 0 (what an OS reads), printed as
 * `cpuid LEAF.SUBLEAF eax=... ebx=... ecx=... edx=...` for the feature leaves the VMM's
 * `--cpu` shapes (Intel SDM vol. 2A, CPUID: leaf 01H, 07H, 0DH, 8000_0001H), and the checks
 * that follow from the architecture: OSXSAVE only with XSAVE, leaf 0DH empty without XSAVE
 * and holding x87 and SSE state with it. The host side compares the bits with its template. */
#include <stdint.h>

#include "testkernel.h"

#define ECX_XSAVE   (1u << 26)
#define ECX_OSXSAVE (1u << 27)

struct regs { uint32_t eax, ebx, ecx, edx; };

static struct regs cpuid(uint32_t leaf, uint32_t subleaf)
{
    struct regs r;
    __asm__ volatile("cpuid" : "=a"(r.eax), "=b"(r.ebx), "=c"(r.ecx), "=d"(r.edx)
                     : "a"(leaf), "c"(subleaf));
    return r;
}

static struct regs show(uint32_t leaf, uint32_t subleaf)
{
    struct regs r = cpuid(leaf, subleaf);
    print("cpuid %x.%u eax=%08x ebx=%08x ecx=%08x edx=%08x\n", leaf, subleaf, r.eax, r.ebx,
          r.ecx, r.edx);
    return r;
}

void check_cpuid(void)
{
    uint32_t max = cpuid(0, 0).eax, max_ext = cpuid(0x80000000u, 0).eax;
    struct regs one = show(1, 0);
    if (max >= 7)
        show(7, 0);
    struct regs xsave = { 0, 0, 0, 0 };
    if (max >= 0xd) {
        xsave = show(0xd, 0);
        show(0xd, 1);
    }
    if (max_ext >= 0x80000001u)
        show(0x80000001u, 0);
    check(!(one.ecx & ECX_OSXSAVE), "cpuid: OSXSAVE clear before the kernel sets CR4.OSXSAVE");
    if (one.ecx & ECX_XSAVE)
        check((xsave.eax & 3) == 3 && xsave.ecx >= 576,
              "cpuid: with xsave, leaf 0xd has x87 and SSE state (XCR0 mask %x, size %u)",
              xsave.eax, xsave.ecx);
    else
        check(!xsave.eax && !xsave.ebx && !xsave.ecx && !xsave.edx,
              "cpuid: without xsave, leaf 0xd is empty");
}
