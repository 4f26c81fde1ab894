/* The test kernel's console: COM1, polled, and the PASS/FAIL lines of the checks. */
#include <stdarg.h>
#include <stdint.h>

#include "testkernel.h"

#define LSR_THR_EMPTY   0x20

static void putc(char c)
{
    while (!(inb(COM1_LSR) & LSR_THR_EMPTY))
        ;
    outb(COM1, (uint8_t)c);
}

void puts(const char *s)
{
    while (*s)
        putc(*s++);
}

static void put_number(uint32_t v, uint32_t base, int width)
{
    char digits[12];
    int n = 0;
    do {
        digits[n++] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v);
    while (width-- > n)
        putc('0');
    while (n)
        putc(digits[--n]);
}

/* printf's %s %c %u %x, with a zero-padded width. */
static void vprint(const char *fmt, va_list ap)
{
    for (; *fmt; fmt++) {
        if (*fmt != '%') {
            putc(*fmt);
            continue;
        }
        int width = 0;
        while (fmt[1] >= '0' && fmt[1] <= '9')
            width = width * 10 + (*++fmt - '0');
        switch (*++fmt) {
        case 's': puts(va_arg(ap, const char *)); break;
        case 'c': putc((char)va_arg(ap, int)); break;
        case 'u': put_number(va_arg(ap, uint32_t), 10, width); break;
        case 'x': put_number(va_arg(ap, uint32_t), 16, width); break;
        default: putc('%'); putc(*fmt); break;
        }
    }
}

void print(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprint(fmt, ap);
    va_end(ap);
}

uint32_t passed, failed;

/* One result line: "PASS what" or "FAIL what". */
int check(int ok, const char *fmt, ...)
{
    va_list ap;
    puts(ok ? "PASS " : "FAIL ");
    va_start(ap, fmt);
    vprint(fmt, ap);
    va_end(ap);
    putc('\n');
    if (ok)
        passed++;
    else
        failed++;
    return ok;
}
