/* A VT-d driver (Intel VT-d spec, legacy mode; the unit and the unmap modes: docs/iommu.md).
 * Builds on cpu.h and irq.c (the fault event's count).
 *
 * The DMA-API pattern of Linux's intel-iommu with dma-iommu: every buffer is mapped (page-table
 * writes in guest RAM; CAP.CM=0, so a map needs no invalidation) before the device sees it and
 * unmapped when the device gives it back. An unmapped IOVA may be reused only once the IOTLB
 * cannot hold it any more: strict mode invalidates each unmap at once (one IQT write, one
 * exit), the deferred modes batch unmaps and flush them with one invalidation, as Linux's
 * earlier deferred designs did and its flush queue does today. The price of deferral is the exposure: an unmapped
 * page stays reachable through a stale IOTLB entry until the flush; it is measured per page. */

#define VTD_PAGE 0x1000ull
#define VTD_SLOT_PAGES 8                         /* IOVA per mapping: up to 28 KiB + offset */
#define VTD_SLOTS 2048
#define VTD_DOMAINS 8
#define VTD_QUEUE_ENTRIES 256                    /* IQA.QS = 0: 256 128-bit descriptors */
#define VTD_MAX_PENDING 1024                     /* the deferred modes' most pending unmaps */
#define VTD_FQ_SIZE 256                          /* Linux's IOVA_FQ_SIZE */
#define VTD_TIMEOUT_MS 10                        /* Linux's IOVA_FQ_TIMEOUT */

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
    /* deferred-list: nodes from a pool (a kmalloc per unmap, in the design it models), linked in order */
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
    u32 sts = (u32)vtd_read(VTD_GSTS_REG, 4) & (VTD_GCMD_TE | VTD_GCMD_QIE | VTD_GCMD_IRE | VTD_GCMD_CFI);
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
    mfence();
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
    vtd.hwm = 250; /* the deferred modes' default high-water mark */
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
