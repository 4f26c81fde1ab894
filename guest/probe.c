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

static inline void outb(u16 port, u8 v) { __asm__ volatile("outb %0, %1" ::"a"(v), "Nd"(port)); }
static inline void outw(u16 port, u16 v) { __asm__ volatile("outw %0, %1" ::"a"(v), "Nd"(port)); }
static inline void outl(u16 port, u32 v) { __asm__ volatile("outl %0, %1" ::"a"(v), "Nd"(port)); }
static inline u8 inb(u16 port) { u8 v; __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port)); return v; }
static inline u16 inw(u16 port) { u16 v; __asm__ volatile("inw %1, %0" : "=a"(v) : "Nd"(port)); return v; }
static inline u32 inl(u16 port) { u32 v; __asm__ volatile("inl %1, %0" : "=a"(v) : "Nd"(port)); return v; }

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

/* ---- The op interpreter ---- */

static void run_op(const struct op *op, struct op_result *res)
{
    u64 method = resolve_method(op->method);
    u64 sink = 0;
    res->method_used = method;
    res->status = STATUS_OK;
    res->value = 0;
    u64 start = rdtsc();
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
        start = rdtsc();
        for (u64 i = 0; i < op->count; i++)
            sink += cfg_read(method, op->address, 4);
        res->value = sink;
        break;
    case OP_RAM_READ_LOOP:
        sink = mem_read(RAM_SCRATCH_ADDR, 4); /* warm-up, as above */
        start = rdtsc();
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
    default:
        res->status = STATUS_BAD_OP;
        break;
    }
    res->cycles = rdtsc() - start;
}

void probe_main(void);

void probe_main(void)
{
    if (boot->magic != BOOT_INFO_MAGIC) {
        outl(PORT_DONE, (u32)DONE_BAD_BOOT_INFO);
        return;
    }
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
    outl(PORT_DONE, (u32)DONE_OK);
}
