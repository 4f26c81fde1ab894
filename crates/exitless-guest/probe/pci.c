/* PCI configuration space, reached by configuration mechanism #1 (ports 0xCF8/0xCFC, PCI 3.0
 * §3.2.2.3.2) or through the ECAM window (PCIe 5.0 §7.2.2); enumeration as an OS does it at
 * boot; a function's BARs and bus mastering, for the drivers. Builds on cpu.h. */

/* ---- Configuration access ---- */

static int ecam_described(void) { return boot->ecam_base != 0; }

/* METHOD_AUTO, the guest-side policy under test: prefer ECAM (MMIO) when running under a
 * hypervisor and ECAM is described; bare metal keeps port I/O because of old chipset bugs. */
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

/* ---- A function's resources, for the drivers ---- */

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

