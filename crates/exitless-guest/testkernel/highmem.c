/* RAM above 4 GiB (highmem=MIB: how much RAM the multiboot memory map must list from 4 GiB).
 *
 * The kernel runs with paging off and reaches only the first 4 GiB. To touch RAM past it, it
 * turns on paging for a moment with PAE-format tables and 2 MiB pages: the first 32 MiB
 * identity-mapped (the kernel, its stack; COM1 is ports), and the second GiB's first 2 MiB
 * pages onto RAM from 4 GiB: its first page, its last page, and its first again as an alias.
 * It uses 4-level paging with EFER.LME, so the 32-bit code goes on in compatibility mode (SDM
 * vol. 3 §10.8.5), rather than 3-level PAE paging (§4.4): this project's software KVM
 * (kvm_pvm, docs/host-kvm.md) runs 64-bit guests' paging only, and triple-faults on the
 * other; the RAM the guest reaches is the same.
 * It writes a pattern to a few cache lines of each (ring 0 costs about a microsecond an
 * instruction here, docs/host-kvm.md), reads them back, through the alias too, then turns
 * paging off again. With a virtio-pci function on bus 0, it also checks that its 64-bit BAR 0
 * was placed above RAM (in the host bridge's 64-bit window) and answers there: the common
 * configuration's num_queues, read through a fourth mapping. */
#include <stdint.h>

#include "testkernel.h"

#define PTE_P           (1u << 0)
#define PTE_RW          (1u << 1)
#define PDE_PS          (1u << 7)       /* a 2 MiB page (SDM vol. 3 table 4-9) */
#define CR0_PG          (1u << 31)
#define CR4_PAE         (1u << 5)
#define MSR_EFER        0xc0000080u
#define EFER_LME        (1u << 8)
#define PAGE_2M         0x200000u
#define LOW_PAGES       16u             /* identity-mapped: 32 MiB */
#define HIGH_VIRT       0x40000000u     /* what the PDPT's second entry maps */
#define FOUR_GIB        0x100000000ull
#define MMAP_RAM        1u
#define VIRTIO_VENDOR   0x1af4
#define CAP_VNDR        0x09
#define VIRTIO_COMMON   1u              /* virtio 1.2 §4.1.4: cfg_type of the common config */
#define NUM_QUEUES      0x12            /* its le16 num_queues (§4.1.4.3) */

static uint64_t pml4[512] __attribute__((aligned(4096)));
static uint64_t pdpt[512] __attribute__((aligned(4096)));
static uint64_t pd_low[512] __attribute__((aligned(4096)));
static uint64_t pd_high[512] __attribute__((aligned(4096)));

/* Offsets written in each 2 MiB page: a few cache lines, at its start, middle and end. */
static const uint32_t offsets[] = {0, 0x40, 0x100000, PAGE_2M - 0x40};
#define N_OFFSETS (sizeof(offsets) / sizeof(offsets[0]))

/* The usable map entry that starts at 4 GiB: its length, or 0. */
static uint64_t ram_from_4g(const struct mb_info *mb)
{
    for (uint32_t at = mb->mmap_addr; at < mb->mmap_addr + mb->mmap_length;) {
        const uint8_t *e = (const uint8_t *)at;
        uint64_t base = fw_rd32(e + 4) | (uint64_t)fw_rd32(e + 8) << 32;
        uint64_t len = fw_rd32(e + 12) | (uint64_t)fw_rd32(e + 16) << 32;
        if (fw_rd32(e + 20) == MMAP_RAM && base == FOUR_GIB)
            return len;
        at += fw_rd32(e) + 4;
    }
    return 0;
}

static uint32_t config32(uint32_t dev, uint32_t reg)
{
    outl(PCI_CONFIG_ADDRESS, 0x80000000u | dev << 11 | reg);
    return inl(PCI_CONFIG_DATA);
}

/* The first virtio-pci function on bus 0: its number (0: none), its 64-bit BAR 0 in *bar and
 * where its common configuration is in that BAR in *common. */
static uint32_t virtio_function(uint64_t *bar, uint32_t *common)
{
    for (uint32_t d = 1; d < 32; d++) {
        if ((config32(d, 0) & 0xffff) != VIRTIO_VENDOR)
            continue;
        uint32_t low = config32(d, 0x10);
        *bar = (low & 6) == 4 ? (low & ~0xfu) | (uint64_t)config32(d, 0x14) << 32 : 0;
        for (uint32_t cap = config32(d, 0x34) & 0xff; cap; cap = config32(d, cap) >> 8 & 0xff)
            if ((config32(d, cap) & 0xff) == CAP_VNDR && config32(d, cap) >> 24 == VIRTIO_COMMON)
                *common = config32(d, cap + 8);
        return d;
    }
    return 0;
}

static void efer_lme(int on)
{
    uint32_t lo, hi;
    __asm__ volatile("rdmsr" : "=a"(lo), "=d"(hi) : "c"(MSR_EFER));
    lo = on ? lo | EFER_LME : lo & ~EFER_LME;
    __asm__ volatile("wrmsr" : : "a"(lo), "d"(hi), "c"(MSR_EFER));
}

/* On: CR4.PAE, CR3, EFER.LME, then CR0.PG (SDM vol. 3 §10.8.5); off in the reverse order. */
static void paging(int on)
{
    uint32_t cr0, cr4;
    __asm__ volatile("mov %%cr0, %0; mov %%cr4, %1" : "=r"(cr0), "=r"(cr4));
    if (on) {
        __asm__ volatile("mov %0, %%cr4" : : "r"(cr4 | CR4_PAE) : "memory");
        __asm__ volatile("mov %0, %%cr3" : : "r"(pml4) : "memory");
        efer_lme(1);
        __asm__ volatile("mov %0, %%cr0" : : "r"(cr0 | CR0_PG) : "memory");
    } else {
        __asm__ volatile("mov %0, %%cr0" : : "r"(cr0 & ~CR0_PG) : "memory");
        efer_lme(0);
        __asm__ volatile("mov %0, %%cr4" : : "r"(cr4 & ~CR4_PAE) : "memory");
    }
}

static volatile uint32_t *at(uint32_t page, uint32_t offset)
{
    return (volatile uint32_t *)(HIGH_VIRT + page * PAGE_2M + offset);
}

void check_highmem(const struct mb_info *mb, uint32_t mib)
{
    if (!mib)
        return;
    uint64_t len = ram_from_4g(mb);
    if (!check(len == (uint64_t)mib << 20, "highmem: the memory map lists %u MiB of RAM from 4 GiB",
               (uint32_t)(len >> 20)))
        return;
    for (uint32_t i = 0; i < LOW_PAGES; i++)
        pd_low[i] = (uint64_t)(i * PAGE_2M) | PDE_PS | PTE_RW | PTE_P;
    uint64_t last = FOUR_GIB + len - PAGE_2M;
    pd_high[0] = FOUR_GIB | PDE_PS | PTE_RW | PTE_P;
    pd_high[1] = last | PDE_PS | PTE_RW | PTE_P;
    pd_high[2] = pd_high[0];
    uint64_t bar = 0;
    uint32_t common = 0, queues = 0;
    uint32_t dev = virtio_function(&bar, &common);
    if (dev)
        pd_high[3] = (bar & ~(uint64_t)(PAGE_2M - 1)) | PDE_PS | PTE_RW | PTE_P;
    pdpt[0] = (uint32_t)pd_low | PTE_RW | PTE_P;
    pdpt[1] = (uint32_t)pd_high | PTE_RW | PTE_P;
    pml4[0] = (uint32_t)pdpt | PTE_RW | PTE_P;

    uint32_t wrong = 0, aliased = 0, low_alias = 0;
    paging(1);
    for (uint32_t i = 0; i < N_OFFSETS; i++) {
        *at(0, offsets[i]) = 0x4a160000u | i;
        *at(1, offsets[i]) = 0x7e570000u | i;
    }
    for (uint32_t i = 0; i < N_OFFSETS; i++) {
        wrong += *at(0, offsets[i]) != (0x4a160000u | i);
        wrong += *at(1, offsets[i]) != (0x7e570000u | i);
        aliased += *at(2, offsets[i]) == (0x4a160000u | i);
        /* Not low RAM seen again: physical 0 + offset (identity-mapped) holds no pattern. */
        low_alias += offsets[i] < LOW_PAGES * PAGE_2M &&
                     *(volatile uint32_t *)offsets[i] == (0x4a160000u | i);
    }
    if (dev)
        queues = *(volatile uint16_t *)at(3, (uint32_t)(bar & (PAGE_2M - 1)) + common + NUM_QUEUES);
    paging(0);
    if (dev)
        check(bar >= FOUR_GIB + len && queues > 0 && queues < 0xffff,
              "highmem: 00:%02x.0's 64-bit BAR 0 at %x:%x, above RAM, answers (%u queues)", dev,
              (uint32_t)(bar >> 32), (uint32_t)bar, queues);
    check(wrong == 0, "highmem: %u cache lines at 4 GiB and at 4 GiB + %u MiB read back what was "
          "written (%u wrong)", 2 * N_OFFSETS, (uint32_t)((last - FOUR_GIB) >> 20), wrong);
    check(aliased == N_OFFSETS && low_alias == 0,
          "highmem: a second mapping of 4 GiB reads the same (%u of %u), low RAM does not (%u)",
          aliased, N_OFFSETS, low_alias);
}
