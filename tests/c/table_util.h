/* Helpers shared by the decision-table test programs (not part of the shim). */
#ifndef CRUX_TEST_TABLE_UTIL_H
#define CRUX_TEST_TABLE_UTIL_H

#include <arpa/inet.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* IPv6 text as is, IPv4 text as ::ffff:a.b.c.d, "-" as all zero; 0 on success. */
static inline int parse_peer(const char *text, uint8_t out[16])
{
    memset(out, 0, 16);
    if (strcmp(text, "-") == 0)
        return 0;
    if (inet_pton(AF_INET6, text, out) == 1)
        return 0;
    out[10] = out[11] = 0xff;
    return inet_pton(AF_INET, text, out + 12) == 1 ? 0 : -1;
}

/* Map PATH read-only, as a shim would; an empty file maps to NULL with *len 0.
 * Returns 0, or -1 after reporting why on stderr. */
static inline int map_table(const char *path, const void **base, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        perror(path);
        return -1;
    }
    *len = (size_t)st.st_size;
    *base = NULL;
    if (*len > 0) {
        void *m = mmap(NULL, *len, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            perror("mmap");
            close(fd);
            return -1;
        }
        *base = m;
    }
    close(fd); /* the mapping outlives the descriptor */
    return 0;
}

#endif
