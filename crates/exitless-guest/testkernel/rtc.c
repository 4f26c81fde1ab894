/* The RTC (MC146818A datasheet) and S3 (ACPI 6.5 §16.1.3, §7.4.2.4): read the time and check
 * it against the host's (utc=SECONDS on the command line), then with s3=alarm or s3=key go to
 * sleep with a pattern in memory and the FACS's waking vector (found through the 32-bit
 * FIRMWARE_CTRL only) at a real-mode stub, woken by the RTC alarm (RTC_EN) or by a key on the
 * console; check that the stub ran in real mode at the vector, that WAK_STS (and RTC_STS) are
 * set, and that memory survived. */
#include <stdint.h>

#include "testkernel.h"

#define RTC_INDEX       0x70
#define RTC_DATA        0x71
#define REG_A_UIP       0x80
#define REG_B_SET       0x80
#define REG_B_AIE       0x20
#define REG_B_DM        0x04            /* binary */
#define REG_B_24H       0x02
#define REG_C_AF        0x20
#define DONT_CARE       0xff
#define RTC_STS         (1u << 10)      /* PM1 status and enable: the RTC alarm */
#define WAK_STS         (1u << 15)
#define SLP_EN          (1u << 13)
#define S3_SLP_TYP      1u              /* QEMU's \_S3, and exitless's */
#define PATTERN_WORDS   256

uint8_t rtc_get(uint8_t index)
{
    outb(RTC_INDEX, index);
    return inb(RTC_DATA);
}

void rtc_set(uint8_t index, uint8_t value)
{
    outb(RTC_INDEX, index);
    outb(RTC_DATA, value);
}

static uint32_t from_bcd(uint8_t v, int binary) { return binary ? v : (v >> 4) * 10u + (v & 0xf); }
static uint8_t to_bcd(uint32_t v, int binary) { return (uint8_t)(binary ? v : (v / 10) << 4 | v % 10); }

/* Days since 1970-01-01 of a date (the proleptic Gregorian calendar, years from 2000). */
static uint32_t days(uint32_t y, uint32_t m, uint32_t d)
{
    static const uint16_t before[12] = {0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334};
    uint32_t leaps = (y - 1) / 4 - (y - 1) / 100 + (y - 1) / 400 - 477; /* leap days 1970..y-1 */
    uint32_t leap = m > 2 && (y % 4 == 0 && (y % 100 != 0 || y % 400 == 0));
    return (y - 1970) * 365 + leaps + before[(m - 1) % 12] + leap + d - 1;
}

/* The RTC's time in seconds since the epoch, read between updates (UIP clear), in the mode
 * register B gives. */
static uint32_t rtc_seconds(void)
{
    while (rtc_get(0x0a) & REG_A_UIP)
        ;
    int binary = rtc_get(0x0b) & REG_B_DM;
    uint32_t s = from_bcd(rtc_get(0), binary), mi = from_bcd(rtc_get(2), binary);
    uint32_t h = from_bcd(rtc_get(4), binary), d = from_bcd(rtc_get(7), binary);
    uint32_t mo = from_bcd(rtc_get(8), binary), y = from_bcd(rtc_get(9), binary);
    uint32_t century = from_bcd(rtc_get(0x32), binary);
    return days(century * 100 + y, mo, d) * 86400u + h * 3600 + mi * 60 + s;
}

static uint32_t number(const char *v)
{
    uint32_t n = 0;
    while (v && *v >= '0' && *v <= '9')
        n = n * 10 + (uint32_t)(*v++ - '0');
    return n;
}

/* The time in BCD and in binary, and against the host's. */
static void check_time(void)
{
    uint32_t bcd = rtc_seconds();
    rtc_set(0x0b, REG_B_24H | REG_B_DM);
    uint32_t binary = rtc_seconds();
    rtc_set(0x0b, REG_B_24H);
    check(binary - bcd < 3, "rtc: BCD and binary modes agree (%u, %u)", bcd, binary);
    uint32_t host = number(arg("utc")), ahead = bcd - host;
    /* The host's time was taken before the run; booting here takes a few seconds at most. */
    check(host && ahead < 60, "rtc: %u s since the epoch, %u s after the host's utc=%u", bcd,
          ahead, host);
}

/* The real-mode waking stub, copied to WAKE_STUB: it records CS and CR0 (PE must be clear),
 * loads a flat GDT, enters protected mode and jumps to s3_resume. s3_sleep saves the
 * callee-saved registers and the stack, writes PM1a control, and returns 1 once the machine
 * has woken (through s3_resume), 0 if the write returned without sleeping. */
#define WAKE_STUB 0x7000
__asm__(
    "    .code16\n"
    "    .global wake_stub, wake_stub_end, wake_cs, wake_cr0\n"
    "wake_stub:\n"
    "    cli\n"
    "    movw    %cs, %ax\n"
    "    movw    %ax, %ds\n"
    "    movw    %ax, wake_cs - wake_stub\n"
    "    movl    %cr0, %eax\n"
    "    movl    %eax, wake_cr0 - wake_stub\n"
    "    lgdtl   wake_gdt_descriptor - wake_stub\n"
    "    orl     $1, %eax\n"
    "    movl    %eax, %cr0\n"
    "    ljmpl   $0x08, $s3_resume\n"
    "    .align  8\n"
    "wake_gdt:\n"
    "    .quad   0\n"
    "    .quad   0x00cf9a000000ffff\n"
    "    .quad   0x00cf92000000ffff\n"
    "wake_gdt_descriptor:\n"
    "    .word   3 * 8 - 1\n"
    "    .long   0x7000 + (wake_gdt - wake_stub)\n"
    "wake_cs:\n"
    "    .word   0xffff\n"
    "wake_cr0:\n"
    "    .long   0xffffffff\n"
    "wake_stub_end:\n"
    "    .code32\n"
    "    .global s3_sleep\n"
    "s3_sleep:\n"
    "    pushl   %ebp\n"
    "    pushl   %ebx\n"
    "    pushl   %esi\n"
    "    pushl   %edi\n"
    "    movl    %esp, s3_stack\n"
    "    movl    20(%esp), %edx\n"
    "    movl    24(%esp), %eax\n"
    "    outw    %ax, %dx\n"
    "    xorl    %eax, %eax\n"
    "    jmp     1f\n"
    "s3_resume:\n"
    "    movw    $0x10, %ax\n"
    "    movw    %ax, %ds\n"
    "    movw    %ax, %es\n"
    "    movw    %ax, %fs\n"
    "    movw    %ax, %gs\n"
    "    movw    %ax, %ss\n"
    "    movl    s3_stack, %esp\n"
    "    movl    $1, %eax\n"
    "1:  popl    %edi\n"
    "    popl    %esi\n"
    "    popl    %ebx\n"
    "    popl    %ebp\n"
    "    ret\n");

extern const uint8_t wake_stub[], wake_stub_end[], wake_cs[], wake_cr0[];
int s3_sleep(uint32_t pm1a_cnt, uint32_t value);
uint32_t s3_stack;
static uint32_t pattern[PATTERN_WORDS];

/* Arm the alarm two seconds ahead (any hour and minute: it fires at that second). */
static void arm_alarm(void)
{
    int binary = rtc_get(0x0b) & REG_B_DM;
    while (rtc_get(0x0a) & REG_A_UIP)
        ;
    uint32_t second = (from_bcd(rtc_get(0), binary) + 2) % 60;
    rtc_set(1, to_bcd(second, binary));
    rtc_set(3, DONT_CARE);
    rtc_set(5, DONT_CARE);
    rtc_get(0x0c);
    rtc_set(0x0b, (uint8_t)(rtc_get(0x0b) & ~REG_B_SET) | REG_B_AIE);
}

/* Sleep in S3 and wake, by the alarm or a key. */
static void check_s3(int by_alarm)
{
    const uint8_t *facs = fadt ? fw_phys(fw_rd32(fadt + 36)) : 0; /* FIRMWARE_CTRL only */
    if (!check(facs && fw_equal(facs, "FACS", 4), "s3: the FACS through FIRMWARE_CTRL"))
        return;
    uint16_t pm1a_evt = (uint16_t)fw_rd32(fadt + 56), pm1a_cnt = (uint16_t)fw_rd32(fadt + 64);
    memcpy((void *)WAKE_STUB, wake_stub, (uint32_t)(wake_stub_end - wake_stub));
    uint32_t waking = WAKE_STUB, x_waking[2] = {0, 0};
    memcpy((void *)(facs + 12), &waking, 4);
    memcpy((void *)(facs + 24), x_waking, 8);
    for (uint32_t i = 0; i < PATTERN_WORDS; i++)
        pattern[i] = i * 0x9e3779b1u;
    outw(pm1a_evt, RTC_STS | WAK_STS);
    outw(pm1a_evt + 2, by_alarm ? RTC_STS : 0);
    if (by_alarm)
        arm_alarm();
    puts(by_alarm ? "testkernel: s3: sleeping until the RTC alarm\n"
                  : "testkernel: s3: sleeping until a key\n");
    int woke = s3_sleep(pm1a_cnt, S3_SLP_TYP << 10 | SLP_EN);
    uint16_t status = inw(pm1a_evt);
    uint32_t cr0 = fw_rd32((const uint8_t *)WAKE_STUB + (wake_cr0 - wake_stub));
    uint16_t cs = rd16((const uint8_t *)WAKE_STUB + (wake_cs - wake_stub));
    check(woke && cs == WAKE_STUB >> 4 && !(cr0 & 1),
          "s3: resumed at the waking vector in real mode (CS %x, CR0 %x)", cs, cr0);
    check((status & WAK_STS) && (!by_alarm || (status & RTC_STS)),
          "s3: PM1 status %x after waking (WAK_STS%s)", status, by_alarm ? ", RTC_STS" : "");
    uint32_t same = 0;
    for (uint32_t i = 0; i < PATTERN_WORDS; i++)
        same += pattern[i] == i * 0x9e3779b1u;
    check(same == PATTERN_WORDS, "s3: memory survived (%u of %u words)", same, PATTERN_WORDS);
    if (by_alarm)
        check(rtc_get(0x0c) & REG_C_AF, "s3: the alarm flag is set in register C");
    outw(pm1a_evt, RTC_STS | WAK_STS);
}

void check_rtc(void)
{
    if (arg("utc"))
        check_time();
    const char *s3 = arg("s3");
    if (s3 && (s3[0] == 'a' || s3[0] == 'k'))
        check_s3(s3[0] == 'a');
}
