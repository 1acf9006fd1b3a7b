/* Reference for probing/hashmodel.py's jhash(): the Linux kernel's jhash() as
 * include/linux/jhash.h defines it (lookup3, JHASH_INITVAL, CPU-order word loads,
 * the fall-through tail), written here in plain C so the test can compare the two.
 *
 *   jhash_ref < lines of "HEXKEY INITVAL"  ->  one "%08x" hash per line ("-" for an empty key)
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint32_t u32;
typedef uint8_t u8;

#define JHASH_INITVAL 0xdeadbeef

static inline u32 rol32(u32 w, unsigned s) { return (w << s) | (w >> (32 - s)); }

#define jhash_mix(a, b, c)                          \
    do {                                            \
        a -= c; a ^= rol32(c, 4);  c += b;          \
        b -= a; b ^= rol32(a, 6);  a += c;          \
        c -= b; c ^= rol32(b, 8);  b += a;          \
        a -= c; a ^= rol32(c, 16); c += b;          \
        b -= a; b ^= rol32(a, 19); a += c;          \
        c -= b; c ^= rol32(b, 4);  b += a;          \
    } while (0)

#define jhash_final(a, b, c)                        \
    do {                                            \
        c ^= b; c -= rol32(b, 14);                  \
        a ^= c; a -= rol32(c, 11);                  \
        b ^= a; b -= rol32(a, 25);                  \
        c ^= b; c -= rol32(b, 16);                  \
        a ^= c; a -= rol32(c, 4);                   \
        b ^= a; b -= rol32(a, 14);                  \
        c ^= b; c -= rol32(b, 24);                  \
    } while (0)

static u32 load32(const u8 *p) {  /* __get_unaligned_cpu32 */
    u32 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static u32 jhash(const void *key, u32 length, u32 initval) {
    const u8 *k = key;
    u32 a, b, c;
    a = b = c = JHASH_INITVAL + length + initval;
    while (length > 12) {
        a += load32(k);
        b += load32(k + 4);
        c += load32(k + 8);
        jhash_mix(a, b, c);
        length -= 12;
        k += 12;
    }
    switch (length) {
    case 12: c += (u32)k[11] << 24; /* fall through */
    case 11: c += (u32)k[10] << 16; /* fall through */
    case 10: c += (u32)k[9] << 8;   /* fall through */
    case 9:  c += k[8];             /* fall through */
    case 8:  b += (u32)k[7] << 24;  /* fall through */
    case 7:  b += (u32)k[6] << 16;  /* fall through */
    case 6:  b += (u32)k[5] << 8;   /* fall through */
    case 5:  b += k[4];             /* fall through */
    case 4:  a += (u32)k[3] << 24;  /* fall through */
    case 3:  a += (u32)k[2] << 16;  /* fall through */
    case 2:  a += (u32)k[1] << 8;   /* fall through */
    case 1:  a += k[0];
        jhash_final(a, b, c);
        break;
    case 0:
        break;
    }
    return c;
}

int main(void) {
    char hex[1024];
    unsigned long initval;
    u8 key[512];
    while (scanf("%1023s %lu", hex, &initval) == 2) {
        size_t n = strcmp(hex, "-") == 0 ? 0 : strlen(hex) / 2;
        for (size_t i = 0; i < n; i++) {
            unsigned byte;
            if (sscanf(hex + 2 * i, "%2x", &byte) != 1)
                return 2;
            key[i] = (u8)byte;
        }
        printf("%08" PRIx32 "\n", jhash(key, (u32)n, (u32)initval));
    }
    return 0;
}
