/*
 * crux_links.c - the device -> PCIe link map the agent writes beside the semaphore file
 * (format in crux_gate.h; the writer and a reader with the same rules: transport/pcie_links.py).
 * The file is input the job did not write and must not trust: bounded, parsed strictly,
 * opened without following a symlink, and any flaw rejects the whole file (the job then runs
 * ungated, fail open).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crux_gate.h"

#define HEADER "crux-pcie-links 1 "
#define MAX_LINKS 1024 /* CRUX_PCIE_MAX_LINKS */

static int fail(char *err, size_t errlen, unsigned line, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        int n = line ? snprintf(err, errlen, "line %u: ", line) : 0;
        va_list ap;
        va_start(ap, fmt);
        if (n >= 0 && (size_t)n < errlen)
            vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

/* A decimal number in [0, max] without sign or leading zeros; -1 otherwise. */
static long number(const char *s, size_t n, long max)
{
    if (n == 0 || n > 7 || (n > 1 && s[0] == '0'))
        return -1;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v <= max ? v : -1;
}

static int name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '.' || c == '-';
}

static int hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

/* "-", or a PCI address DDDD[DDDD]:BB:SS.F in lower-case hex: only checked, not used. */
static int pci_ok(const char *s, size_t n)
{
    if (n == 1 && s[0] == '-')
        return 1;
    if (n < 12 || n > 16)
        return 0;
    size_t dom = n - 8; /* ":BB:SS.F" is 8 characters */
    for (size_t i = 0; i < n; i++) {
        size_t j = i < dom ? 0 : i - dom;
        int ok = i < dom ? hex(s[i])
                 : (j == 0 || j == 3) ? s[i] == ':'
                 : j == 6 ? s[i] == '.'
                 : j == 7 ? s[i] >= '0' && s[i] <= '7'
                          : hex(s[i]);
        if (!ok)
            return 0;
    }
    return 1;
}

int crux_links_parse(const char *buf, size_t len, struct crux_links *out, char *err,
                     size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (len == 0)
        return fail(err, errlen, 0, "empty");
    if (len > CRUX_LINKS_MAX_BYTES)
        return fail(err, errlen, 0, "larger than %d bytes", CRUX_LINKS_MAX_BYTES);
    if (buf[len - 1] != '\n')
        return fail(err, errlen, 0, "does not end with a newline");
    if (memchr(buf, '\0', len) != NULL)
        return fail(err, errlen, 0, "holds a NUL byte");
    int have_header = 0;
    unsigned line = 0;
    for (const char *p = buf, *end = buf + len; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)(nl - p);
        line++;
        const char *s = p;
        p = nl + 1;
        if (n == 0 || s[0] == '#')
            continue;
        if (!have_header) {
            size_t h = sizeof HEADER - 1;
            long links = n > h && memcmp(s, HEADER, h) == 0 ? number(s + h, n - h, MAX_LINKS)
                                                             : -1;
            if (links < 1)
                return fail(err, errlen, line, "expected 'crux-pcie-links 1 <links 1..%d>'",
                            MAX_LINKS);
            out->links = (unsigned)links;
            have_header = 1;
            continue;
        }
        const char *sp1 = memchr(s, ' ', n);
        const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(s + n - sp1 - 1)) : NULL;
        if (sp1 == NULL || sp2 == NULL || memchr(sp2 + 1, ' ', (size_t)(s + n - sp2 - 1)))
            return fail(err, errlen, line, "expected '<device> <link> <pci address or ->'");
        size_t dn = (size_t)(sp1 - s);
        if (dn == 0 || dn >= CRUX_LINKS_NAME)
            return fail(err, errlen, line, "device name must be 1..%d characters",
                        CRUX_LINKS_NAME - 1);
        for (size_t i = 0; i < dn; i++)
            if (!name_char(s[i]))
                return fail(err, errlen, line, "device name has a character outside "
                            "[A-Za-z0-9_.-]");
        long link = number(sp1 + 1, (size_t)(sp2 - sp1 - 1), (long)out->links - 1);
        if (link < 0)
            return fail(err, errlen, line, "link must be 0..%u", out->links - 1);
        if (!pci_ok(sp2 + 1, (size_t)(s + n - sp2 - 1)))
            return fail(err, errlen, line, "bad PCI address (want dddd:bb:ss.f or -)");
        for (unsigned i = 0; i < out->n; i++)
            if (strlen(out->dev[i].device) == dn && memcmp(out->dev[i].device, s, dn) == 0)
                return fail(err, errlen, line, "device listed twice");
        if (out->n >= CRUX_LINKS_MAX_DEVICES)
            return fail(err, errlen, line, "more than %d devices", CRUX_LINKS_MAX_DEVICES);
        memcpy(out->dev[out->n].device, s, dn);
        out->dev[out->n].device[dn] = '\0';
        out->dev[out->n].link = (unsigned)link;
        out->n++;
    }
    if (!have_header)
        return fail(err, errlen, 0, "no 'crux-pcie-links 1 <links>' line");
    return 0;
}

int crux_links_load(const char *path, struct crux_links *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    /* O_NOFOLLOW: a symlink planted at the path is refused, not read; O_NONBLOCK: a FIFO there
     * must not hang the job in open() (it is refused as not a regular file below). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        if (e != ENOENT)
            fail(err, errlen, 0, "%s", e == ELOOP ? "is a symlink" : strerror(e));
        return e == ELOOP ? -EINVAL : -e;
    }
    struct stat sb;
    int rc = 0;
    char *buf = NULL;
    if (fstat(fd, &sb) != 0) {
        rc = -errno;
        fail(err, errlen, 0, "%s", strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        rc = fail(err, errlen, 0, "not a regular file");
    } else if (sb.st_size > CRUX_LINKS_MAX_BYTES) {
        rc = fail(err, errlen, 0, "larger than %d bytes", CRUX_LINKS_MAX_BYTES);
    } else if ((buf = malloc(CRUX_LINKS_MAX_BYTES + 1)) == NULL) {
        rc = -ENOMEM;
    } else {
        /* read up to one byte past the limit: the file may have grown since fstat */
        size_t got = 0;
        ssize_t r;
        while (got <= CRUX_LINKS_MAX_BYTES &&
               (r = read(fd, buf + got, CRUX_LINKS_MAX_BYTES + 1 - got)) > 0)
            got += (size_t)r;
        rc = crux_links_parse(buf, got, out, err, errlen);
    }
    free(buf);
    close(fd);
    return rc;
}

int crux_links_find(const struct crux_links *m, const char *device)
{
    for (unsigned i = 0; i < m->n; i++)
        if (strcmp(m->dev[i].device, device) == 0)
            return (int)m->dev[i].link;
    return -1;
}
