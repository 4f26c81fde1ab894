/* The exitless probe guest: runs at CPL 3, executes the ops the VMM put at OPS_ADDR and writes
 * their results at RESULTS_ADDR (contract: src/contract.rs, via the generated contract.h).
 *
 * It is the guest half of T1: it reads PCI configuration space by configuration mechanism #1
 * (ports 0xCF8/0xCFC) or through the ECAM window, and times each op with rdtsc, which runs
 * natively at CPL 3 on this host. */
#include "contract.h"

typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;

/* ---- CPU primitives (CPL 3: port I/O is allowed by the TSS I/O bitmap) ---- */

#include "portio.h"

#include "firmware.h"

static inline u64 rdtsc(void)
{
    u32 lo, hi;
    /* lfence keeps the loads being timed from moving across the timestamp. */
    __asm__ volatile("lfence; rdtsc; lfence" : "=a"(lo), "=d"(hi)::"memory");
    return ((u64)hi << 32) | lo;
}

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

/* ---- PCI configuration access ---- */

static const struct boot_info *boot = (const struct boot_info *)BOOT_INFO_ADDR;

static int ecam_described(void) { return boot->ecam_base != 0; }

/* The seed's guest patch: prefer ECAM (MMIO) when running under a hypervisor and ECAM is
 * described; bare metal keeps port I/O because of old chipset bugs. */
static u64 resolve_method(u64 method)
{
    if (method != METHOD_AUTO)
        return method;
    return (running_under_hypervisor() && ecam_described()) ? METHOD_ECAM : METHOD_PIO;
}

/* `addr` is an ECAM-style offset (bus << 20 | dev << 15 | fn << 12 | reg). */
static u32 config_address(u64 addr)
{
    u32 bdf = (u32)(addr >> ECAM_FUNCTION_SHIFT) & 0xffff; /* bus:8 dev:5 fn:3 */
    return (u32)PCI_CONFIG_ADDRESS_ENABLE | (bdf << 8) | ((u32)addr & 0xfc);
}

static int method_can_reach(u64 method, u64 addr, u64 size)
{
    u64 reg = addr & (PCI_CFG_SPACE_EXP_SIZE - 1);
    if (size != 1 && size != 2 && size != 4)
        return 0;
    if (method == METHOD_PIO) /* bus numbers stop at 255; register offsets at 255 */
        return (addr >> ECAM_BUS_SHIFT) < 256 && reg < PCI_CFG_SPACE_SIZE;
    if (method == METHOD_ECAM) {
        u64 bus = addr >> ECAM_BUS_SHIFT;
        return ecam_described() && bus >= boot->ecam_bus_start && bus <= boot->ecam_bus_end;
    }
    return 0;
}

static u64 ecam_address(u64 addr)
{
    return boot->ecam_base + addr - (boot->ecam_bus_start << ECAM_BUS_SHIFT);
}

/* One access exactly as the method does it: mechanism #1 writes CONFIG_ADDRESS then accesses
 * the CONFIG_DATA byte lane(s) of the register; ECAM is a plain memory access. */
static u32 cfg_read(u64 method, u64 addr, u64 size)
{
    if (method == METHOD_ECAM)
        return (u32)mem_read(ecam_address(addr), size);
    outl(PCI_CONFIG_ADDRESS_PORT, config_address(addr));
    u16 port = (u16)(PCI_CONFIG_DATA_PORT + (addr & 3));
    switch (size) {
    case 1: return inb(port);
    case 2: return inw(port);
    default: return inl(port);
    }
}

static void cfg_write(u64 method, u64 addr, u64 size, u32 v)
{
    if (method == METHOD_ECAM) {
        mem_write(ecam_address(addr), size, v);
        return;
    }
    outl(PCI_CONFIG_ADDRESS_PORT, config_address(addr));
    u16 port = (u16)(PCI_CONFIG_DATA_PORT + (addr & 3));
    switch (size) {
    case 1: outb(port, (u8)v); break;
    case 2: outw(port, (u16)v); break;
    default: outl(port, v); break;
    }
}

/* ---- Enumeration: what an OS does at boot ---- */

/* Size one BAR the way Linux's __pci_read_base does: save, write all-ones, read the mask,
 * restore. Returns the number of BAR slots used (2 for a 64-bit memory BAR). */
static int size_bar(u64 method, u64 fn_addr, int i, u64 *size)
{
    u64 reg = fn_addr + PCI_BAR0 + 4 * (u64)i;
    u32 orig = cfg_read(method, reg, 4);
    cfg_write(method, reg, 4, 0xffffffff);
    u32 mask = cfg_read(method, reg, 4);
    cfg_write(method, reg, 4, orig);
    *size = 0;
    if (mask == 0)
        return 1;
    if (orig & PCI_BAR_SPACE_IO) {
        u32 m = mask & ~3u;
        if ((m & 0xffff0000u) == 0) /* 16-bit I/O decoder: upper bits read as zero */
            m |= 0xffff0000u;
        *size = (u32)(~m + 1);
        return 1;
    }
    u64 m = mask & ~0xfull;
    if ((orig & 0x6) == PCI_BAR_MEM_TYPE_64 && i + 1 < (int)PCI_BAR_COUNT) {
        u32 orig_hi = cfg_read(method, reg + 4, 4);
        cfg_write(method, reg + 4, 4, 0xffffffff);
        u32 mask_hi = cfg_read(method, reg + 4, 4);
        cfg_write(method, reg + 4, 4, orig_hi);
        m |= (u64)mask_hi << 32;
        *size = ~m + 1;
        return 2;
    }
    *size = (u32)(~(u32)m + 1);
    return 1;
}

static void walk_caps(u64 method, u64 fn_addr, struct enum_record *r)
{
    r->cap_count = 0;
    if (cfg_read(method, fn_addr + PCI_STATUS, 2) & PCI_STATUS_CAP_LIST) {
        u32 ptr = cfg_read(method, fn_addr + PCI_CAPABILITY_LIST, 1) & 0xfc;
        /* 48 = the most 4-byte capabilities that fit in 0x40..0xff: bounds a looping list. */
        for (int n = 0; ptr >= 0x40 && n < 48; n++) {
            u32 hdr = cfg_read(method, fn_addr + ptr, 2);
            if (r->cap_count < 8)
                r->caps[r->cap_count++] = hdr & 0xff;
            else
                r->flags |= ENUM_FLAG_CAPS_TRUNCATED;
            ptr = (hdr >> 8) & 0xfc;
        }
    }
    if (method != METHOD_ECAM)
        return; /* extended space (>= 256) is out of reach of mechanism #1 */
    u32 off = PCI_EXT_CAP_START;
    /* 0x3c0 = the most 4-byte extended capabilities that fit: bounds a looping list. */
    for (int n = 0; off >= PCI_EXT_CAP_START && n < 0x3c0; n++) {
        u32 hdr = cfg_read(method, fn_addr + off, 4);
        if (hdr == 0 || hdr == 0xffffffff)
            break;
        if (r->cap_count < 8)
            r->caps[r->cap_count++] = 0x10000 | (hdr & 0xffff);
        else
            r->flags |= ENUM_FLAG_CAPS_TRUNCATED;
        off = (hdr >> 20) & 0xffc;
    }
}

static void probe_function(u64 method, u64 fn_addr, struct enum_record *r)
{
    r->address = fn_addr;
    r->flags = 0;
    for (int i = 0; i < 16; i++)
        r->header[i] = cfg_read(method, fn_addr + 4 * (u64)i, 4);
    for (int i = 0; i < (int)PCI_BAR_COUNT; i++)
        r->bar_sizes[i] = 0;
    if ((cfg_read(method, fn_addr + PCI_HEADER_TYPE, 1) & 0x7f) == PCI_HEADER_TYPE_NORMAL) {
        /* Decoding off while BARs hold all-ones, as Linux does. */
        u32 cmd = cfg_read(method, fn_addr + PCI_COMMAND, 2);
        cfg_write(method, fn_addr + PCI_COMMAND, 2,
                  cmd & ~(u32)(PCI_COMMAND_IO | PCI_COMMAND_MEMORY));
        for (int i = 0; i < (int)PCI_BAR_COUNT;)
            i += size_bar(method, fn_addr, i, &r->bar_sizes[i]);
        cfg_write(method, fn_addr + PCI_COMMAND, 2, cmd);
    } else {
        r->flags |= ENUM_FLAG_NOT_TYPE0;
    }
    walk_caps(method, fn_addr, r);
}

static u64 enumerate(u64 method)
{
    struct enum_record *records = (struct enum_record *)ENUM_ADDR;
    u64 bus_start = method == METHOD_ECAM ? boot->ecam_bus_start : 0;
    u64 bus_end = method == METHOD_ECAM ? boot->ecam_bus_end : 0;
    u64 n = 0;
    for (u64 bus = bus_start; bus <= bus_end; bus++) {
        for (u64 dev = 0; dev < 32; dev++) {
            u64 functions = 1;
            for (u64 fn = 0; fn < functions; fn++) {
                u64 a = bus << ECAM_BUS_SHIFT | dev << ECAM_DEVICE_SHIFT | fn << ECAM_FUNCTION_SHIFT;
                u32 vendor = cfg_read(method, a + PCI_VENDOR_ID, 2);
                if (vendor == 0xffff || vendor == 0)
                    continue;
                if (fn == 0 && (cfg_read(method, a + PCI_HEADER_TYPE, 1) & PCI_HEADER_TYPE_MULTIFUNCTION))
                    functions = 8;
                if (n < MAX_ENUM_RECORDS)
                    probe_function(method, a, &records[n]);
                n++;
            }
        }
    }
    return n;
}

/* ---- Interrupts: the IDT (filled here, at CPL 3), the local APIC and the IOAPIC ---- */

struct idt_gate {
    u16 offset_low, selector;
    u8 ist, type_attr;
    u16 offset_mid;
    u32 offset_high, reserved;
};

extern struct idt_gate idt[256];
extern char isr_stubs[];
extern volatile u64 irq_counts[256];
extern volatile u64 legacy_mmio_base;
extern volatile u32 legacy_status;

static void interrupts_init(void)
{
    for (int v = 0; v < 256; v++) {
        u64 a = (u64)isr_stubs + 16 * (u64)v;
        idt[v].offset_low = (u16)a;
        idt[v].selector = (u16)KERNEL_CS;
        idt[v].ist = 0;
        idt[v].type_attr = 0x8e; /* present, DPL 0, 64-bit interrupt gate (Intel SDM §6.14.1) */
        idt[v].offset_mid = (u16)(a >> 16);
        idt[v].offset_high = (u32)(a >> 32);
        idt[v].reserved = 0;
    }
    /* Mask both 8259 PICs: KVM wires the PIC to the BSP's LINT0 at reset, and an
     * uninitialised PIC would deliver ISA interrupts on exception vectors. */
    outb(0x21, 0xff);
    outb(0xa1, 0xff);
    /* Software-enable the local APIC; spurious interrupts go to vector 0xff. */
    mem_write(LAPIC_BASE + LAPIC_SVR, 4, LAPIC_SVR_ENABLE | 0xff);
}

static void ioapic_write(u32 reg, u32 v)
{
    mem_write(IOAPIC_BASE + IOAPIC_REGSEL, 4, reg);
    mem_write(IOAPIC_BASE + IOAPIC_WINDOW, 4, v);
}

/* Route IOAPIC pin `pin`, level-triggered, to `vector` on APIC 0; or mask it (vector 0). */
static void ioapic_route(u64 pin, u32 vector)
{
    u32 reg = (u32)(IOAPIC_REDTBL + 2 * pin);
    ioapic_write(reg + 1, 0);
    ioapic_write(reg, vector ? (vector | IOAPIC_REDIR_LEVEL) : IOAPIC_REDIR_MASKED);
}

static u64 tsc_timeout(void)
{
    u64 khz = boot->tsc_khz ? boot->tsc_khz : 3000000; /* 3 GHz if unknown */
    return rdtsc() + khz * 1000; /* one second */
}

/* ---- A VT-d driver (Intel VT-d spec, legacy mode; ../shared/design/T5-IOMMU.md) ----
 *
 * The DMA-API pattern of Linux's intel-iommu with dma-iommu: every buffer is mapped (page-table
 * writes in guest RAM; CAP.CM=0, so a map needs no invalidation) before the device sees it and
 * unmapped when the device gives it back. An unmapped IOVA may be reused only once the IOTLB
 * cannot hold it any more: strict mode invalidates each unmap at once (one IQT write, one
 * exit), the deferred modes batch unmaps and flush them with one invalidation, as seed 003 does
 * and as Linux's flush queue does today. The price of deferral is the exposure: an unmapped
 * page stays reachable through a stale IOTLB entry until the flush; it is measured per page. */

#define VTD_PAGE 0x1000ull
#define VTD_SLOT_PAGES 8                         /* IOVA per mapping: up to 28 KiB + offset */
#define VTD_SLOTS 2048
#define VTD_DOMAINS 8
#define VTD_QUEUE_ENTRIES 256                    /* IQA.QS = 0: 256 128-bit descriptors */
#define VTD_MAX_PENDING 1024                     /* the deferred modes' most pending unmaps */
#define VTD_FQ_SIZE 256                          /* Linux's IOVA_FQ_SIZE */
#define VTD_TIMEOUT_MS 10                        /* Linux's IOVA_FQ_TIMEOUT and the seed's */

/* The structure area: root table, context table of bus 0, invalidation queue, wait status,
 * then page-table pages. */
#define VTD_ROOT (IOMMU_TABLES_ADDR)
#define VTD_CONTEXT (IOMMU_TABLES_ADDR + VTD_PAGE)
#define VTD_QUEUE (IOMMU_TABLES_ADDR + 2 * VTD_PAGE)
#define VTD_STATUS (IOMMU_TABLES_ADDR + 3 * VTD_PAGE)
#define VTD_POOL (IOMMU_TABLES_ADDR + 4 * VTD_PAGE)

struct vtd_domain {
    u64 devfn, pml4;
    u16 did;
    u16 nfree;
    u16 free[VTD_SLOTS];
};

/* One unmap waiting for the invalidation that lets its IOVA be reused. */
struct vtd_pending {
    u64 tsc;          /* when it was unmapped */
    u32 next;         /* list mode: the next node, or ~0 */
    u16 slot, pages;
    u8 domain;
};

static struct {
    int ready, coherent;
    u64 base, mode, hwm, pool_next, qtail, wait_seq, deadline;
    struct vtd_domain domains[VTD_DOMAINS];
    u64 ndomains;
    /* deferred-list: nodes from a pool (the seed's kmalloc per unmap), linked in order */
    struct vtd_pending nodes[VTD_MAX_PENDING];
    u32 node_free, list_head, list_tail;
    /* deferred-array and per-domain: a fixed array; linux-fq: a ring */
    struct vtd_pending array[VTD_MAX_PENDING];
    u64 count;        /* pending unmaps, whatever holds them */
    u64 fq_head;
    u64 pending_pages;
    u64 faults_before;
    struct iommu_report rep;
} vtd;

static u64 vtd_read(u64 reg, u64 size) { return mem_read(vtd.base + reg, size); }
static void vtd_write(u64 reg, u64 size, u64 v) { mem_write(vtd.base + reg, size, v); }

static u64 tsc_per_ms(void) { return boot->tsc_khz ? boot->tsc_khz : 3000000; }

/* Write back the cache line of a table entry just written, where the unit's walks do not
 * snoop (ECAP.C = 0, VT-d §10.4.3: QEMU's unit says so; exitless's is coherent), as
 * Linux's intel-iommu does with clflush_cache_range. */
static void vtd_sync(const volatile void *entry)
{
    if (!vtd.coherent)
        __asm__ volatile("clflush %0" ::"m"(*(const volatile u8 *)entry) : "memory");
}

/* Set a GCMD bit and wait for GSTS to show it (VT-d §10.4.4: software writes GSTS's value
 * with the one bit changed). */
static int vtd_command(u32 bit)
{
    /* Keep the persistent enables; the one-shot status bits must not be written back. */
    u32 sts = (u32)vtd_read(VTD_GSTS_REG, 4) & (VTD_GCMD_TE | VTD_GCMD_QIE);
    vtd_write(VTD_GCMD_REG, 4, sts | bit);
    u64 deadline = tsc_timeout();
    while (!(vtd_read(VTD_GSTS_REG, 4) & bit))
        if (rdtsc() > deadline)
            return 0;
    return 1;
}

static u64 vtd_alloc_page(void)
{
    u64 p = vtd.pool_next;
    if (p + VTD_PAGE > IOMMU_TABLES_ADDR + IOMMU_TABLES_SIZE)
        return 0;
    vtd.pool_next += VTD_PAGE;
    for (u64 i = 0; i < VTD_PAGE; i += 8)
        *(volatile u64 *)(p + i) = 0;
    for (u64 i = 0; i < VTD_PAGE; i += 64)
        vtd_sync((const volatile void *)(p + i));
    return p;
}

/* Queue `n` descriptors and a wait descriptor, write the tail once, and spin until the unit
 * wrote the wait status (it processes the queue inside the IQT write: one exit). */
static void vtd_submit(const u64 (*descs)[2], u64 n)
{
    volatile u64 *q = (volatile u64 *)VTD_QUEUE;
    volatile u32 *status = (volatile u32 *)VTD_STATUS;
    u32 seq = (u32)++vtd.wait_seq;
    for (u64 i = 0; i <= n; i++) {
        u64 slot = vtd.qtail % VTD_QUEUE_ENTRIES;
        if (i < n) {
            q[2 * slot] = descs[i][0];
            q[2 * slot + 1] = descs[i][1];
        } else {
            q[2 * slot] = VTD_QI_WAIT_TYPE | VTD_QI_WAIT_SW | (u64)seq << VTD_QI_WAIT_DATA_SHIFT;
            q[2 * slot + 1] = VTD_STATUS;
        }
        vtd.qtail++;
    }
    __asm__ volatile("mfence" ::: "memory");
    vtd_write(VTD_IQT_REG, 8, (vtd.qtail % VTD_QUEUE_ENTRIES) * VTD_QI_DESC_SIZE);
    vtd.rep.iqt_writes++;
    vtd.rep.descriptors += n + 1;
    u64 deadline = tsc_timeout();
    while (*status != seq)
        if (rdtsc() > deadline) {
            vtd.rep.wait_timeouts++;
            break;
        }
}

/* Bring the unit up once: root and context tables, queued invalidation, fault events,
 * translation on. */
static u64 vtd_init(void)
{
    if (vtd.ready)
        return STATUS_OK;
    vtd.base = boot->iommu_base;
    if (!vtd.base)
        return STATUS_UNSUPPORTED;
    u64 cap = vtd_read(VTD_CAP_REG, 8), ecap = vtd_read(VTD_ECAP_REG, 8);
    if (!(cap & VTD_CAP_SAGAW_4LEVEL) || !(ecap & VTD_ECAP_QI))
        return STATUS_DEVICE_ERROR;
    /* strict's one page-selective invalidation per 8-page slot needs CAP.PSI and MAMV >= 3
     * (CAP, VT-d §10.4.2: a unit other than exitless's, QEMU's, is checked, not assumed). */
    if (!(cap & VTD_CAP_PSI) || ((cap >> VTD_CAP_MAMV_SHIFT) & 0x3f) < 3)
        return STATUS_DEVICE_ERROR;
    vtd.coherent = (ecap & VTD_ECAP_C) != 0;
    vtd.pool_next = VTD_POOL;
    for (u64 p = VTD_ROOT; p < VTD_POOL; p += 8)
        *(volatile u64 *)p = 0;
    *(volatile u64 *)VTD_ROOT = VTD_CONTEXT | VTD_ROOT_P; /* bus 0 */
    for (u64 p = VTD_ROOT; p < VTD_POOL; p += 64)
        vtd_sync((const volatile void *)p);
    vtd_write(VTD_RTADDR_REG, 8, VTD_ROOT);
    if (!vtd_command(VTD_GCMD_SRTP))
        return STATUS_TIMEOUT;
    vtd_write(VTD_IQT_REG, 8, 0);
    vtd_write(VTD_IQA_REG, 8, VTD_QUEUE); /* QS 0: 256 entries */
    vtd.qtail = 0;
    if (!vtd_command(VTD_GCMD_QIE))
        return STATUS_TIMEOUT;
    vtd_write(VTD_FEDATA_REG, 4, IOMMU_FAULT_VECTOR);
    vtd_write(VTD_FEADDR_REG, 4, MSI_ADDRESS_BASE);
    vtd_write(VTD_FEUADDR_REG, 4, 0);
    vtd_write(VTD_FECTL_REG, 4, 0); /* unmask */
    const u64 flush[2][2] = {{VTD_QI_CC_TYPE | VTD_GRAN_GLOBAL << VTD_QI_GRAN_SHIFT, 0},
                             {VTD_QI_IOTLB_TYPE | VTD_GRAN_GLOBAL << VTD_QI_GRAN_SHIFT, 0}};
    vtd_submit(flush, 2);
    if (!vtd_command(VTD_GCMD_TE))
        return STATUS_TIMEOUT;
    vtd.mode = IOMMU_MODE_STRICT;
    vtd.hwm = 250; /* the seed's default high-water mark */
    vtd.list_head = vtd.list_tail = ~0u;
    vtd.node_free = 0;
    for (u32 i = 0; i < VTD_MAX_PENDING; i++)
        vtd.nodes[i].next = i + 1 < VTD_MAX_PENDING ? i + 1 : ~0u;
    vtd.ready = 1;
    return STATUS_OK;
}

/* The domain of PCI function `fn`, set up at its first use: a context entry pointing at a
 * 4-level page table, its IOVA slots all free. */
static struct vtd_domain *vtd_domain(u64 fn)
{
    u64 devfn = (fn >> ECAM_FUNCTION_SHIFT) & 0xff;
    for (u64 i = 0; i < vtd.ndomains; i++)
        if (vtd.domains[i].devfn == devfn)
            return &vtd.domains[i];
    if (vtd.ndomains == VTD_DOMAINS)
        return 0;
    struct vtd_domain *d = &vtd.domains[vtd.ndomains];
    d->devfn = devfn;
    d->did = (u16)(vtd.ndomains + 1);
    d->pml4 = vtd_alloc_page();
    if (!d->pml4)
        return 0;
    vtd.ndomains++;
    volatile u64 *ctx = (volatile u64 *)(VTD_CONTEXT + 16 * devfn);
    ctx[1] = VTD_CTX_AW_4LEVEL | (u64)d->did << VTD_CTX_DID_SHIFT;
    ctx[0] = d->pml4 | VTD_CTX_P; /* TT 0: translate */
    vtd_sync(ctx); /* 16-byte aligned: one line */
    const u64 flush[1][2] = {{VTD_QI_CC_TYPE | VTD_GRAN_GLOBAL << VTD_QI_GRAN_SHIFT, 0}};
    vtd_submit(flush, 1);
    return d;
}

static u64 slot_iova(u16 slot) { return IOVA_BASE + (u64)slot * VTD_SLOT_PAGES * VTD_PAGE; }

/* The last-level entry for `iova` in `d`, the tables above it made as needed (`alloc`), or
 * 0 when a table is missing. */
static volatile u64 *vtd_pte(struct vtd_domain *d, u64 iova, int alloc)
{
    u64 table = d->pml4;
    for (int shift = 39; shift > 12; shift -= 9) {
        volatile u64 *e = (volatile u64 *)table + ((iova >> shift) & 511);
        if (!(*e & VTD_PTE_R)) {
            u64 page = alloc ? vtd_alloc_page() : 0;
            if (!page)
                return 0;
            *e = page | VTD_PTE_R | VTD_PTE_W;
            vtd_sync(e);
        }
        table = *e & ~0xfffull;
    }
    return (volatile u64 *)table + ((iova >> 12) & 511);
}

/* Map `len` bytes at `buf` for the device (`write`: the device writes them) at IOVA slot
 * `slot`; returns the IOVA, 0 when out of page-table memory. */
static u64 vtd_map_at(struct vtd_domain *d, u16 slot, u64 page, const void *buf, u64 len, int write)
{
    u64 gpa = (u64)buf, first = gpa & ~0xfffull;
    u64 iova = slot_iova(slot) + page * VTD_PAGE;
    for (u64 p = first; p < gpa + len; p += VTD_PAGE) {
        volatile u64 *pte = vtd_pte(d, iova + (p - first), 1);
        if (!pte)
            return 0;
        *pte = p | VTD_PTE_R | (write ? VTD_PTE_W : 0);
        vtd_sync(pte);
    }
    vtd.rep.maps++;
    return iova + (gpa & 0xfff);
}

static u64 vtd_pages(const void *buf, u64 len)
{
    u64 gpa = (u64)buf;
    return ((gpa + len + 0xfff) >> 12) - (gpa >> 12);
}

/* Give `slot` back once its invalidation completed, and count how long its pages were
 * exposed. */
static void vtd_release(struct vtd_pending *p, u64 now)
{
    struct vtd_domain *d = &vtd.domains[p->domain];
    d->free[d->nfree++] = p->slot;
    u64 exposure = now - p->tsc;
    if (exposure > vtd.rep.exposure_max)
        vtd.rep.exposure_max = exposure;
    vtd.rep.exposure_sum += exposure * p->pages;
    u64 b = 0;
    while (b + 1 < EXPOSURE_BUCKETS && (exposure >> (b + 1)))
        b++;
    vtd.rep.exposure_log2[b] += p->pages;
    vtd.pending_pages -= p->pages;
}

/* Invalidate everything pending with one descriptor (global, or per domain) and a wait, then
 * release it. Returns the pages it covered. */
static u64 vtd_flush(void)
{
    if (!vtd.count)
        return 0;
    u64 covered = vtd.pending_pages;
    if (vtd.mode == IOMMU_MODE_PER_DOMAIN) {
        u64 descs[VTD_DOMAINS][2], n = 0;
        for (u64 i = 0; i < vtd.ndomains; i++) {
            int used = 0;
            for (u64 k = 0; k < vtd.count; k++)
                used |= vtd.array[k].domain == i;
            if (used) {
                descs[n][0] = VTD_QI_IOTLB_TYPE | VTD_GRAN_DOMAIN << VTD_QI_GRAN_SHIFT |
                              (u64)vtd.domains[i].did << VTD_QI_DID_SHIFT;
                descs[n++][1] = 0;
            }
        }
        vtd_submit((const u64(*)[2])descs, n);
    } else {
        const u64 global[1][2] = {{VTD_QI_IOTLB_TYPE | VTD_GRAN_GLOBAL << VTD_QI_GRAN_SHIFT, 0}};
        vtd_submit(global, 1);
    }
    u64 now = rdtsc();
    if (vtd.mode == IOMMU_MODE_DEFERRED_LIST) {
        while (vtd.list_head != ~0u) {
            u32 i = vtd.list_head;
            vtd_release(&vtd.nodes[i], now);
            vtd.list_head = vtd.nodes[i].next;
            vtd.nodes[i].next = vtd.node_free;
            vtd.node_free = i;
        }
        vtd.list_tail = ~0u;
    } else if (vtd.mode == IOMMU_MODE_LINUX_FQ) {
        for (u64 k = 0; k < vtd.count; k++)
            vtd_release(&vtd.array[(vtd.fq_head + k) % VTD_FQ_SIZE], now);
        vtd.fq_head = (vtd.fq_head + vtd.count) % VTD_FQ_SIZE;
    } else {
        for (u64 k = 0; k < vtd.count; k++)
            vtd_release(&vtd.array[k], now);
    }
    vtd.count = 0;
    vtd.rep.flushes++;
    return covered;
}

/* The deferred modes' timer: flush once the oldest pending unmap is 10 ms old. Checked at
 * every unmap and in the driver's wait loops, like an rdtsc deadline. */
static void vtd_tick(void)
{
    if (vtd.ready && vtd.count && rdtsc() > vtd.deadline)
        vtd_flush();
}

/* The most unmaps a deferred mode holds before it flushes. */
static u64 vtd_capacity(void)
{
    if (vtd.mode == IOMMU_MODE_LINUX_FQ)
        return VTD_FQ_SIZE - 1; /* Linux's fq_full: one entry stays free */
    return vtd.hwm;
}

/* Unmap the buffer at `slot`: clear its PTEs, then invalidate as the mode says. */
static void vtd_unmap(struct vtd_domain *d, u16 slot, u64 pages)
{
    u64 iova = slot_iova(slot);
    for (u64 i = 0; i < pages; i++) {
        volatile u64 *pte = vtd_pte(d, iova + i * VTD_PAGE, 0);
        *pte = 0;
        vtd_sync(pte);
    }
    vtd.rep.unmaps++;
    vtd.rep.pages += pages;
    struct vtd_pending p = {.tsc = rdtsc(), .next = ~0u, .slot = slot, .pages = (u16)pages,
                            .domain = (u8)(d - vtd.domains)};
    vtd.pending_pages += pages;
    if (vtd.pending_pages > vtd.rep.max_pending)
        vtd.rep.max_pending = vtd.pending_pages;
    if (vtd.mode == IOMMU_MODE_STRICT) {
        /* Page-selective: the slot is 8 pages, naturally aligned, so one descriptor with
         * address mask 3 names exactly it. */
        const u64 psi[1][2] = {{VTD_QI_IOTLB_TYPE | VTD_GRAN_PAGE << VTD_QI_GRAN_SHIFT | (u64)d->did << VTD_QI_DID_SHIFT,
                                iova | 3}};
        vtd_submit(psi, 1);
        vtd.rep.flushes++;
        vtd_release(&p, rdtsc());
        return;
    }
    if (vtd.count == 0)
        vtd.deadline = p.tsc + VTD_TIMEOUT_MS * tsc_per_ms();
    if (vtd.mode == IOMMU_MODE_DEFERRED_LIST) {
        u32 i = vtd.node_free;
        vtd.node_free = vtd.nodes[i].next;
        vtd.nodes[i] = p;
        if (vtd.list_tail == ~0u)
            vtd.list_head = i;
        else
            vtd.nodes[vtd.list_tail].next = i;
        vtd.list_tail = i;
    } else if (vtd.mode == IOMMU_MODE_LINUX_FQ) {
        vtd.array[(vtd.fq_head + vtd.count) % VTD_FQ_SIZE] = p;
    } else {
        vtd.array[vtd.count] = p;
    }
    vtd.count++;
    if (vtd.count >= vtd_capacity())
        vtd_flush();
    else
        vtd_tick();
}

/* Forget every mapping of `d`, as a driver does when it brings its device up again: the
 * device was reset, so whatever it still held is gone. Slot 0 holds the rings; buffers get
 * the others, lowest first. */
static void vtd_domain_reset(struct vtd_domain *d)
{
    vtd_flush();
    for (u64 page = 0; page < (u64)VTD_SLOTS * VTD_SLOT_PAGES; page++) {
        volatile u64 *pte = vtd_pte(d, IOVA_BASE + page * VTD_PAGE, 0);
        if (pte) {
            *pte = 0;
            vtd_sync(pte);
        }
    }
    d->nfree = 0;
    for (u16 s = VTD_SLOTS - 1; s >= 1; s--)
        d->free[d->nfree++] = s;
    const u64 flush[1][2] = {{VTD_QI_IOTLB_TYPE | VTD_GRAN_DOMAIN << VTD_QI_GRAN_SHIFT | (u64)d->did << VTD_QI_DID_SHIFT, 0}};
    vtd_submit(flush, 1);
}

static void vtd_set_mode(const struct op *op, struct op_result *res)
{
    if (op->method < IOMMU_MODE_STRICT || op->method > IOMMU_MODE_LINUX_FQ ||
        op->value > VTD_MAX_PENDING) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    if (vtd.ready)
        res->value = vtd_flush(); /* leave the old mode with nothing pending */
    vtd.mode = op->method;
    if (op->value)
        vtd.hwm = op->value;
}

static void vtd_report(const struct op *op, struct op_result *res)
{
    if (op->address >= MAX_IOMMU_REPORTS) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    vtd.rep.faults = irq_counts[IOMMU_FAULT_VECTOR] - vtd.faults_before;
    ((struct iommu_report *)IOMMU_REPORT_ADDR)[op->address] = vtd.rep;
    vtd.rep = (struct iommu_report){0};
    vtd.rep.max_pending = vtd.pending_pages;
    vtd.faults_before = irq_counts[IOMMU_FAULT_VECTOR];
}

/* ---- A virtio-net driver for virtio-mmio (legacy line or MSI extension) and virtio-pci ---- */

#define QSIZE 16

struct vring_desc {
    u64 addr;
    u32 len;
    u16 flags, next;
};

struct vq {
    volatile struct vring_desc *desc;
    volatile u16 *avail;  /* flags, idx, ring[size], used_event */
    volatile u16 *used;   /* flags, idx, {u32 id, u32 len}[size], avail_event */
    u16 size, avail_idx, last_used, index;
    u64 notify;           /* doorbell address */
    u16 iova_slot[QSIZE]; /* behind the IOMMU: each descriptor's mapping (0: none) */
    u8 iova_pages[QSIZE];
};

/* What differs between the transports, one table each: virtio-mmio on its legacy line,
 * virtio-mmio with the MSI extension (docs/virtio-mmio-msi.md) and virtio-pci with MSI-X. The
 * driver below calls through the table and never asks which transport it drives. */
struct transport_ops {
    u64 (*locate)(u64 address);              /* find the registers: a STATUS_* */
    void (*set_status)(u32 s);
    u32 (*get_status)(void);
    u32 (*device_features)(u32 sel);         /* feature bits 32 * sel .. 32 * sel + 31 */
    void (*driver_features)(u32 sel, u32 w);
    u64 (*features)(void);                   /* transport feature bits the driver needs */
    void (*setup_interrupts)(void);          /* program vectors or route the line */
    u16 (*queue_select)(u16 index);          /* select a queue; its maximum size */
    int (*queue_enable)(struct vq *q, const u64 addr[3]); /* size, rings, vector, doorbell */
    void (*notify)(const struct vq *q);      /* ring the queue's doorbell */
    void (*msi_mask)(u32 k, int masked);     /* MSI transports only: 0 on the legacy line */
    int (*msi_pending)(u32 k);
};

struct vdev {
    const struct transport_ops *ops;
    u64 transport, flags, address;
    u64 mmio, gsi;                          /* virtio-mmio */
    u64 devcfg;                             /* device-specific configuration, both */
    u64 common, isr, notify_base;           /* virtio-pci */
    u64 notify_mult, msix_table, msix_pba;
    struct vq rx, tx;
    u8 *rx_buf, *tx_buf;
    u8 *stream_buf;                         /* OP_NET_STREAM: one frame per descriptor */
    u32 rx_vector;                          /* IDT vector that signals a receive */
    u8 mac[6];                              /* from its config space; all zero if none */
    u64 rx_irqs;                            /* receive interrupts before the posted buffer's */
    int ready;
    struct vtd_domain *iommu;               /* behind the IOMMU (RR_FLAG_IOMMU) */
};

static struct vdev dev;
static u64 dma_next;

static void *dma_alloc(u64 size)
{
    u64 p = (dma_next + 0xfff) & ~0xfffull; /* page-aligned: satisfies every ring alignment */
    if (p + size > DMA_ADDR + DMA_SIZE)
        return 0;
    dma_next = p + size;
    for (u64 i = 0; i < size; i++)
        ((volatile u8 *)p)[i] = 0;
    return (void *)p;
}

static int is_msi(void) { return dev.ops->msi_mask != 0; }
static u32 queue_vector(u32 q) { return (u32)IRQ_VECTOR_BASE + q; }

/* The vectors every MSI transport gives, in its own table: one per queue, then the
 * configuration-change one in slot 2. */
static void program_vectors(void (*program)(u32 k, u32 vector))
{
    program(0, queue_vector(0));
    program(1, queue_vector(1));
    program(2, (u32)(IRQ_VECTOR_BASE + IRQ_VECTOR_CONFIG));
    dev.rx_vector = queue_vector(VIRTIO_NET_RX_QUEUE);
}

/* ---- virtio-mmio (virtio 1.2 §4.2.2), legacy line or MSI extension ---- */

static u64 mmio_locate(u64 index)
{
    if (index >= boot->virtio_mmio_count)
        return STATUS_UNSUPPORTED;
    dev.mmio = boot->virtio_mmio_base[index];
    dev.gsi = boot->virtio_mmio_gsi[index];
    dev.devcfg = dev.mmio + VIRTIO_MMIO_CONFIG;
    if (mem_read(dev.mmio + VIRTIO_MMIO_MAGIC_VALUE, 4) != VIRTIO_MMIO_MAGIC ||
        mem_read(dev.mmio + VIRTIO_MMIO_VERSION, 4) != 2 ||
        mem_read(dev.mmio + VIRTIO_MMIO_DEVICE_ID, 4) != VIRTIO_ID_NET)
        return STATUS_DEVICE_ERROR;
    return STATUS_OK;
}

static void mmio_set_status(u32 s) { mem_write(dev.mmio + VIRTIO_MMIO_STATUS, 4, s); }
static u32 mmio_get_status(void) { return (u32)mem_read(dev.mmio + VIRTIO_MMIO_STATUS, 4); }

static u32 mmio_device_features(u32 sel)
{
    mem_write(dev.mmio + VIRTIO_MMIO_DEVICE_FEATURES_SEL, 4, sel);
    return (u32)mem_read(dev.mmio + VIRTIO_MMIO_DEVICE_FEATURES, 4);
}

static void mmio_driver_features(u32 sel, u32 w)
{
    mem_write(dev.mmio + VIRTIO_MMIO_DRIVER_FEATURES_SEL, 4, sel);
    mem_write(dev.mmio + VIRTIO_MMIO_DRIVER_FEATURES, 4, w);
}

static u64 mmio_legacy_features(void)
{
    return (dev.flags & RR_FLAG_DOORBELLS) ? 1ull << VIRTIO_F_MMIO_NOTIFY : 0;
}

static u64 mmio_msi_features(void) { return mmio_legacy_features() | 1ull << VIRTIO_F_MMIO_MSI; }

/* The line: its handler (entry.S) reads InterruptStatus and writes InterruptACK. */
static void mmio_legacy_interrupts(void)
{
    legacy_mmio_base = dev.mmio;
    ioapic_route(dev.gsi, (u32)IRQ_VECTOR_LEGACY);
    dev.rx_vector = (u32)IRQ_VECTOR_LEGACY;
}

static void mmio_msi_program(u32 k, u32 vector)
{
    u64 b = dev.mmio;
    mem_write(b + VIRTIO_MMIO_MSI_SEL, 4, k);
    mem_write(b + VIRTIO_MMIO_MSI_ADDRESS_LOW, 4, MSI_ADDRESS_BASE);
    mem_write(b + VIRTIO_MMIO_MSI_ADDRESS_HIGH, 4, 0);
    mem_write(b + VIRTIO_MMIO_MSI_DATA, 4, vector);
    mem_write(b + VIRTIO_MMIO_MSI_COMMAND, 4, VIRTIO_MMIO_MSI_CMD_UPDATE);
    mem_write(b + VIRTIO_MMIO_MSI_COMMAND, 4, VIRTIO_MMIO_MSI_CMD_UNMASK);
}

static void mmio_msi_interrupts(void)
{
    program_vectors(mmio_msi_program);
    mem_write(dev.mmio + VIRTIO_MMIO_CONFIG_MSI_VEC, 4, 2);
    mem_write(dev.mmio + VIRTIO_MMIO_MSI_CONTROL, 4, VIRTIO_MMIO_MSI_CTRL_ENABLE);
    ioapic_route(dev.gsi, 0); /* the line stays quiet */
}

static u16 mmio_queue_select(u16 index)
{
    mem_write(dev.mmio + VIRTIO_MMIO_QUEUE_SEL, 4, index);
    return (u16)mem_read(dev.mmio + VIRTIO_MMIO_QUEUE_NUM_MAX, 4);
}

static int mmio_legacy_queue_enable(struct vq *q, const u64 addr[3])
{
    u64 b = dev.mmio;
    mem_write(b + VIRTIO_MMIO_QUEUE_NUM, 4, q->size);
    for (int i = 0; i < 3; i++) {
        mem_write(b + VIRTIO_MMIO_QUEUE_DESC_LOW + 0x10 * (u64)i, 4, (u32)addr[i]);
        mem_write(b + VIRTIO_MMIO_QUEUE_DESC_HIGH + 0x10 * (u64)i, 4, (u32)(addr[i] >> 32));
    }
    q->notify = (dev.flags & RR_FLAG_DOORBELLS)
                    ? b + mem_read(b + VIRTIO_MMIO_QUEUE_NOTIFY_OFF, 4)
                    : b + VIRTIO_MMIO_QUEUE_NOTIFY;
    mem_write(b + VIRTIO_MMIO_QUEUE_READY, 4, 1);
    return mem_read(b + VIRTIO_MMIO_QUEUE_READY, 4) == 1;
}

/* As on the line, with the queue's MSI vector (its index) associated first. */
static int mmio_msi_queue_enable(struct vq *q, const u64 addr[3])
{
    mem_write(dev.mmio + VIRTIO_MMIO_QUEUE_MSI_VEC, 4, q->index);
    if (mem_read(dev.mmio + VIRTIO_MMIO_QUEUE_MSI_VEC, 4) != q->index)
        return 0;
    return mmio_legacy_queue_enable(q, addr);
}

static void mmio_notify(const struct vq *q) { mem_write(q->notify, 4, q->index); }

static void mmio_msi_mask(u32 k, int masked)
{
    mem_write(dev.mmio + VIRTIO_MMIO_MSI_SEL, 4, k);
    mem_write(dev.mmio + VIRTIO_MMIO_MSI_COMMAND, 4,
              masked ? VIRTIO_MMIO_MSI_CMD_MASK : VIRTIO_MMIO_MSI_CMD_UNMASK);
}

static int mmio_msi_pending(u32 k)
{
    mem_write(dev.mmio + VIRTIO_MMIO_MSI_SEL, 4, k);
    return (mem_read(dev.mmio + VIRTIO_MMIO_MSI_STATE, 4) & VIRTIO_MMIO_MSI_STATE_PENDING) != 0;
}

static const struct transport_ops mmio_legacy_ops = {
    .locate = mmio_locate,
    .set_status = mmio_set_status,
    .get_status = mmio_get_status,
    .device_features = mmio_device_features,
    .driver_features = mmio_driver_features,
    .features = mmio_legacy_features,
    .setup_interrupts = mmio_legacy_interrupts,
    .queue_select = mmio_queue_select,
    .queue_enable = mmio_legacy_queue_enable,
    .notify = mmio_notify,
    .msi_mask = 0,
    .msi_pending = 0,
};

static const struct transport_ops mmio_msi_ops = {
    .locate = mmio_locate,
    .set_status = mmio_set_status,
    .get_status = mmio_get_status,
    .device_features = mmio_device_features,
    .driver_features = mmio_driver_features,
    .features = mmio_msi_features,
    .setup_interrupts = mmio_msi_interrupts,
    .queue_select = mmio_queue_select,
    .queue_enable = mmio_msi_queue_enable,
    .notify = mmio_notify,
    .msi_mask = mmio_msi_mask,
    .msi_pending = mmio_msi_pending,
};

/* ---- virtio-pci (virtio 1.2 §4.1) with MSI-X ---- */

/* Address of memory BAR `bar` of `fn` (a 64-bit BAR takes the next slot too). */
static u64 pci_bar(u64 fn, u32 bar)
{
    u64 m = resolve_method(METHOD_AUTO);
    u64 reg = fn + PCI_BAR0 + 4 * bar;
    u32 lo = cfg_read(m, reg, 4);
    u64 hi = (lo & 6) == 4 && bar < 5 ? cfg_read(m, reg + 4, 4) : 0;
    return (lo & ~0xfull) | hi << 32;
}

/* Let the function master the bus (DMA and MSI-X messages), as a driver does before it uses
 * the device (PCI 3.0 §6.2.2); the read is free through the ECAM shadow. */
static void pci_enable_master(u64 fn)
{
    u64 m = resolve_method(METHOD_AUTO);
    u32 cmd = cfg_read(m, fn + PCI_COMMAND, 2);
    if (!(cmd & PCI_COMMAND_MASTER))
        cfg_write(m, fn + PCI_COMMAND, 2, cmd | PCI_COMMAND_MASTER);
}

/* A virtio network card: modern (virtio 1.2 §4.1.2.1) or transitional (§4.1.2.3, QEMU's). */
static int pci_is_virtio_net(u64 m, u64 fn)
{
    if (cfg_read(m, fn + PCI_VENDOR_ID, 2) != VIRTIO_PCI_VENDOR_ID)
        return 0;
    u32 device = cfg_read(m, fn + PCI_DEVICE_ID, 2);
    return device == VIRTIO_PCI_DEVICE_ID_BASE + VIRTIO_ID_NET ||
           (device == VIRTIO_PCI_TRANSITIONAL_NET_ID &&
            cfg_read(m, fn + PCI_SUBSYSTEM_ID, 2) == VIRTIO_ID_NET);
}

/* Find the virtio structures and MSI-X table of the function at `fn` (virtio 1.2 §4.1.4),
 * each in the BAR its capability names: exitless puts all in BAR 0, QEMU its MSI-X table in
 * BAR 1 and the virtio structures in BAR 4 (BAR 0 is its legacy I/O). */
static u64 pci_locate(u64 fn)
{
    u64 m = resolve_method(METHOD_AUTO);
    if (!pci_is_virtio_net(m, fn))
        return STATUS_DEVICE_ERROR;
    pci_enable_master(fn);
    dev.common = dev.msix_table = dev.notify_base = dev.devcfg = 0;
    u32 ptr = cfg_read(m, fn + PCI_CAPABILITY_LIST, 1) & 0xfc;
    for (int n = 0; ptr >= 0x40 && n < 48; n++) {
        u64 cap = fn + ptr;
        u32 id = cfg_read(m, cap, 1);
        /* Each structure names its BAR, 0 to 5, others reserved (virtio 1.2 §4.1.4):
         * exitless's are all in BAR 0, QEMU's in BAR 4. */
        u32 bar = cfg_read(m, cap + VIRTIO_PCI_CAP_BAR, 1);
        if (id == PCI_CAP_ID_VNDR && bar <= 5) {
            u64 at = pci_bar(fn, bar) + cfg_read(m, cap + VIRTIO_PCI_CAP_OFFSET, 4);
            switch (cfg_read(m, cap + VIRTIO_PCI_CAP_CFG_TYPE, 1)) {
            case VIRTIO_PCI_CAP_COMMON_CFG: dev.common = at; break;
            case VIRTIO_PCI_CAP_ISR_CFG: dev.isr = at; break;
            case VIRTIO_PCI_CAP_DEVICE_CFG: dev.devcfg = at; break;
            case VIRTIO_PCI_CAP_NOTIFY_CFG:
                dev.notify_base = at;
                dev.notify_mult = cfg_read(m, cap + VIRTIO_PCI_NOTIFY_CAP_MULT, 4);
                break;
            }
        } else if (id == PCI_CAP_ID_MSIX) {
            u32 table = cfg_read(m, cap + PCI_MSIX_TABLE, 4), pba = cfg_read(m, cap + PCI_MSIX_PBA, 4);
            if ((table & PCI_MSIX_BIR_MASK) > 5 || (pba & PCI_MSIX_BIR_MASK) > 5)
                break; /* a reserved BIR (PCI 3.0 §6.8.2.4): no usable table */
            dev.msix_table = pci_bar(fn, table & PCI_MSIX_BIR_MASK) + (table & ~PCI_MSIX_BIR_MASK);
            dev.msix_pba = pci_bar(fn, pba & PCI_MSIX_BIR_MASK) + (pba & ~PCI_MSIX_BIR_MASK);
            u32 control = cfg_read(m, cap + PCI_MSIX_FLAGS, 2);
            cfg_write(m, cap + PCI_MSIX_FLAGS, 2, control | PCI_MSIX_FLAGS_ENABLE);
        }
        ptr = cfg_read(m, cap + 1, 1) & 0xfc;
    }
    return dev.common && dev.msix_table && dev.notify_base ? STATUS_OK : STATUS_DEVICE_ERROR;
}

static void pci_set_status(u32 s) { mem_write(dev.common + VIRTIO_PCI_COMMON_STATUS, 1, s); }
static u32 pci_get_status(void) { return (u32)mem_read(dev.common + VIRTIO_PCI_COMMON_STATUS, 1); }

static u32 pci_device_features(u32 sel)
{
    mem_write(dev.common + VIRTIO_PCI_COMMON_DFSELECT, 4, sel);
    return (u32)mem_read(dev.common + VIRTIO_PCI_COMMON_DF, 4);
}

static void pci_driver_features(u32 sel, u32 w)
{
    mem_write(dev.common + VIRTIO_PCI_COMMON_GFSELECT, 4, sel);
    mem_write(dev.common + VIRTIO_PCI_COMMON_GF, 4, w);
}

static u64 pci_features(void) { return 0; }

static void pci_msix_program(u32 k, u32 vector)
{
    u64 e = dev.msix_table + (u64)k * PCI_MSIX_ENTRY_SIZE;
    mem_write(e + PCI_MSIX_ENTRY_LOWER_ADDR, 4, MSI_ADDRESS_BASE);
    mem_write(e + PCI_MSIX_ENTRY_UPPER_ADDR, 4, 0);
    mem_write(e + PCI_MSIX_ENTRY_DATA, 4, vector);
    mem_write(e + PCI_MSIX_ENTRY_VECTOR_CTRL, 4, 0);
}

static void pci_interrupts(void)
{
    program_vectors(pci_msix_program);
    mem_write(dev.common + VIRTIO_PCI_COMMON_MSIX, 2, 2);
}

static u16 pci_queue_select(u16 index)
{
    mem_write(dev.common + VIRTIO_PCI_COMMON_Q_SELECT, 2, index);
    return (u16)mem_read(dev.common + VIRTIO_PCI_COMMON_Q_SIZE, 2);
}

static int pci_queue_enable(struct vq *q, const u64 addr[3])
{
    u64 c = dev.common;
    mem_write(c + VIRTIO_PCI_COMMON_Q_SIZE, 2, q->size);
    for (int i = 0; i < 3; i++) {
        mem_write(c + VIRTIO_PCI_COMMON_Q_DESCLO + 8 * (u64)i, 4, (u32)addr[i]);
        mem_write(c + VIRTIO_PCI_COMMON_Q_DESCHI + 8 * (u64)i, 4, (u32)(addr[i] >> 32));
    }
    mem_write(c + VIRTIO_PCI_COMMON_Q_MSIX, 2, q->index);
    if (mem_read(c + VIRTIO_PCI_COMMON_Q_MSIX, 2) != q->index)
        return 0;
    q->notify = dev.notify_base + mem_read(c + VIRTIO_PCI_COMMON_Q_NOFF, 2) * dev.notify_mult;
    mem_write(c + VIRTIO_PCI_COMMON_Q_ENABLE, 2, 1);
    return mem_read(c + VIRTIO_PCI_COMMON_Q_ENABLE, 2) == 1;
}

static void pci_notify(const struct vq *q) { mem_write(q->notify, 2, q->index); }

static void pci_msix_mask(u32 k, int masked)
{
    mem_write(dev.msix_table + (u64)k * PCI_MSIX_ENTRY_SIZE + PCI_MSIX_ENTRY_VECTOR_CTRL, 4,
              masked ? PCI_MSIX_ENTRY_CTRL_MASKBIT : 0);
}

static int pci_msix_pending(u32 k)
{
    return (mem_read(dev.msix_pba + 4 * (k / 32), 4) >> (k % 32)) & 1;
}

static const struct transport_ops pci_msix_ops = {
    .locate = pci_locate,
    .set_status = pci_set_status,
    .get_status = pci_get_status,
    .device_features = pci_device_features,
    .driver_features = pci_driver_features,
    .features = pci_features,
    .setup_interrupts = pci_interrupts,
    .queue_select = pci_queue_select,
    .queue_enable = pci_queue_enable,
    .notify = pci_notify,
    .msi_mask = pci_msix_mask,
    .msi_pending = pci_msix_pending,
};

/* The table for a `TRANSPORT_*` and `RR_FLAG_*` pair, or 0. */
static const struct transport_ops *transport_ops(u64 transport, u64 flags)
{
    if (transport == TRANSPORT_PCI)
        return &pci_msix_ops;
    if (transport == TRANSPORT_MMIO)
        return (flags & RR_FLAG_MSI) ? &mmio_msi_ops : &mmio_legacy_ops;
    return 0;
}

/* ---- The driver, the same for every transport ---- */

static u64 get_features(void)
{
    return dev.ops->device_features(0) | (u64)dev.ops->device_features(1) << 32;
}

static void set_features(u64 f)
{
    dev.ops->driver_features(0, (u32)f);
    dev.ops->driver_features(1, (u32)(f >> 32));
}

static int setup_queue(struct vq *q, u16 index)
{
    q->index = index;
    if (dev.ops->queue_select(index) < QSIZE)
        return 0;
    q->size = QSIZE;
    q->avail_idx = q->last_used = 0;
    q->desc = dma_alloc(16 * QSIZE);
    q->avail = dma_alloc(6 + 2 * QSIZE);
    q->used = dma_alloc(6 + 8 * QSIZE);
    if (!q->desc || !q->avail || !q->used)
        return 0;
    u64 addr[3] = {(u64)q->desc, (u64)q->avail, (u64)q->used};
    const u64 len[3] = {16 * QSIZE, 6 + 2 * QSIZE, 6 + 8 * QSIZE};
    /* Behind the IOMMU the rings too are IOVAs: slot 0, one page per ring, for good. */
    for (u64 i = 0; dev.iommu && i < 3; i++)
        if (!(addr[i] = vtd_map_at(dev.iommu, 0, 3 * (u64)index + i, (void *)addr[i], len[i], 1)))
            return 0;
    return dev.ops->queue_enable(q, addr);
}

static volatile u16 *used_event(struct vq *q) { return &q->avail[2 + q->size]; }
static volatile u16 *avail_event(struct vq *q) { return (volatile u16 *)((volatile u8 *)q->used + 4 + 8 * q->size); }
static u16 used_idx(struct vq *q) { return q->used[1]; }

/* Make one buffer available and notify the device if it asked for it (event index,
 * virtio 1.2 §2.7.10: notify when the new index passes avail_event). */
/* The address the device is given for `buf`: behind the IOMMU, a fresh mapping of it
 * (recorded for descriptor `slot`, unmapped when the device returns it); flushing what is
 * pending when no IOVA is free, as an allocator that waits for the flush queue does. */
static u64 vq_map(struct vq *q, u16 slot, void *buf, u32 len, u16 flags)
{
    struct vtd_domain *d = dev.iommu;
    if (!d)
        return (u64)buf;
    if (!d->nfree)
        vtd_flush();
    if (!d->nfree)
        return 0; /* the device faults on it */
    u16 iova_slot = d->free[--d->nfree];
    q->iova_slot[slot] = iova_slot;
    q->iova_pages[slot] = (u8)vtd_pages(buf, len);
    return vtd_map_at(d, iova_slot, 0, buf, len, flags & VIRTQ_DESC_F_WRITE);
}

/* The device returned descriptor `slot`: unmap its buffer. */
static void vq_unmap(struct vq *q, u32 slot)
{
    slot %= QSIZE; /* the device wrote it: keep it in the table */
    if (dev.iommu && q->iova_slot[slot]) {
        vtd_unmap(dev.iommu, q->iova_slot[slot], q->iova_pages[slot]);
        q->iova_slot[slot] = 0;
    }
}

static void vq_post(struct vq *q, void *buf, u32 len, u16 flags)
{
    u16 slot = q->avail_idx % q->size;
    q->desc[slot].addr = vq_map(q, slot, buf, len, flags);
    q->desc[slot].len = len;
    q->desc[slot].flags = flags;
    q->desc[slot].next = 0;
    q->avail[2 + slot] = slot;
    u16 old = q->avail_idx++;
    __asm__ volatile("" ::: "memory");
    q->avail[1] = q->avail_idx;
    __asm__ volatile("mfence" ::: "memory"); /* publish idx before reading avail_event */
    u16 event = *avail_event(q);
    if ((u16)(q->avail_idx - event - 1) < (u16)(q->avail_idx - old))
        dev.ops->notify(q);
}

static void post_rx(void)
{
    *used_event(&dev.rx) = dev.rx.last_used; /* interrupt on the next receive */
    dev.rx_irqs = irq_counts[dev.rx_vector];
    vq_post(&dev.rx, dev.rx_buf, RR_RX_BUFFER_SIZE, VIRTQ_DESC_F_WRITE);
}

/* The used element `n` of `q`: the head it returns and the bytes written. */
static u32 used_id(struct vq *q, u16 n) { return *(volatile u32 *)((volatile u8 *)q->used + 4 + 8 * (n % q->size)); }
static u32 used_len(struct vq *q, u16 n) { return *(volatile u32 *)((volatile u8 *)q->used + 8 + 8 * (n % q->size)); }

/* Take back the transmit buffers the device returned; how many. */
static u64 reap_tx(void)
{
    u64 n = 0;
    for (u16 end = used_idx(&dev.tx); dev.tx.last_used != end; dev.tx.last_used++, n++)
        vq_unmap(&dev.tx, used_id(&dev.tx, dev.tx.last_used));
    return n;
}

static u64 device_irqs(void)
{
    u64 n = irq_counts[IRQ_VECTOR_LEGACY];
    for (u64 v = IRQ_VECTOR_BASE; v <= IRQ_VECTOR_BASE + IRQ_VECTOR_CONFIG; v++)
        n += irq_counts[v];
    return n;
}

/* Bring the device up as virtio 1.2 §3.1.1 orders it. */
static u64 virtio_init(u64 transport, u64 address, u64 flags)
{
    const struct transport_ops *ops = transport_ops(transport, flags);
    if (!ops)
        return STATUS_UNSUPPORTED;
    dev.ops = ops;
    dev.transport = transport;
    dev.address = address;
    dev.flags = flags;
    dev.ready = 0;
    dev.iommu = 0;
    dma_next = DMA_ADDR;
    if ((flags & RR_FLAG_IOMMU) && transport != TRANSPORT_PCI)
        return STATUS_UNSUPPORTED; /* only PCI functions have a source-id */
    u64 located = ops->locate(address);
    if (located != STATUS_OK)
        return located;
    ops->set_status(0);
    u64 deadline = tsc_timeout();
    while (ops->get_status() != 0) /* virtio-pci: reset completes when status reads 0 */
        if (rdtsc() > deadline)
            return STATUS_TIMEOUT;
    if (flags & RR_FLAG_IOMMU) {
        u64 up = vtd_init();
        if (up != STATUS_OK)
            return up;
        if (!(dev.iommu = vtd_domain(address)))
            return STATUS_DEVICE_ERROR;
        vtd_domain_reset(dev.iommu);
    }
    ops->set_status(VIRTIO_STATUS_ACKNOWLEDGE);
    ops->set_status(VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER);
    u64 want = (1ull << VIRTIO_F_VERSION_1) | (1ull << VIRTIO_F_EVENT_IDX) | ops->features();
    if (dev.iommu)
        want |= 1ull << VIRTIO_F_ACCESS_PLATFORM;
    u64 offered = get_features();
    if ((offered & want) != want)
        return STATUS_DEVICE_ERROR;
    want |= offered & (1ull << VIRTIO_NET_F_MAC); /* its address, if it has one */
    set_features(want);
    u32 s = VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK;
    ops->set_status(s);
    if (!(ops->get_status() & VIRTIO_STATUS_FEATURES_OK))
        return STATUS_DEVICE_ERROR;
    for (u64 i = 0; i < 6; i++) /* virtio_net_config.mac (virtio 1.2 §5.1.4) */
        dev.mac[i] = (want >> VIRTIO_NET_F_MAC & 1) ? (u8)mem_read(dev.devcfg + i, 1) : 0;
    ops->setup_interrupts();
    if (!setup_queue(&dev.rx, VIRTIO_NET_RX_QUEUE) || !setup_queue(&dev.tx, VIRTIO_NET_TX_QUEUE))
        return STATUS_DEVICE_ERROR;
    dev.rx_buf = dma_alloc(RR_RX_BUFFER_SIZE);
    dev.tx_buf = dma_alloc(VIRTIO_NET_HDR_SIZE + RR_MAX_REQUEST);
    dev.stream_buf = dma_alloc(QSIZE * NET_STREAM_FRAME_SIZE);
    for (u64 i = 0; i < QSIZE; i++)
        dev.rx.iova_slot[i] = dev.tx.iova_slot[i] = 0;
    ops->set_status(s | VIRTIO_STATUS_DRIVER_OK);
    if (ops->get_status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET)
        return STATUS_DEVICE_ERROR;
    post_rx();
    dev.ready = 1;
    return STATUS_OK;
}

/* Send the frame of `len` bytes at `dev.tx_buf` + the header, behind a header asking for
 * nothing (no checksum or segmentation offload, virtio 1.2 §5.1.6.2). */
static void send_frame(u64 len)
{
    for (u64 i = 0; i < VIRTIO_NET_HDR_SIZE; i++)
        dev.tx_buf[i] = 0;
    /* No interrupt for transmit completions: used_event far ahead of anything in flight. */
    *used_event(&dev.tx) = (u16)(dev.tx.avail_idx + 0x4000);
    vq_post(&dev.tx, dev.tx_buf, (u32)(VIRTIO_NET_HDR_SIZE + len), 0);
}

/* Send a request frame of `size` bytes derived from `seq`. */
static void send_request(u64 size, u64 seq)
{
    for (u64 i = 0; i < size; i++)
        dev.tx_buf[VIRTIO_NET_HDR_SIZE + i] = (u8)(seq * 7 + i);
    send_frame(size);
}

/* Take the used receive buffer: the length of the frame in it, 0 if the device wrote no more
 * than the header or more than the buffer holds (the length is the device's word). Read it,
 * then give the buffer back with post_rx(). */
static u64 take_frame(void)
{
    u32 len = used_len(&dev.rx, dev.rx.last_used);
    vq_unmap(&dev.rx, used_id(&dev.rx, dev.rx.last_used));
    dev.rx.last_used++;
    reap_tx();
    return len > VIRTIO_NET_HDR_SIZE && len <= RR_RX_BUFFER_SIZE ? len - VIRTIO_NET_HDR_SIZE : 0;
}

/* Take the response to the request of `size` bytes; check it; give the buffer back. */
static u64 take_response(u64 size, struct op_result *res)
{
    u64 len = take_frame();
    const u8 *req = dev.tx_buf + VIRTIO_NET_HDR_SIZE;
    const u8 *resp = dev.rx_buf + VIRTIO_NET_HDR_SIZE;
    u64 status = len ? STATUS_OK : STATUS_BAD_DATA;
    for (u64 i = 0; i < len; i++) {
        u8 want = (u8)(req[i % size] ^ 0xffu);
        if (resp[i] != want) {
            status = STATUS_BAD_DATA;
            break;
        }
    }
    res->bytes += len;
    post_rx();
    return status;
}

/* Wait until the receive queue has a used buffer and, if `irqs_before` is not ~0, until the
 * receive vector fired. */
static int wait_rx(u64 irqs_before)
{
    u64 deadline = tsc_timeout();
    while (used_idx(&dev.rx) == dev.rx.last_used ||
           (irqs_before != ~0ull && irq_counts[dev.rx_vector] == irqs_before)) {
        vtd_tick();
        if (rdtsc() > deadline)
            return 0;
    }
    return 1;
}

static void virtio_rr(const struct op *op, struct op_result *res)
{
    if (!dev.ready || op->size == 0 || op->size > RR_MAX_REQUEST) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    u64 rx_before = irq_counts[dev.rx_vector], all_before = device_irqs();
    for (u64 i = 0; i < op->count; i++) {
        u64 irqs = irq_counts[dev.rx_vector];
        send_request(op->size, i);
        if (!wait_rx(irqs)) {
            res->status = STATUS_TIMEOUT;
            break;
        }
        res->status = take_response(op->size, res);
        if (res->status != STATUS_OK)
            break;
        res->value++;
    }
    res->irqs = irq_counts[dev.rx_vector] - rx_before;
    res->stray_irqs = device_irqs() - all_before - res->irqs;
}

/* When the running op's timed part began: ops with untimed set-up move it forward. */
static u64 op_start;

/* ---- ICMP echo with the host's kernel: RFC 792 in RFC 791 IPv4 in Ethernet II ---- */

#define ETH_HLEN 14
#define ETH_P_IPV4 0x0800
#define IPV4_HLEN 20 /* no options */
#define IPPROTO_ICMP 1
#define ICMP_HLEN 8
#define ICMP_ECHO_REPLY 0
#define ICMP_ECHO_REQUEST 8
#define ICMP_ECHO_ID 0x7865 /* RFC 792 leaves the identifier to the sender */

static u16 be16(const u8 *p) { return (u16)(p[0] << 8 | p[1]); }
static void put_be16(u8 *p, u64 v) { p[0] = (u8)(v >> 8); p[1] = (u8)v; }
static void put_be32(u8 *p, u64 v) { put_be16(p, v >> 16); put_be16(p + 2, v); }

static int bytes_equal(const u8 *a, const u8 *b, u64 n)
{
    for (u64 i = 0; i < n; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

/* Fold a sum of 16-bit words into the Internet checksum: the ones' complement of their ones'
 * complement sum (RFC 1071). */
static u16 csum_fold(u64 sum)
{
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return (u16)~sum;
}

static u16 inet_checksum(const u8 *p, u64 n)
{
    u64 sum = 0;
    for (u64 i = 0; i + 1 < n; i += 2)
        sum += be16(p + i);
    if (n & 1)
        sum += (u64)p[n - 1] << 8;
    return csum_fold(sum);
}

static u8 *tx_icmp(void) { return dev.tx_buf + VIRTIO_NET_HDR_SIZE + ETH_HLEN + IPV4_HLEN; }

/* Build the echo request once, before the timed loop: to the host's MAC (`value`), from the
 * guest's address to the host's (`address`), `size` bytes of data. The frame's length. */
static u64 icmp_build(const struct op *op, u64 size)
{
    u8 *f = dev.tx_buf + VIRTIO_NET_HDR_SIZE, *ip = f + ETH_HLEN, *icmp = tx_icmp();
    for (u64 i = 0; i < 6; i++) {
        f[i] = (u8)(op->value >> (40 - 8 * i));
        f[6 + i] = dev.mac[i];
    }
    put_be16(f + 12, ETH_P_IPV4);
    /* RFC 791 §3.1: version 4, five header words, routine service, an identification of 0 in
     * a datagram that Don't Fragment keeps whole (RFC 6864 §4.1), TTL 64. */
    ip[0] = 0x45;
    ip[1] = 0;
    put_be16(ip + 2, IPV4_HLEN + ICMP_HLEN + size);
    put_be16(ip + 4, 0);
    put_be16(ip + 6, 0x4000);
    ip[8] = 64;
    ip[9] = IPPROTO_ICMP;
    put_be16(ip + 10, 0);
    put_be32(ip + 12, op->address >> 32);
    put_be32(ip + 16, op->address);
    put_be16(ip + 10, inet_checksum(ip, IPV4_HLEN));
    icmp[0] = ICMP_ECHO_REQUEST;
    icmp[1] = 0;
    put_be16(icmp + 2, 0);
    put_be16(icmp + 4, ICMP_ECHO_ID);
    put_be16(icmp + 6, 0);
    for (u64 i = 0; i < size; i++)
        icmp[ICMP_HLEN + i] = (u8)(i * 7 + 1);
    put_be16(icmp + 2, inet_checksum(icmp, ICMP_HLEN + size));
    return ETH_HLEN + IPV4_HLEN + ICMP_HLEN + size;
}

/* Number the request `seq`, updating its checksum for that word alone (RFC 1624 eqn. 3:
 * HC' = ~(~HC + ~m + m')) instead of summing the data again. */
static void icmp_set_seq(u16 seq)
{
    u8 *icmp = tx_icmp();
    u64 sum = (u16)~be16(icmp + 2) + (u16)~be16(icmp + 6) + (u64)seq;
    put_be16(icmp + 6, seq);
    put_be16(icmp + 2, csum_fold(sum));
}

enum echo { ECHO_OTHER, ECHO_REPLY, ECHO_WRONG };

/* What the received frame of `len` bytes is to the request in flight with `size` bytes of
 * data: not an echo reply from the host to the guest with the probe's identifier (another
 * protocol, address or message: dropped), the request's reply, or a wrong one (RFC 792: the
 * reply carries the request's sequence number and data, code 0). The host is untrusted:
 * nothing is read past the lengths the frame and its IPv4 header give. */
static enum echo icmp_reply(u64 len, u64 size)
{
    const u8 *f = dev.rx_buf + VIRTIO_NET_HDR_SIZE, *ip = f + ETH_HLEN;
    const u8 *req = dev.tx_buf + VIRTIO_NET_HDR_SIZE, *req_ip = req + ETH_HLEN, *req_icmp = tx_icmp();
    if (len < ETH_HLEN + IPV4_HLEN || be16(f + 12) != ETH_P_IPV4 || ip[0] >> 4 != 4 ||
        ip[9] != IPPROTO_ICMP)
        return ECHO_OTHER;
    u64 ihl = (ip[0] & 0xfu) * 4, total = be16(ip + 2);
    if (ihl < IPV4_HLEN || total < ihl + ICMP_HLEN || ETH_HLEN + total > len)
        return ECHO_OTHER;
    const u8 *icmp = ip + ihl;
    if (!bytes_equal(ip + 12, req_ip + 16, 4) || !bytes_equal(ip + 16, req_ip + 12, 4) ||
        icmp[0] != ICMP_ECHO_REPLY || be16(icmp + 4) != ICMP_ECHO_ID)
        return ECHO_OTHER;
    if (total != ihl + ICMP_HLEN + size || !bytes_equal(f, dev.mac, 6) || icmp[1] != 0 ||
        be16(icmp + 6) != be16(req_icmp + 6) ||
        !bytes_equal(icmp + ICMP_HLEN, req_icmp + ICMP_HLEN, size))
        return ECHO_WRONG;
    return ECHO_REPLY;
}

/* OP_ICMP_ECHO: `count` echo requests to the host's kernel, each reply awaited on the receive
 * interrupt; the frame is built before the timed part, each request renumbered in it. */
static void icmp_echo(const struct op *op, struct op_result *res)
{
    u64 size = op->size;
    if (!dev.ready || bytes_equal(dev.mac, (const u8 *)"\0\0\0\0\0\0", 6) || size > ICMP_MAX_PAYLOAD) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    u64 len = icmp_build(op, size);
    u64 rx_before = irq_counts[dev.rx_vector], all_before = device_irqs();
    op_start = rdtsc();
    for (u64 i = 0; i < op->count; i++) {
        icmp_set_seq((u16)i);
        u64 deadline = tsc_timeout();
        send_frame(len);
        enum echo got = ECHO_OTHER;
        /* The posted buffer's interrupt, whatever came before: frames other than the reply
         * (the host's IPv6 chatter on a new link) are dropped until the time is up. */
        while (got == ECHO_OTHER && wait_rx(dev.rx_irqs)) {
            got = icmp_reply(take_frame(), size);
            post_rx();
            if (rdtsc() > deadline)
                break;
        }
        if (got != ECHO_REPLY) {
            res->status = got == ECHO_WRONG ? STATUS_BAD_DATA : STATUS_TIMEOUT;
            break;
        }
        res->bytes += size;
        res->value++;
    }
    res->irqs = irq_counts[dev.rx_vector] - rx_before;
    res->stray_irqs = device_irqs() - all_before - res->irqs;
}

/* Masking (PCI 3.0 §6.8.2.9 and docs/virtio-mmio-msi.md): a message due while the vector is
 * masked sets its pending bit and is sent at unmask. */
static void virtio_mask_pending(const struct op *op, struct op_result *res)
{
    if (!dev.ready || !is_msi()) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    u64 size = op->size ? op->size : 32;
    u64 irqs = irq_counts[dev.rx_vector];
    dev.ops->msi_mask(VIRTIO_NET_RX_QUEUE, 1);
    send_request(size, 1);
    res->status = STATUS_MASK_BROKEN;
    if (!wait_rx(~0ull))
        return;
    u64 deadline = tsc_timeout();
    while (!dev.ops->msi_pending(VIRTIO_NET_RX_QUEUE))
        if (rdtsc() > deadline)
            return;
    if (irq_counts[dev.rx_vector] != irqs)
        return;
    dev.ops->msi_mask(VIRTIO_NET_RX_QUEUE, 0);
    deadline = tsc_timeout();
    while (irq_counts[dev.rx_vector] == irqs)
        if (rdtsc() > deadline)
            return;
    if (dev.ops->msi_pending(VIRTIO_NET_RX_QUEUE))
        return;
    res->irqs = irq_counts[dev.rx_vector] - irqs;
    res->status = take_response(size, res);
    res->value = res->status == STATUS_OK;
}

/* ---- MSI-X on any PCI function (PCI 3.0 §6.8.2) ---- */

#define MSIX_MAX_ENTRIES 2048

struct msix_fn {
    u64 control;          /* config address of Message Control */
    u64 table, pba;       /* guest-physical */
    u32 entries;
};

/* What the last check (or program) left: interrupt counts and pending bits. */
static u64 msix_seen[256];
static u8 msix_was_pending[MSIX_MAX_ENTRIES];

static int msix_locate(u64 fn, struct msix_fn *x)
{
    u64 m = resolve_method(METHOD_AUTO);
    if (cfg_read(m, fn + PCI_VENDOR_ID, 2) == 0xffff)
        return 0;
    u32 ptr = cfg_read(m, fn + PCI_CAPABILITY_LIST, 1) & 0xfc;
    for (int n = 0; ptr >= 0x40 && n < 48; n++) {
        u64 cap = fn + ptr;
        if (cfg_read(m, cap, 1) == PCI_CAP_ID_MSIX) {
            u32 table = cfg_read(m, cap + PCI_MSIX_TABLE, 4);
            u32 pba = cfg_read(m, cap + PCI_MSIX_PBA, 4);
            x->control = cap + PCI_MSIX_FLAGS;
            x->entries = (cfg_read(m, x->control, 2) & PCI_MSIX_FLAGS_QSIZE) + 1;
            x->table = pci_bar(fn, table & PCI_MSIX_BIR_MASK) + (table & ~PCI_MSIX_BIR_MASK);
            x->pba = pci_bar(fn, pba & PCI_MSIX_BIR_MASK) + (pba & ~PCI_MSIX_BIR_MASK);
            pci_enable_master(fn);
            return 1;
        }
        ptr = cfg_read(m, cap + 1, 1) & 0xfc;
    }
    return 0;
}

static u64 msix_entry(const struct msix_fn *x, u32 i, u32 field)
{
    return x->table + (u64)i * PCI_MSIX_ENTRY_SIZE + field;
}

static int msix_pending(const struct msix_fn *x, u32 i)
{
    return (mem_read(x->pba + 4 * (i / 32), 4) >> (i % 32)) & 1;
}

static void msix_remember(const struct msix_fn *x)
{
    for (u32 v = 0; v < 256; v++)
        msix_seen[v] = irq_counts[v];
    for (u32 i = 0; i < x->entries; i++)
        msix_was_pending[i] = (u8)msix_pending(x, i);
}

/* Whether the CPU takes this message (the VMM must drop any other: it goes nowhere). */
static int msi_deliverable(u32 lo, u32 hi, u32 data)
{
    return (lo & MSI_ADDRESS_MASK) == MSI_ADDRESS_BASE && hi == 0 && (data & 0xff) >= 16;
}

/* Spin for about `us` microseconds. */
static void spin_us(u64 us)
{
    u64 until = rdtsc() + us * (boot->tsc_khz ? boot->tsc_khz : 3000000) / 1000;
    while (rdtsc() < until)
        ;
}

/* Interrupts since `before`, on vector `v` and on all others. */
static void count_since(const u64 *before, u32 v, u64 *on_v, u64 *elsewhere)
{
    *on_v = *elsewhere = 0;
    for (u32 w = 0; w < 256; w++) {
        u64 n = irq_counts[w] - before[w];
        if (w == v)
            *on_v += n;
        else
            *elsewhere += n;
    }
}

static void msix_check(const struct msix_fn *x, const struct op *op, struct op_result *res)
{
    static u32 vector[MSIX_MAX_ENTRIES];
    static u8 live[MSIX_MAX_ENTRIES];
    u64 m = resolve_method(METHOD_AUTO);
    u32 control = cfg_read(m, x->control, 2);
    int fn_live = (control & PCI_MSIX_FLAGS_ENABLE) && !(control & PCI_MSIX_FLAGS_MASKALL);
    u64 expect[256], before[256], start[256], counted = 0;
    for (u32 v = 0; v < 256; v++)
        expect[v] = 0;
    for (u32 i = 0; i < x->entries; i++) {
        u32 lo = (u32)mem_read(msix_entry(x, i, PCI_MSIX_ENTRY_LOWER_ADDR), 4);
        u32 hi = (u32)mem_read(msix_entry(x, i, PCI_MSIX_ENTRY_UPPER_ADDR), 4);
        u32 data = (u32)mem_read(msix_entry(x, i, PCI_MSIX_ENTRY_DATA), 4);
        u32 ctrl = (u32)mem_read(msix_entry(x, i, PCI_MSIX_ENTRY_VECTOR_CTRL), 4);
        vector[i] = data & 0xff;
        live[i] = fn_live && !(ctrl & PCI_MSIX_ENTRY_CTRL_MASKBIT);
        /* A message the CPU does not take must be dropped, not sent anywhere. */
        if (live[i] && msix_was_pending[i] && msi_deliverable(lo, hi, data))
            expect[vector[i]]++;
        if (!msi_deliverable(lo, hi, data))
            vector[i] = 256;
    }
    /* Messages left pending at the last check and unmasked since: each arrived once. */
    spin_us(1000);
    u64 wrong = 0;
    for (u32 v = 0; v < 256; v++) {
        u64 got = irq_counts[v] - msix_seen[v];
        res->irqs += got < expect[v] ? got : expect[v];
        if (got > expect[v])
            res->stray_irqs += got - expect[v];
        wrong += got != expect[v];
        start[v] = irq_counts[v];
    }
    /* Then, if asked, one vector at a time: it must arrive on its own IDT vector and nowhere
     * else, or, held back, show its pending bit. */
    for (u32 i = 0; i < x->entries; i++) {
        int ok = 1;
        if (op->count) {
            for (u32 v = 0; v < 256; v++)
                before[v] = irq_counts[v];
            outl(PORT_MSIX_SEND, (u32)op->address | i);
            u64 on_v, elsewhere, deadline = tsc_timeout();
            int expected = live[i] && vector[i] < 256;
            if (expected)
                do
                    count_since(before, vector[i], &on_v, &elsewhere);
                while (on_v == 0 && rdtsc() < deadline);
            else
                spin_us(50);
            count_since(before, vector[i], &on_v, &elsewhere);
            ok = on_v == (u64)expected && elsewhere == 0;
            counted += on_v + elsewhere;
            res->irqs += on_v;
            res->stray_irqs += elsewhere + (on_v > (u64)expected ? on_v - 1 : 0);
            if (!live[i] && !msix_pending(x, i))
                ok = 0;
        }
        res->value += ok;
    }
    /* Anything arriving late is misdirected too. */
    spin_us(1000);
    u64 total = 0;
    for (u32 v = 0; v < 256; v++)
        total += irq_counts[v] - start[v];
    res->stray_irqs += total - counted;
    if (wrong || res->stray_irqs || res->value != x->entries)
        res->status = STATUS_BAD_DATA;
    msix_remember(x);
}

/* Message data of entry i for a table programmed from IDT vector `first`: first + i, wrapping
 * within first..0xff, so a table with more entries than vectors above `first` reuses them
 * instead of reaching the exception and legacy vectors below. */
static u32 msix_data(u64 first, u32 i)
{
    u32 span = first < 0x100 ? 0x100 - (u32)first : 1;
    return (u32)first + i % span;
}

/* Time requests for interrupts, each waited for on its own IDT vector (OP_MSIX_LATENCY). The
 * vectors are read from the table before the clock starts; only the request (one port exit)
 * and the wait for the handler are timed. */
static void msix_latency(const struct msix_fn *x, const struct op *op, struct op_result *res)
{
    static u32 vector[MSIX_MAX_ENTRIES];
    u64 first = op->value, n = op->size ? op->size : 1;
    if (first >= x->entries || n > x->entries - first) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    for (u64 i = first; i < first + n; i++)
        vector[i] = (u32)mem_read(msix_entry(x, (u32)i, PCI_MSIX_ENTRY_DATA), 4) & 0xff;
    op_start = rdtsc();
    for (u64 round = 0; round < op->count && res->status == STATUS_OK; round++) {
        for (u64 i = first; i < first + n; i++) {
            u64 before = irq_counts[vector[i]];
            u64 deadline = tsc_timeout(); /* per request: a long op is not a late interrupt */
            outl(PORT_MSIX_SEND, (u32)op->address | (u32)i);
            res->value++;
            while (irq_counts[vector[i]] == before && rdtsc() < deadline)
                ;
            if (irq_counts[vector[i]] == before) {
                res->status = STATUS_TIMEOUT;
                break;
            }
            res->irqs++;
        }
    }
    /* These interrupts were asked for: the next OP_MSIX_CHECK counts from here. */
    for (u32 v = 0; v < 256; v++)
        msix_seen[v] = irq_counts[v];
}

static void msix_op(const struct op *op, struct op_result *res)
{
    struct msix_fn x;
    if (!msix_locate(op->address, &x) || x.entries > MSIX_MAX_ENTRIES) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    u64 m = resolve_method(METHOD_AUTO);
    switch (op->kind) {
    case OP_MSIX_PROGRAM:
        cfg_write(m, x.control, 2, cfg_read(m, x.control, 2) & ~(u32)PCI_MSIX_FLAGS_ENABLE);
        op_start = rdtsc();
        for (u32 i = 0; i < x.entries; i++) {
            mem_write(msix_entry(&x, i, PCI_MSIX_ENTRY_LOWER_ADDR), 4, op->size ? op->size : MSI_ADDRESS_BASE);
            mem_write(msix_entry(&x, i, PCI_MSIX_ENTRY_UPPER_ADDR), 4, 0);
            mem_write(msix_entry(&x, i, PCI_MSIX_ENTRY_DATA), 4, msix_data(op->value, i));
            mem_write(msix_entry(&x, i, PCI_MSIX_ENTRY_VECTOR_CTRL), 4,
                      op->count == 1 ? 0 : PCI_MSIX_ENTRY_CTRL_MASKBIT);
        }
        res->value = x.entries;
        msix_remember(&x);
        break;
    case OP_MSIX_CONTROL:
        op_start = rdtsc();
        cfg_write(m, x.control, 2, (u32)op->value);
        break;
    case OP_MSIX_MASK_EACH:
        for (u32 i = 0; i < x.entries; i++)
            mem_write(msix_entry(&x, i, PCI_MSIX_ENTRY_VECTOR_CTRL), 4,
                      op->value ? PCI_MSIX_ENTRY_CTRL_MASKBIT : 0);
        res->value = x.entries;
        break;
    case OP_MSIX_RETARGET:
        for (u32 i = 0; i < x.entries; i++) {
            mem_write(msix_entry(&x, i, PCI_MSIX_ENTRY_LOWER_ADDR), 4, MSI_ADDRESS_BASE);
            mem_write(msix_entry(&x, i, PCI_MSIX_ENTRY_DATA), 4, msix_data(op->value, i));
        }
        res->value = x.entries;
        break;
    case OP_MSIX_CHECK:
        msix_check(&x, op, res);
        break;
    case OP_MSIX_LATENCY:
        msix_latency(&x, op, res);
        break;
    }
}

/* ---- The hostile burst (OP_HOSTILE): what an untrusted guest may do to every device ----
 *
 * Random accesses of every width at any offset and value, from a seed, into every device
 * window, config space by both mechanisms, BAR moves, decode and bus-master toggles, resets
 * with requests in flight, random descriptor chains and random MSI messages. The probe must
 * survive its own attack to report on it, so two kinds of value are tamed, and only where a
 * device would act on them: registers that hold a DMA address (ring addresses, descriptor
 * buffers) point into HOSTILE_DMA_ADDR's area, straddle the end of RAM or lie outside RAM,
 * never at the probe's code, stacks or tables; MSI data never names an exception vector or a
 * delivery mode that takes the vCPU away (SMI, NMI, INIT). Every other value is raw. */

static u64 rng_state;

static u64 rnd(void) /* xorshift64* */
{
    u64 x = rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545f4914f6cdd1dull;
}

static u64 below(u64 n) { return rnd() % n; }

/* MSI data the probe survives: vector 0x20 or above (0..31 are exceptions, which end the
 * run), and not SMI (2), NMI (4) or INIT (5); the reserved modes and ExtINT stay, for the
 * VMM to drop. */
static u32 msi_safe(u32 d)
{
    u32 mode = (d >> MSI_DATA_DELIVERY_MODE_SHIFT) & 7;
    if (mode == MSI_DELIVERY_SMI)
        d ^= 1u << MSI_DATA_DELIVERY_MODE_SHIFT;    /* → reserved 3 */
    else if (mode == MSI_DELIVERY_NMI || mode == MSI_DELIVERY_INIT)
        d ^= 2u << MSI_DATA_DELIVERY_MODE_SHIFT;    /* → reserved 6, ExtINT 7 */
    if ((d & 0xff) < 0x20)
        d |= 0x20;
    return d;
}

/* A DMA address no device can hurt the probe with; also safe as MSI data. */
static u32 dma_address(void)
{
    u64 a;
    switch (below(4)) {
    case 0:
        a = HOSTILE_DMA_ADDR + HOSTILE_DMA_SIZE - below(0x100); /* straddles the end of RAM */
        break;
    case 1:
        a = HOSTILE_OUTSIDE_RAM + below(0x100000000ull - HOSTILE_OUTSIDE_RAM);
        break;
    default:
        a = HOSTILE_DMA_ADDR + below(HOSTILE_DMA_SIZE);
        break;
    }
    return msi_safe((u32)a);
}

enum { TAME_NONE, TAME_DMA, TAME_MSI };

static int overlaps(u64 off, u64 size, u64 reg) { return off < reg + 4 && reg < off + size; }

#define HOSTILE_MAX_PCI 8

/* A virtio-pci function as firmware left it: restored after every burst. */
struct hostile_fn {
    u64 fn;                      /* ECAM-style address */
    u32 bars[6], command, msix_control;
    u64 bar0;
    u64 common, msix_table;      /* offsets in BAR 0 */
    u64 msix_entries, pci_cfg;   /* pci_cfg: the capability's config offset */
};

static struct hostile_fn hostile_fns[HOSTILE_MAX_PCI];
static u64 hostile_fn_count;
static int hostile_found;

/* The register a write of `size` bytes at `off` of a virtio-mmio window would change that
 * must be tamed, if any. */
static int mmio_tamed(u64 off, u64 size, u64 *reg)
{
    static const u32 dma[] = {VIRTIO_MMIO_QUEUE_DESC_LOW, VIRTIO_MMIO_QUEUE_AVAIL_LOW,
                              VIRTIO_MMIO_QUEUE_USED_LOW};
    for (int i = 0; i < 3; i++)
        if (overlaps(off, size, dma[i]))
            return *reg = dma[i], TAME_DMA;
    if (overlaps(off, size, VIRTIO_MMIO_MSI_DATA))
        return *reg = VIRTIO_MMIO_MSI_DATA, TAME_MSI;
    return TAME_NONE;
}

/* The same for BAR 0 of a virtio-pci function: ring addresses and MSI-X message data. */
static int pci_tamed(const struct hostile_fn *f, u64 off, u64 size, u64 *reg)
{
    static const u32 dma[] = {VIRTIO_PCI_COMMON_Q_DESCLO, VIRTIO_PCI_COMMON_Q_AVAILLO,
                              VIRTIO_PCI_COMMON_Q_USEDLO};
    for (int i = 0; i < 3; i++)
        if (overlaps(off, size, f->common + dma[i]))
            return *reg = f->common + dma[i], TAME_DMA;
    u64 end = f->msix_table + f->msix_entries * PCI_MSIX_ENTRY_SIZE;
    for (u64 e = f->msix_table; e < end; e += PCI_MSIX_ENTRY_SIZE)
        if (overlaps(off, size, e + PCI_MSIX_ENTRY_DATA))
            return *reg = e + PCI_MSIX_ENTRY_DATA, TAME_MSI;
    return TAME_NONE;
}

static u64 random_value(u64 size)
{
    u64 v = rnd();
    switch (below(4)) { /* small values and all-ones reach more register semantics */
    case 0: v &= 0xff; break;
    case 1: v = ~0ull; break;
    default: break;
    }
    return size == 8 ? v : v & ((1ull << (8 * size)) - 1);
}

static u64 random_width(void) { return 1ull << below(4); }

/* One write into a device window, tamed where `tame` says. */
static void window_write(u64 base, u64 off, u64 size, int tame, u64 reg)
{
    if (tame == TAME_NONE)
        mem_write(base + off, size, random_value(size));
    else
        mem_write(base + reg, 4, tame == TAME_DMA ? dma_address() : msi_safe((u32)rnd()));
}

/* Find the virtio-pci functions on bus 0 and remember what firmware assigned them. */
static void hostile_find(void)
{
    u64 m = resolve_method(METHOD_AUTO);
    hostile_found = 1;
    for (u64 d = 0; d < 32 && hostile_fn_count < HOSTILE_MAX_PCI; d++) {
        u64 fn = d << ECAM_DEVICE_SHIFT;
        if (cfg_read(m, fn + PCI_VENDOR_ID, 2) != VIRTIO_PCI_VENDOR_ID)
            continue;
        struct hostile_fn *f = &hostile_fns[hostile_fn_count++];
        f->fn = fn;
        for (u32 i = 0; i < 6; i++)
            f->bars[i] = cfg_read(m, fn + PCI_BAR0 + 4 * i, 4);
        f->command = cfg_read(m, fn + PCI_COMMAND, 2) | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
        f->bar0 = pci_bar(fn, 0);
        u32 ptr = cfg_read(m, fn + PCI_CAPABILITY_LIST, 1) & 0xfc;
        for (int n = 0; ptr >= 0x40 && n < 48; n++) {
            u64 cap = fn + ptr;
            u32 id = cfg_read(m, cap, 1);
            if (id == PCI_CAP_ID_VNDR) {
                u32 type = cfg_read(m, cap + VIRTIO_PCI_CAP_CFG_TYPE, 1);
                if (type == VIRTIO_PCI_CAP_COMMON_CFG)
                    f->common = cfg_read(m, cap + VIRTIO_PCI_CAP_OFFSET, 4);
                else if (type == VIRTIO_PCI_CAP_PCI_CFG)
                    f->pci_cfg = ptr;
            } else if (id == PCI_CAP_ID_MSIX) {
                f->msix_table = cfg_read(m, cap + PCI_MSIX_TABLE, 4) & ~PCI_MSIX_BIR_MASK;
                f->msix_control = ptr + PCI_MSIX_FLAGS;
                f->msix_entries = (cfg_read(m, cap + PCI_MSIX_FLAGS, 2) & PCI_MSIX_FLAGS_QSIZE) + 1;
            }
            ptr = cfg_read(m, cap + 1, 1) & 0xfc;
        }
    }
}

/* Put every virtio-pci function back as firmware left it, as a driver's probe expects:
 * BARs, decode and bus mastering, MSI-X enabled with the function unmasked. */
static void hostile_restore(void)
{
    u64 m = resolve_method(METHOD_AUTO);
    for (u64 k = 0; k < hostile_fn_count; k++) {
        const struct hostile_fn *f = &hostile_fns[k];
        for (u32 i = 0; i < 6; i++)
            cfg_write(m, f->fn + PCI_BAR0 + 4 * i, 4, f->bars[i]);
        cfg_write(m, f->fn + PCI_COMMAND, 2, f->command);
        cfg_write(m, f->fn + f->msix_control, 2, PCI_MSIX_FLAGS_ENABLE);
    }
}

/* A random write or read of any width at any offset of a random device window. */
static void hostile_window(void)
{
    u64 n = boot->virtio_mmio_count + hostile_fn_count;
    if (n == 0)
        return;
    u64 pick = below(n), size = random_width(), reg = 0;
    int write = below(2);
    if (pick < boot->virtio_mmio_count) {
        u64 base = boot->virtio_mmio_base[pick], off = below(VIRTIO_MMIO_WINDOW_SIZE);
        if (write)
            window_write(base, off, size, mmio_tamed(off, size, &reg), reg);
        else
            mem_read(base + off, size);
        return;
    }
    const struct hostile_fn *f = &hostile_fns[pick - boot->virtio_mmio_count];
    u64 off = below(VIRTIO_PCI_BAR_SIZE);
    if (write)
        window_write(f->bar0, off, size, pci_tamed(f, off, size, &reg), reg);
    else
        mem_read(f->bar0 + off, size);
}

/* A random config access by either mechanism to a virtio function, the host bridge or a
 * function that is not there. Writes into a pci_cfg capability go through hostile_pci_cfg,
 * which tames what the window reaches. */
static void hostile_config(void)
{
    u64 fn;
    switch (below(4)) {
    case 0: fn = 0; break; /* the host bridge */
    case 1: fn = below(256) << ECAM_FUNCTION_SHIFT; break;
    default: fn = hostile_fn_count ? hostile_fns[below(hostile_fn_count)].fn : 0; break;
    }
    u64 size = 1ull << below(3), write = below(2);
    if (ecam_described() && below(2)) {
        u64 off = below(PCI_CFG_SPACE_EXP_SIZE); /* any alignment: accesses may straddle */
        for (u64 k = 0; k < hostile_fn_count; k++) {
            const struct hostile_fn *f = &hostile_fns[k];
            if (write && f->fn == fn && f->pci_cfg && off < f->pci_cfg + 20 && f->pci_cfg < off + size)
                write = 0;
        }
        u64 at = ecam_address(fn) + off;
        if (write)
            mem_write(at, size, random_value(size));
        else
            mem_read(at, size);
        return;
    }
    /* Mechanism #1 with a raw CONFIG_ADDRESS: enable bit, reserved bits, any register. */
    u32 address = (u32)rnd();
    u64 reg = address & 0xfc;
    for (u64 k = 0; k < hostile_fn_count; k++) {
        const struct hostile_fn *f = &hostile_fns[k];
        if (((address >> 8) & 0xffff) == (f->fn >> ECAM_FUNCTION_SHIFT) && f->pci_cfg &&
            reg + 4 > f->pci_cfg && reg < f->pci_cfg + 20)
            write = 0;
    }
    outl(PCI_CONFIG_ADDRESS_PORT, address);
    u16 port = (u16)(PCI_CONFIG_DATA_PORT + below(4));
    u32 v = (u32)rnd();
    switch (size | write << 4) {
    case 1: inb(port); break;
    case 2: inw(port); break;
    case 4: inl(port); break;
    case 0x11: outb(port, (u8)v); break;
    case 0x12: outw(port, (u16)v); break;
    default: outl(port, v); break;
    }
}

/* The pci_cfg window (virtio 1.2 §4.1.4.9): point it anywhere in BAR 0, then read or write
 * through it, tamed as a direct write would be. */
static void hostile_pci_cfg(const struct hostile_fn *f)
{
    u64 m = resolve_method(METHOD_AUTO), reg = 0;
    u64 size = 1ull << below(3), off = below(VIRTIO_PCI_BAR_SIZE);
    int tame = pci_tamed(f, off, size, &reg);
    if (tame != TAME_NONE)
        off = reg, size = 4;
    u64 cap = f->fn + f->pci_cfg;
    cfg_write(m, cap + VIRTIO_PCI_CAP_BAR, 1, below(8) ? 0 : (u32)below(256));
    cfg_write(m, cap + VIRTIO_PCI_CAP_OFFSET, 4, (u32)off);
    cfg_write(m, cap + VIRTIO_PCI_CAP_LENGTH, 4, below(8) ? (u32)size : (u32)rnd());
    u32 v = tame == TAME_DMA ? dma_address() : tame == TAME_MSI ? msi_safe((u32)rnd()) : (u32)rnd();
    if (below(2))
        cfg_write(m, cap + VIRTIO_PCI_CAP_PCI_CFG_DATA, 4, v);
    else
        cfg_read(m, cap + VIRTIO_PCI_CAP_PCI_CFG_DATA, 4);
}

/* Move BAR 0 of a function over another's, over RAM, over the ECAM window, over a
 * virtio-mmio window, or anywhere; or toggle its decode and bus mastering. */
static void hostile_bar(const struct hostile_fn *f)
{
    u64 m = resolve_method(METHOD_AUTO);
    if (below(2)) {
        cfg_write(m, f->fn + PCI_COMMAND, 2, (u32)rnd());
        return;
    }
    u64 to;
    switch (below(5)) {
    case 0: to = hostile_fns[below(hostile_fn_count)].bar0; break;
    case 1: to = below(HOSTILE_DMA_ADDR + HOSTILE_DMA_SIZE); break;
    case 2: to = boot->ecam_base; break;
    case 3: to = boot->virtio_mmio_count ? boot->virtio_mmio_base[0] : 0; break;
    default: to = rnd(); break;
    }
    cfg_write(m, f->fn + PCI_BAR0, 4, (u32)to);
    if ((f->bars[0] & 6) == 4)
        cfg_write(m, f->fn + PCI_BAR0 + 4, 4, (u32)(to >> 32));
}

/* The driven device (the last OP_VIRTIO_INIT): random chains on its rings, a reset or a bus
 * master change with a request in flight, or a doorbell with any value. */
static void hostile_device(struct op_result *res)
{
    if (!dev.ready)
        return;
    switch (below(4)) {
    case 0: {
        struct vq *q = below(2) ? &dev.rx : &dev.tx;
        for (u64 i = below(q->size) + 1; i; i--) {
            u16 slot = (u16)below(q->size);
            q->desc[slot].addr = below(8) ? dma_address() : rnd();
            q->desc[slot].len = (u32)(below(2) ? below(0x2000) : rnd());
            q->desc[slot].flags = (u16)rnd();
            q->desc[slot].next = (u16)(below(4) ? below(q->size) : rnd());
            q->avail[2 + below(q->size)] = (u16)(below(4) ? slot : rnd());
        }
        q->avail[1] = (u16)(q->avail[1] + below(2 * q->size));
        __asm__ volatile("mfence" ::: "memory");
        dev.ops->notify(q);
        break;
    }
    case 1:
        send_request(32, rnd());
        dev.ops->set_status(0);
        res->resets++;
        dev.ready = 0;
        break;
    case 2:
        if (dev.transport == TRANSPORT_PCI) {
            u64 m = resolve_method(METHOD_AUTO);
            u32 cmd = cfg_read(m, dev.address + PCI_COMMAND, 2);
            send_request(32, rnd());
            cfg_write(m, dev.address + PCI_COMMAND, 2, cmd & ~PCI_COMMAND_MASTER);
            dev.ops->notify(&dev.tx);
            if (below(2))
                cfg_write(m, dev.address + PCI_COMMAND, 2, cmd);
        }
        break;
    default:
        mem_write(below(2) ? dev.rx.notify : dev.tx.notify, random_width(), random_value(8));
        break;
    }
}

/* A random MSI message in a random vector of any device. */
static void hostile_msi(void)
{
    u64 n = boot->virtio_mmio_count + hostile_fn_count;
    if (n == 0)
        return;
    u64 pick = below(n);
    u32 lo = below(2) ? (u32)(MSI_ADDRESS_BASE | (rnd() & 0xffff0)) : (u32)rnd();
    u32 hi = below(4) ? 0 : (u32)rnd(), data = msi_safe((u32)rnd());
    if (pick < boot->virtio_mmio_count) {
        u64 base = boot->virtio_mmio_base[pick];
        mem_write(base + VIRTIO_MMIO_MSI_SEL, 4, below(8));
        mem_write(base + VIRTIO_MMIO_MSI_ADDRESS_LOW, 4, lo);
        mem_write(base + VIRTIO_MMIO_MSI_ADDRESS_HIGH, 4, hi);
        mem_write(base + VIRTIO_MMIO_MSI_DATA, 4, data);
        mem_write(base + VIRTIO_MMIO_MSI_COMMAND, 4, 1 + below(3));
        if (below(2))
            mem_write(base + VIRTIO_MMIO_MSI_CONTROL, 4, (u32)below(2));
        return;
    }
    const struct hostile_fn *f = &hostile_fns[pick - boot->virtio_mmio_count];
    u64 e = f->bar0 + f->msix_table + below(f->msix_entries) * PCI_MSIX_ENTRY_SIZE;
    mem_write(e + PCI_MSIX_ENTRY_LOWER_ADDR, 4, lo);
    mem_write(e + PCI_MSIX_ENTRY_UPPER_ADDR, 4, hi);
    mem_write(e + PCI_MSIX_ENTRY_DATA, 4, data);
    mem_write(e + PCI_MSIX_ENTRY_VECTOR_CTRL, 4, (u32)below(2));
}

static void hostile_burst(const struct op *op, struct op_result *res)
{
    if (!hostile_found)
        hostile_find();
    rng_state = op->value * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull; /* never 0 for xorshift */
    if (!rng_state)
        rng_state = 1;
    u64 irqs_before = 0;
    for (u32 v = 0x20; v < 256; v++)
        irqs_before += irq_counts[v];
    res->resets = 0;
    for (u64 i = 0; i < op->count; i++) {
        const struct hostile_fn *f = hostile_fn_count ? &hostile_fns[below(hostile_fn_count)] : 0;
        switch (below(16)) {
        case 0: case 1: case 2: case 3: case 4: case 5:
            hostile_window();
            break;
        case 6: case 7: case 8:
            hostile_config();
            break;
        case 9:
            if (f && f->pci_cfg)
                hostile_pci_cfg(f);
            break;
        case 10:
            if (f)
                hostile_bar(f);
            break;
        case 11: case 12:
            hostile_device(res);
            break;
        case 13:
            hostile_msi();
            break;
        default: /* a device reset through its status register */
            if (boot->virtio_mmio_count && below(2)) {
                mem_write(boot->virtio_mmio_base[below(boot->virtio_mmio_count)] + VIRTIO_MMIO_STATUS, 4, 0);
                res->resets++;
            } else if (f) {
                mem_write(f->bar0 + f->common + VIRTIO_PCI_COMMON_STATUS, 1, 0);
                res->resets++;
            }
            break;
        }
        res->value++;
    }
    dev.ready = 0; /* whatever the burst did, the next op brings the devices up again */
    hostile_restore();
    for (u32 v = 0x20; v < 256; v++)
        res->irqs += irq_counts[v];
    res->irqs -= irqs_before;
}

/* A stream of small frames into the transmit queue, `value` in flight (UDP_STREAM-like, the
 * seed's workload): each buffer mapped when posted, unmapped when returned. */
static void net_stream(const struct op *op, struct op_result *res)
{
    u64 frame = VIRTIO_NET_HDR_SIZE + op->size, limit = op->value ? op->value : QSIZE;
    if (!dev.ready || op->size == 0 || frame > NET_STREAM_FRAME_SIZE || limit > QSIZE) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    *used_event(&dev.tx) = (u16)(dev.tx.avail_idx + 0x4000); /* no transmit interrupts */
    reap_tx();
    u64 posted = 0, in_flight = (u16)(dev.tx.avail_idx - dev.tx.last_used);
    u64 deadline = tsc_timeout();
    while (res->value < op->count) {
        if (posted < op->count && in_flight < limit) {
            u8 *buf = dev.stream_buf + (dev.tx.avail_idx % QSIZE) * NET_STREAM_FRAME_SIZE;
            for (u64 i = 0; i < VIRTIO_NET_HDR_SIZE; i++)
                buf[i] = 0;
            for (u64 i = 0; i < op->size; i++)
                buf[VIRTIO_NET_HDR_SIZE + i] = (u8)(posted + i);
            vq_post(&dev.tx, buf, (u32)frame, 0);
            posted++;
            in_flight++;
            continue;
        }
        u64 n = reap_tx();
        res->value += n;
        in_flight -= n;
        if (n) {
            deadline = tsc_timeout();
        } else {
            vtd_tick();
            if (rdtsc() > deadline) {
                res->status = STATUS_TIMEOUT;
                return;
            }
        }
    }
}

/* ---- The op interpreter ---- */

/* Set when QEMU booted the probe (multiboot): no VMM test port, no built-in responder, no
 * virtio-mmio devices; its virtio-net-pci functions are driven (OP_VIRTIO_INIT, OP_ICMP_ECHO
 * with a tap behind them, the VT-d streams behind its intel-iommu). */
static int under_qemu;

/* Ops that need what only exitless's machine has: refused under QEMU, not left to time out. */
static int needs_exitless(const struct op *op)
{
    switch (op->kind) {
    case OP_MSIX_CHECK:
        return op->count != 0; /* asks for each vector through PORT_MSIX_SEND */
    case OP_MSIX_LATENCY:
    case OP_VIRTIO_RR:
    case OP_VIRTIO_RESET:
    case OP_VIRTIO_MASK_PENDING:
    case OP_HOSTILE:
    case OP_IOMMU_REPORT: /* the report lands where only exitless reads it */
        return 1;
    default:
        return 0;
    }
}

static void run_op(const struct op *op, struct op_result *res)
{
    u64 method = resolve_method(op->method);
    u64 sink = 0;
    res->method_used = method;
    res->status = STATUS_OK;
    res->value = res->irqs = res->stray_irqs = res->bytes = res->resets = res->cycles = 0;
    if (under_qemu && needs_exitless(op)) {
        res->status = STATUS_UNSUPPORTED;
        return;
    }
    op_start = rdtsc();
    switch (op->kind) {
    case OP_CFG_READ:
        if (!method_can_reach(method, op->address, op->size)) {
            res->status = STATUS_UNSUPPORTED;
            break;
        }
        res->value = cfg_read(method, op->address, op->size);
        break;
    case OP_CFG_WRITE:
        if (!method_can_reach(method, op->address, op->size)) {
            res->status = STATUS_UNSUPPORTED;
            break;
        }
        cfg_write(method, op->address, op->size, (u32)op->value);
        break;
    case OP_CFG_READ_LOOP:
        if (!method_can_reach(method, op->address, 4)) {
            res->status = STATUS_UNSUPPORTED;
            break;
        }
        sink = cfg_read(method, op->address, 4); /* warm-up: first touch of a page faults */
        op_start = rdtsc();
        for (u64 i = 0; i < op->count; i++)
            sink += cfg_read(method, op->address, 4);
        res->value = sink;
        break;
    case OP_RAM_READ_LOOP:
        sink = mem_read(RAM_SCRATCH_ADDR, 4); /* warm-up, as above */
        op_start = rdtsc();
        for (u64 i = 0; i < op->count; i++)
            sink += mem_read(RAM_SCRATCH_ADDR, 4);
        res->value = sink;
        break;
    case OP_ENUMERATE:
        if (method == METHOD_ECAM && !ecam_described()) {
            res->status = STATUS_UNSUPPORTED;
            break;
        }
        res->value = enumerate(method);
        break;
    case OP_MMIO_READ:
    case OP_MMIO_WRITE:
        if (op->size != 1 && op->size != 2 && op->size != 4 && op->size != 8) {
            res->status = STATUS_UNSUPPORTED;
            break;
        }
        if (op->kind == OP_MMIO_READ)
            res->value = mem_read(op->address, op->size);
        else
            mem_write(op->address, op->size, op->value);
        break;
    case OP_VIRTIO_INIT:
        res->status = virtio_init(op->method, op->address, op->value);
        break;
    case OP_VIRTIO_RR:
        virtio_rr(op, res);
        break;
    case OP_ICMP_ECHO:
        icmp_echo(op, res);
        break;
    case OP_VIRTIO_RESET:
        if (!dev.ready) {
            res->status = STATUS_UNSUPPORTED;
            break;
        }
        send_request(32, 0); /* in flight when the reset comes */
        res->status = virtio_init(dev.transport, dev.address, dev.flags);
        break;
    case OP_VIRTIO_MASK_PENDING:
        virtio_mask_pending(op, res);
        break;
    case OP_MSIX_PROGRAM:
    case OP_MSIX_CONTROL:
    case OP_MSIX_MASK_EACH:
    case OP_MSIX_RETARGET:
    case OP_MSIX_CHECK:
    case OP_MSIX_LATENCY:
        msix_op(op, res);
        break;
    case OP_HOSTILE:
        hostile_burst(op, res);
        break;
    case OP_IOMMU_MODE:
        vtd_set_mode(op, res);
        break;
    case OP_NET_STREAM:
        net_stream(op, res);
        break;
    case OP_IOMMU_REPORT:
        vtd_report(op, res);
        break;
    default:
        res->status = STATUS_BAD_OP;
        break;
    }
    res->cycles = rdtsc() - op_start;
}

/* ---- Booted by QEMU: learn the machine as an OS does, report through the serial port ---- */

#define PM_TIMER_HZ 3579545u /* ACPI 6.5 §4.8.3.3 */
#define PM_TIMER_MASK 0xffffffu /* 24 bits at least: 20 ms is 71,591 ticks */

/* The TSC frequency against the ACPI PM timer over 20 ms, at CPL 3: each timer read is an exit
 * (~35 us here), so the figure is good to about 0.2%. QEMU passes none (CPUID leaf 0x15 is
 * empty under -cpu host on AMD), and the guest measures it as Linux does without one. */
static u64 calibrate_tsc_khz(u16 pm_timer)
{
    u32 t0 = inl(pm_timer), ticks;
    u64 c0 = rdtsc();
    do
        ticks = (inl(pm_timer) - t0) & PM_TIMER_MASK;
    while (ticks < PM_TIMER_HZ / 50);
    return (rdtsc() - c0) * PM_TIMER_HZ / ((u64)ticks * 1000);
}

/* Without 1 GiB pages the multiboot entry maps 0..4 GiB (entry.S), but firmware may place
 * 64-bit BARs higher: map 4..64 GiB in 2 MiB pages here, at CPL 3, where the 30,720 entries
 * cost microseconds instead of the emulated ring 0's tenths of a second. The tables lie in
 * identity-mapped user RAM; each PDPT entry goes from not present to present, which needs no
 * invalidation (Intel SDM vol. 3 §4.10.4.3). */
static void map_high_memory(void)
{
    volatile u64 *pdpt = (volatile u64 *)BOOT_PDPT_ADDR;
    if (pdpt[BOOT_PD_COUNT] & PTE_PRESENT)
        return; /* 1 GiB pages: 0..512 GiB are mapped */
    for (u64 g = 0; g < HIGH_PD_COUNT; g++) {
        u64 *pd = (u64 *)(HIGH_PD_ADDR + g * 0x1000);
        u64 gib = BOOT_PD_COUNT + g;
        for (u64 i = 0; i < 512; i++)
            pd[i] = (gib << 30 | i << 21) | PTE_PRESENT | PTE_WRITABLE | PTE_USER | PTE_HUGE;
        pdpt[gib] = (u64)pd | PTE_PRESENT | PTE_WRITABLE | PTE_USER;
    }
}

/* Fill the boot info exitless's VMM would have written: ECAM from the MCFG (PCI Firmware 3.2
 * §4.1.2: base, segment, first and last bus of the first allocation), the TSC frequency, no
 * virtio-mmio devices, the VT-d unit if there is a DMAR; and copy the ops from fw_cfg. 0 if
 * all was there. */
static const char *qemu_boot_info(void)
{
    struct boot_info *info = (struct boot_info *)BOOT_INFO_ADDR;
    const u8 *rsdp = acpi_find_rsdp();
    if (!rsdp)
        return "no ACPI RSDP";
    const u8 *fadt = acpi_table(rsdp, "FACP"), *mcfg = acpi_table(rsdp, "MCFG");
    const u8 *dmar = acpi_table(rsdp, "DMAR"); /* with QEMU's intel-iommu */
    if (!fadt)
        return "no ACPI FADT";
    u32 size = 0;
    u16 file = fw_cfg_file(QEMU_OPS_FILE, sizeof(QEMU_OPS_FILE) - 1, &size);
    if (!file)
        return "no fw_cfg file " QEMU_OPS_FILE;
    if (size % sizeof(struct op) || size / sizeof(struct op) > MAX_OPS)
        return "fw_cfg file " QEMU_OPS_FILE " is not an op array";
    info->magic = BOOT_INFO_MAGIC;
    info->ecam_base = info->ecam_bus_start = info->ecam_bus_end = 0;
    if (mcfg && fw_rd32(mcfg + 4) >= 60 && (mcfg[52] | mcfg[53]) == 0) {
        info->ecam_base = fw_rd32(mcfg + 44) | (u64)fw_rd32(mcfg + 48) << 32;
        info->ecam_bus_start = mcfg[54];
        info->ecam_bus_end = mcfg[55];
    }
    info->tsc_khz = calibrate_tsc_khz((u16)fw_rd32(fadt + 76)); /* PM_TMR_BLK */
    info->op_count = size / sizeof(struct op);
    info->virtio_mmio_count = 0;
    info->iommu_base = dmar ? acpi_dmar_unit(dmar) : 0;
    fw_cfg_select(file);
    fw_cfg_read((void *)OPS_ADDR, size);
    return 0;
}

/* The serial dump (parsed by src/peer/dump.rs): a line `DUMP_BEGIN tsc_khz ops records`, one
 * line `r` per op result and `e` per enumeration record of the last OP_ENUMERATE, their
 * fields in contract order, then `DUMP_END checksum`: FNV-1a 64 over every byte before that
 * line. Numbers are lowercase hex. Written after every op has run, never inside one. */
static u64 dump_hash;

static void dump_byte(char c)
{
    dump_hash = (dump_hash ^ (u8)c) * 0x100000001b3ull;
    outb(PORT_SERIAL, (u8)c);
}

static void dump_str(const char *s)
{
    for (; *s; s++)
        dump_byte(*s);
}

static void dump_hex(u64 v)
{
    char digits[16];
    int n = 0;
    do
        digits[n++] = "0123456789abcdef"[v & 0xf];
    while (v >>= 4);
    dump_byte(' ');
    while (n)
        dump_byte(digits[--n]);
}

static void dump_block(const char *tag, const u64 *words, u64 n)
{
    dump_str(tag);
    for (u64 i = 0; i < n; i++)
        dump_hex(words[i]);
    dump_byte('\n');
}

static void dump_results(const struct op *ops, const struct op_result *results, u64 count)
{
    u64 records = 0;
    for (u64 i = 0; i < count; i++)
        if (ops[i].kind == OP_ENUMERATE)
            records = results[i].value < MAX_ENUM_RECORDS ? results[i].value : MAX_ENUM_RECORDS;
    dump_hash = 0xcbf29ce484222325ull;
    dump_str(DUMP_BEGIN);
    dump_hex(boot->tsc_khz);
    dump_hex(count);
    dump_hex(records);
    dump_byte('\n');
    for (u64 i = 0; i < count; i++)
        dump_block("r", (const u64 *)&results[i], sizeof(struct op_result) / 8);
    const struct enum_record *r = (const struct enum_record *)ENUM_ADDR;
    for (u64 i = 0; i < records; i++)
        dump_block("e", (const u64 *)&r[i], sizeof(struct enum_record) / 8);
    u64 sum = dump_hash;
    serial_puts(DUMP_END);
    dump_hex(sum);
    serial_puts("\n");
}

/* End the run: exitless stops at PORT_DONE; QEMU ignores that port and stops at its
 * isa-debug-exit, exiting with (status << 1) | 1. */
static void done(u64 status)
{
    outl(PORT_DONE, (u32)status);
    outl(QEMU_DEBUG_EXIT_PORT, (u32)status);
}

void probe_main(u64 loader_magic);

/* `loader_magic`: MULTIBOOT_BOOTLOADER_MAGIC when QEMU's multiboot loader started the probe
 * (entry.S), 0 when exitless did and wrote the boot info and the ops itself. */
void probe_main(u64 loader_magic)
{
    under_qemu = loader_magic == MULTIBOOT_BOOTLOADER_MAGIC;
    if (under_qemu) {
        map_high_memory();
        const char *missing = qemu_boot_info();
        if (missing) {
            serial_puts("exitless probe: ");
            serial_puts(missing);
            serial_puts("\n");
            done(DONE_BAD_BOOT_INFO);
            return;
        }
    }
    if (boot->magic != BOOT_INFO_MAGIC) {
        done(DONE_BAD_BOOT_INFO);
        return;
    }
    interrupts_init();
    serial_puts("exitless probe: running\n");
    const struct op *ops = (const struct op *)OPS_ADDR;
    struct op_result *results = (struct op_result *)RESULTS_ADDR;
    u64 count = boot->op_count < MAX_OPS ? boot->op_count : MAX_OPS;
    for (u64 i = 0; i < count; i++) {
        outl(PORT_PHASE_BEGIN, (u32)i);
        run_op(&ops[i], &results[i]);
        outl(PORT_PHASE_END, (u32)i);
    }
    serial_puts("exitless probe: done\n");
    if (under_qemu)
        dump_results(ops, results, count);
    done(DONE_OK);
}
