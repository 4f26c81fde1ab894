/* Shared by the test kernel's files: entry.S reads the part for assembly, the C files the rest. */
#pragma once

/* Where the application processors' real-mode start-up code is copied: the start-up IPI's
 * vector is this address's page number (Intel SDM vol. 3 §9.4.4.1). Below the 1 MiB line, in
 * RAM a multiboot loader leaves free (QEMU's and exitless's memory maps both list it). */
#define TRAMPOLINE 0x6000

#ifndef __ASSEMBLER__
#include <stdint.h>

#define COM1            0x3f8
#define COM1_LSR        (COM1 + 5)
#define LSR_DATA_READY  0x01
#define PCI_CONFIG_ADDRESS 0xcf8
#define PCI_CONFIG_DATA 0xcfc
#define PM_TIMER_HZ     3579545u
#define MB_BOOTLOADER_MAGIC 0x2badb002u
#define MB_INFO_MEMORY  (1u << 0)
#define MB_INFO_CMDLINE (1u << 2)
#define MB_INFO_MMAP    (1u << 6)
#define MB_INFO_LOADER_NAME (1u << 9)

/* The multiboot information (Multiboot 0.6.96 §3.3), up to the fields read here. */
struct mb_info {
    uint32_t flags, mem_lower, mem_upper, boot_device, cmdline, mods_count, mods_addr;
    uint32_t syms[4];
    uint32_t mmap_length, mmap_addr, drives_length, drives_addr, config_table;
    uint32_t boot_loader_name;
};

/* main.c: what freestanding code still needs (gcc may call memcpy and memset), and the
 * command line. */
void *memcpy(void *d, const void *s, __SIZE_TYPE__ n);
void *memset(void *d, int c, __SIZE_TYPE__ n);
uint32_t length(const char *s);
extern const char *cmdline;
const char *arg(const char *key);

/* console.c: COM1, and one "PASS what" or "FAIL what" line per check. */
void puts(const char *s);
void print(const char *fmt, ...);
int check(int ok, const char *fmt, ...);
extern uint32_t passed, failed;

/* platform.c: the firmware's tables, the PM timer, the processors, console input. */
extern const uint8_t *fadt;
extern uint16_t pm_timer_port;
extern uint32_t pm_timer_mask;
uint32_t pm_timer(void);
void check_multiboot(const struct mb_info *mb, uint32_t mem_mib);
void check_fw_cfg(uint32_t cpus, uint32_t mem_mib);
void check_acpi(void);
void check_fadt(void);
void check_madt(uint32_t cpus);
void check_mcfg(uint32_t ecam);
void check_dmar(uint32_t iommu, uint32_t intremap);
int dmar_ioapic_scope(uint32_t *unit, uint16_t *sid);
void check_smp(uint32_t cpus);
void check_echo(void);
void delay(uint32_t ticks);

/* ioapic.c: interrupts through the IOAPIC, and through the VT-d unit's IRTEs (ioapic=1|2). */
void check_ioapic(int remap);

/* cpuid.c: the CPUID the kernel sees (cpuid=1). */
void check_cpuid(void);

/* rtc.c: the RTC's time (utc=SECONDS) and S3, woken by its alarm or a key (s3=alarm|key). */
void check_rtc(void);
uint8_t rtc_get(uint8_t index);
void rtc_set(uint8_t index, uint8_t value);

/* highmem.c: RAM above 4 GiB, written and read back under PAE paging. */
void check_highmem(const struct mb_info *mb, uint32_t mib);

/* virtio.c: a virtio device on virtio-mmio or virtio-pci, and its split virtqueues. */
#define VQ_SIZE 8
#define STATUS_NEEDS_RESET 0x40
struct vdev {
    int mmio;                   /* 1: a virtio-mmio window; 0: a virtio-pci function */
    uint32_t common;            /* the window, or the common configuration */
    uint32_t device;            /* the device configuration */
    uint32_t dev, notify, multiplier; /* virtio-pci: slot, notify area and its multiplier */
};
struct vq_desc { uint64_t addr; uint32_t len; uint16_t flags, next; };
struct vq {
    struct vq_desc desc[VQ_SIZE];
    volatile uint16_t avail[2 + VQ_SIZE + 1];
    volatile uint32_t used[1 + 2 * VQ_SIZE + 1];
    const struct vdev *dev;
    uint32_t notify;
    uint16_t index, next_avail, used_seen;
} __attribute__((aligned(16)));
int vdev_find(struct vdev *v, uint32_t id, const char *what, const char *name);
uint8_t vdev_status(const struct vdev *v);
int vdev_reset(const struct vdev *v);
int vdev_move_bar(struct vdev *v, int32_t delta);
int vdev_negotiate(const struct vdev *v, uint32_t wanted);
int vdev_queue(const struct vdev *v, uint16_t index, struct vq *q);
void vdev_driver_ok(const struct vdev *v);
void vq_submit(struct vq *q, uint16_t head);
uint16_t vq_used_idx(const struct vq *q);
int vq_wait(const struct vq *q, uint32_t ticks);
/* disk=reconnect, net=reconnect: rounds on `dev` while the test kills its backend and starts it
 * again. */
struct reconnect {
    const struct vdev *dev;
    const char *what;              /* the marker line's name for the device */
    int (*setup)(void);            /* set it up again after a reset; whether it took it */
    int (*round)(uint32_t resets); /* one round of requests; whether all were answered */
    void (*first_reset)(void);     /* called at the first reset, if not null */
    uint32_t resets, good;         /* resets seen, rounds answered */
};
int vdev_reconnect(struct reconnect *r);

/* virtio_blk.c: a virtio-blk disk (disk=1), and the same across a backend's restart
 * (disk=reconnect); a round on it for another check. virtio_net.c: a virtio-net card (net=1),
 * and the same across a backend's restart (net=reconnect). */
void check_disk(int reconnect);
int disk_round(uint32_t seed);
void disk_rounds(uint32_t rounds);
void disk_resets(uint32_t rounds);
void net_rounds(uint32_t rounds);
void check_net(int reconnect);
/* virtio_net.c: a card with several queue pairs, both driven (net=mq). */
void check_net_mq(void);
/* vdev_reconnect's pause after a failed set-up or round. */
#define RECONNECT_PAUSE (PM_TIMER_HZ / 5)

#include "../portio.h"

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

#include "../firmware.h"
static inline uint32_t mmio32(uint32_t addr) { return *(volatile uint32_t *)addr; }
static inline void mmio_write32(uint32_t addr, uint32_t v) { *(volatile uint32_t *)addr = v; }
static inline uint16_t mmio16(uint32_t addr) { return *(volatile uint16_t *)addr; }
static inline void mmio_write16(uint32_t addr, uint16_t v) { *(volatile uint16_t *)addr = v; }
static inline uint8_t mmio8(uint32_t addr) { return *(volatile uint8_t *)addr; }
static inline void mmio_write8(uint32_t addr, uint8_t v) { *(volatile uint8_t *)addr = v; }
#endif
