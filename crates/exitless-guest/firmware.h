/* What a guest learns from the firmware of a PC it did not build, shared by the probe (64-bit,
 * CPL 3, when QEMU boots it) and the test kernel (32-bit, ring 0):
 *
 *   - the ACPI tables (ACPI 6.5 §5.2): the RSDP found by scanning, the XSDT or RSDT, any table
 *     by signature, the VT-d unit in the DMAR;
 *   - fw_cfg's traditional port interface (QEMU docs/specs/fw_cfg.rst): select, read, and a
 *     file looked up in the file directory.
 *
 * Both guests identity-map the low 4 GiB, where firmware puts these tables. */
#pragma once
#include <stdint.h>

#include "portio.h"

#define FW_CFG_SEL      0x510
#define FW_CFG_DATA     0x511
#define FW_CFG_FILE_DIR 0x19

static inline uint32_t fw_rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint32_t fw_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline int fw_equal(const void *a, const void *b, uint32_t n)
{
    const uint8_t *x = a, *y = b;
    while (n--)
        if (*x++ != *y++)
            return 0;
    return 1;
}

/* A table below 4 GiB, by its 32-bit physical address. */
static inline const uint8_t *fw_phys(uint32_t addr) { return (const uint8_t *)(uintptr_t)addr; }

static inline int acpi_checksum_ok(const uint8_t *p, uint32_t len)
{
    uint8_t sum = 0;
    while (len--)
        sum = (uint8_t)(sum + *p++);
    return sum == 0;
}

/* The RSDP, 16-byte aligned in the EBDA's first KiB or the BIOS area (ACPI 6.5 §5.2.5.1). */
static inline const uint8_t *acpi_find_rsdp(void)
{
    uint16_t ebda_segment; /* the BIOS data area's word at 0x40E */
    __asm__ volatile("movw 0x40e, %0" : "=r"(ebda_segment));
    uint32_t ebda = (uint32_t)ebda_segment << 4;
    uint32_t ranges[2][2] = {{ebda, ebda + 1024}, {0xe0000, 0x100000}};
    for (int r = ebda ? 0 : 1; r < 2; r++)
        for (uint32_t at = ranges[r][0]; at < ranges[r][1]; at += 16)
            if (fw_equal(fw_phys(at), "RSD PTR ", 8) && acpi_checksum_ok(fw_phys(at), 20))
                return fw_phys(at);
    return 0;
}

/* The root table: from revision 2 the XSDT, 8-byte entries, if its checksum holds; before that
 * the RSDT, 4-byte entries (ACPI 6.5 §5.2.5.3). `*step` is the entry size. */
static inline const uint8_t *acpi_root(const uint8_t *rsdp, uint32_t *step)
{
    int x = rsdp[15] >= 2 && fw_rd32(rsdp + 24) && acpi_checksum_ok(rsdp, fw_rd32(rsdp + 20));
    *step = x ? 8 : 4;
    return fw_phys(x ? fw_rd32(rsdp + 24) : fw_rd32(rsdp + 16));
}

/* The first table the root lists with signature `sig`, or 0. */
static inline const uint8_t *acpi_table(const uint8_t *rsdp, const char *sig)
{
    uint32_t step;
    const uint8_t *root = acpi_root(rsdp, &step);
    uint32_t tables = (fw_rd32(root + 4) - 36) / step;
    for (uint32_t i = 0; i < tables; i++) {
        const uint8_t *t = fw_phys(fw_rd32(root + 36 + i * step));
        if (fw_equal(t, sig, 4))
            return t;
    }
    return 0;
}

/* Whether a DRHD's device scopes (Intel VT-d 4.0 §8.3.1: type, length, reserved, enumeration
 * ID, start bus, then the path) name a PCI endpoint (type 1) or sub-hierarchy (type 2) on bus 0. */
static inline int acpi_drhd_has_bus0(const uint8_t *drhd, uint32_t size)
{
    for (uint32_t at = 16; at + 6 <= size;) {
        const uint8_t *scope = drhd + at;
        if (scope[1] < 6)
            return 0; /* a malformed entry: no way to the next one */
        if ((scope[0] == 1 || scope[0] == 2) && scope[5] == 0)
            return 1;
        at += scope[1];
    }
    return 0;
}

/* The register base of the VT-d remapping unit that covers bus 0 of segment 0, from the DMAR
 * (Intel VT-d 4.0 §8.1): after its 48-byte header come remapping structures, each with its
 * type and length in its first 4 bytes; a DRHD (type 0, §8.3) has flags at 4 (bit 0:
 * INCLUDE_PCI_ALL), its segment at 6, its 64-bit register base address at 8 and device scopes
 * from 16. QEMU 7.2 lists the devices of its root bus as scopes rather than set
 * INCLUDE_PCI_ALL; exitless sets the flag. 0 if no unit covers bus 0. */
static inline uint64_t acpi_dmar_unit(const uint8_t *dmar)
{
    uint32_t len = fw_rd32(dmar + 4);
    for (uint32_t at = 48; at + 16 <= len;) {
        const uint8_t *s = dmar + at;
        uint32_t type = (uint32_t)s[0] | (uint32_t)s[1] << 8, size = (uint32_t)s[2] | (uint32_t)s[3] << 8;
        if (size < 4 || at + size > len)
            return 0; /* a malformed table: no way to the next structure */
        if (type == 0 && size >= 16 && s[6] == 0 && s[7] == 0 &&
            ((s[4] & 1) || acpi_drhd_has_bus0(s, size)))
            return fw_rd32(s + 8) | (uint64_t)fw_rd32(s + 12) << 32;
        at += size;
    }
    return 0;
}

static inline void fw_cfg_select(uint16_t key) { outw(FW_CFG_SEL, key); }
static inline void fw_cfg_read(void *buf, uint32_t n) { insb(FW_CFG_DATA, buf, n); }

/* The selector of fw_cfg file `name` and its size, or 0. The directory is a big-endian count,
 * then 64-byte entries: size (big-endian), select (big-endian), reserved, name. */
static inline uint16_t fw_cfg_file(const char *name, uint32_t name_len, uint32_t *size)
{
    uint8_t count[4], entry[64];
    fw_cfg_select(FW_CFG_FILE_DIR);
    fw_cfg_read(count, 4);
    uint32_t files = fw_be32(count);
    for (uint32_t i = 0; i < files && i < 256; i++) {
        fw_cfg_read(entry, 64);
        if (fw_equal(entry + 8, name, name_len + 1)) {
            *size = fw_be32(entry);
            return (uint16_t)(entry[4] << 8 | entry[5]);
        }
    }
    return 0;
}
