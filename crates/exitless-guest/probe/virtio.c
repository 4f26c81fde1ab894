/* The virtio core (virtio 1.2 §2): split virtqueues (§2.7), the interface each transport fills
 * in, and the one device the probe drives. Builds on cpu.h and vtd.c: behind the IOMMU a
 * buffer is mapped when it is posted and unmapped when the device returns it. */

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
    u8 *stream_buf;                         /* OP_NET_STREAM: one frame per descriptor, */
    u64 stream_payload, stream_stride;      /* `stream_stride` apart, as virtio_init laid them */
    u32 rx_vector;                          /* IDT vector that signals a receive */
    u8 mac[6];                              /* from its config space; all zero if none */
    u64 rx_irqs;                            /* receive interrupts before the posted buffer's */
    int ready;
    int live;                               /* DRIVER_OK written since its last reset here */
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
static volatile u16 *used_event(struct vq *q) { return &q->avail[2 + q->size]; }
static volatile u16 *avail_event(struct vq *q) { return (volatile u16 *)((volatile u8 *)q->used + 4 + 8 * q->size); }
static u16 used_idx(struct vq *q) { return q->used[1]; }
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

/* Make one buffer available and notify the device if it asked for it (event index,
 * virtio 1.2 §2.7.10: notify when the new index passes avail_event). */
static void vq_post(struct vq *q, void *buf, u32 len, u16 flags)
{
    u16 slot = q->avail_idx % q->size;
    q->desc[slot].addr = vq_map(q, slot, buf, len, flags);
    q->desc[slot].len = len;
    q->desc[slot].flags = flags;
    q->desc[slot].next = 0;
    q->avail[2 + slot] = slot;
    u16 old = q->avail_idx++;
    compiler_barrier();
    q->avail[1] = q->avail_idx;
    mfence(); /* publish idx before reading avail_event */
    u16 event = *avail_event(q);
    if ((u16)(q->avail_idx - event - 1) < (u16)(q->avail_idx - old))
        dev.ops->notify(q);
}
/* The used element `n` of `q`: the head it returns and the bytes written. */
static u32 used_id(struct vq *q, u16 n) { return *(volatile u32 *)((volatile u8 *)q->used + 4 + 8 * (n % q->size)); }
static u32 used_len(struct vq *q, u16 n) { return *(volatile u32 *)((volatile u8 *)q->used + 8 + 8 * (n % q->size)); }
