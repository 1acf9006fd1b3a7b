/*
 * crux_tablemap.h - a reader's read-only mapping of the decision table, kept current. Shared by
 * the wrapper libibverbs and the socket interposer; header-only, so each library has its own
 * copy and neither exports it. The caller serialises calls for one map.
 *
 * A retired table (the agent replaced the file by rename) is reopened at once; a missing or
 * unusable one is looked for again at most once a second, so a job without an agent pays one
 * failed open() a second at most. An empty file maps as a bad table, not a missing one.
 *
 * A file shrunk in place (truncate, a full disk, a hostile writer) would fault every load past
 * its new end: each refresh fstat()s the open file and drops a mapping the file no longer
 * covers, and the reads themselves are guarded (crux_busguard.h) for a shrink in between.
 */
#ifndef CRUX_TABLEMAP_H
#define CRUX_TABLEMAP_H

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crux_table.h"

#define CRUX_TABLEMAP_REOPEN_NS 1000000000ull

struct crux_tablemap {
    const void *table;     /* read-only mapping, NULL when none */
    size_t len;
    int fd1;               /* the mapped file's fd + 1, kept to fstat it; 0 (zeroed) none */
    int missing;           /* 1: no file at all (NO_TABLE), 0: a file, maybe bad */
    uint64_t next_open_ns; /* earliest time to look for the table again */
};

static inline void crux__tablemap_close(struct crux_tablemap *m)
{
    if (m->table != NULL && m->len > 0)
        munmap((void *)m->table, m->len);
    m->table = NULL;
    m->len = 0;
    if (m->fd1 > 0)
        close(m->fd1 - 1);
    m->fd1 = 0;
}

/* 1 while the file still covers the whole mapping. */
static inline int crux__tablemap_covered(const struct crux_tablemap *m)
{
    struct stat sb;
    return m->fd1 > 0 && fstat(m->fd1 - 1, &sb) == 0 && sb.st_size >= 0 &&
           (size_t)sb.st_size >= m->len;
}

static inline void crux__tablemap_open(struct crux_tablemap *m, const char *path)
{
    static const char empty[1];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    m->missing = 1;
    if (fd < 0)
        return;
    if (fstat(fd, &sb) == 0) {
        m->missing = 0;
        m->table = empty;
        if (sb.st_size > 0) {
            void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
            if (p != MAP_FAILED) {
                m->table = p;
                m->len = (size_t)sb.st_size;
                m->fd1 = fd + 1;
                return;
            }
        }
    }
    close(fd);
}

/* Bring the mapping up to date; 1 if it was (re)opened, so lookups cached from the old file
 * must go, else 0. */
static inline int crux_tablemap_refresh(struct crux_tablemap *m, const char *path)
{
    int usable = m->table != NULL && m->len > 0 && crux__tablemap_covered(m) &&
                 crux_table_validate(m->table, m->len) == 0;
    if (usable && !crux_table_retired(m->table))
        return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    if (!usable && now < m->next_open_ns)
        return 0;
    crux__tablemap_close(m);
    crux__tablemap_open(m, path);
    m->next_open_ns = now + CRUX_TABLEMAP_REOPEN_NS;
    return 1;
}

#endif /* CRUX_TABLEMAP_H */
