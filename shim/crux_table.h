/*
 * crux_table.h - the decision table: a shared-memory file with one writer (the crux agent,
 * transport/decision_table.py) and many readers (the shim inside training jobs).
 *
 * This header is the source of truth for the layout; the Python mirror checks itself against
 * the same offsets. See docs/decision-table.md.
 *
 * File layout: a 64-byte header at offset 0, then `capacity` entries of 128 bytes, entry i at
 * offset 64 + i * 128. All integers are in host byte order: the file lives in /run and never
 * leaves the host, so there is nothing to convert.
 *
 * Concurrency: each entry is guarded by its own seqlock (`seq`). The writer makes seq odd,
 * rewrites the body, makes seq even again; a reader copies the entry and keeps the copy only if
 * seq was even and unchanged around the copy. Readers never block the writer and never write.
 * Every failure on the reader side (bad header, torn reads that keep failing) returns -1 so the
 * caller falls back to the NIC's defaults: fail open, never break the job.
 *
 * The body is copied with relaxed 32-bit atomic loads/stores rather than memcpy so the racy copy
 * is not a data race in the C11 sense; on x86-64 and arm64 it compiles to plain moves.
 */
#ifndef CRUX_TABLE_H
#define CRUX_TABLE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "crux_busguard.h"

#define CRUX_TABLE_MAGIC 0x314C425458555243ULL /* "CRUXTBL1" read as a little-endian u64 */
#define CRUX_TABLE_VERSION 1
#define CRUX_TABLE_DEFAULT_PATH "/run/crux/decisions"
#define CRUX_JOB_ID_LEN 64 /* bytes incl. the terminating NUL: ids are at most 63 bytes */

#define CRUX_TABLE_HEADER_SIZE 64
#define CRUX_TABLE_ENTRY_SIZE 128

#define CRUX_TABLE_RETIRED 0x1u   /* header.flags: the writer replaced this file, reopen */
#define CRUX_ENTRY_FREE 0
#define CRUX_ENTRY_LIVE 1
#define CRUX_ENTRY_JOB_WIDE 0x1u  /* entry.flags: peer is all zero, the job's defaults */
/* entry.flags: a fuller decision follows on its own (the leader has not heard from every host
 * of the job, or has no probed path between them). The shims apply the entry as any other;
 * only crux-run, before it starts a job, waits for an entry without it. */
#define CRUX_ENTRY_PROVISIONAL 0x2u
#define CRUX_TCP_SPORTS 8         /* entry.tcp_sports slots */

/* How often a reader retries an entry the writer keeps changing before it gives up (fail
 * open). The writer holds an entry odd for about a microsecond, so this is generous. */
#ifndef CRUX_TABLE_READ_TRIES
#define CRUX_TABLE_READ_TRIES 1024
#endif

struct crux_table_header {
    uint64_t magic;           /* CRUX_TABLE_MAGIC */
    uint32_t version;         /* CRUX_TABLE_VERSION */
    uint32_t header_size;     /* 64 */
    uint32_t entry_size;      /* 128 */
    uint32_t capacity;        /* number of entry slots after the header; fixed at creation */
    uint64_t generation;      /* bumped by the writer after every batch of changes; readers
                                 may cache lookups until it moves */
    uint64_t plan_generation; /* leader plan the table reflects */
    uint64_t updated_ns;      /* CLOCK_REALTIME of last change */
    uint32_t writer_pid;
    uint32_t flags;           /* bit0 CRUX_TABLE_RETIRED; kept at offset 52 in every version */
    uint32_t used;            /* slots [0, used) may be live; never above capacity */
    uint8_t reserved[4];
};

struct crux_table_entry {
    uint32_t seq;           /* seqlock: odd while the writer changes the entry */
    uint8_t state;          /* CRUX_ENTRY_FREE or CRUX_ENTRY_LIVE */
    uint8_t level;          /* priority level */
    uint8_t dscp;           /* 0..63 */
    uint8_t traffic_class;  /* IPv6 traffic class / RoCE GRH TC */
    uint16_t sport;         /* UDP source port, 0 = leave the NIC's choice */
    uint16_t flags;         /* bit0 CRUX_ENTRY_JOB_WIDE, bit1 CRUX_ENTRY_PROVISIONAL */
    uint32_t reserved0;
    uint8_t peer[16];       /* IPv6, or IPv4-mapped ::ffff:a.b.c.d; all zero = job-wide entry */
    char job_id[CRUX_JOB_ID_LEN]; /* NUL-padded UTF-8 */
    uint64_t plan_generation;     /* plan this entry came from */
    /* TCP (the socket interposer, crux_sock.c): the destination port the source ports below
     * were probed for, 0 = none; a connect to another port gets only the traffic class. */
    uint16_t tcp_dport;
    /* Probed TCP source ports toward this peer on the chosen path; unused slots 0. A set, not
     * one port: a job opens several sockets to a peer and a 4-tuple can be used only once. */
    uint16_t tcp_sports[CRUX_TCP_SPORTS];
    uint8_t reserved[6];
};

#define CRUX__CHECK(type, field, off, size)                                              \
    _Static_assert(offsetof(struct type, field) == (off), #type "." #field " offset"); \
    _Static_assert(sizeof(((struct type *)0)->field) == (size), #type "." #field " size")

CRUX__CHECK(crux_table_header, magic, 0, 8);
CRUX__CHECK(crux_table_header, version, 8, 4);
CRUX__CHECK(crux_table_header, header_size, 12, 4);
CRUX__CHECK(crux_table_header, entry_size, 16, 4);
CRUX__CHECK(crux_table_header, capacity, 20, 4);
CRUX__CHECK(crux_table_header, generation, 24, 8);
CRUX__CHECK(crux_table_header, plan_generation, 32, 8);
CRUX__CHECK(crux_table_header, updated_ns, 40, 8);
CRUX__CHECK(crux_table_header, writer_pid, 48, 4);
CRUX__CHECK(crux_table_header, flags, 52, 4);
CRUX__CHECK(crux_table_header, used, 56, 4);
CRUX__CHECK(crux_table_header, reserved, 60, 4);
_Static_assert(sizeof(struct crux_table_header) == CRUX_TABLE_HEADER_SIZE, "header size");

CRUX__CHECK(crux_table_entry, seq, 0, 4);
CRUX__CHECK(crux_table_entry, state, 4, 1);
CRUX__CHECK(crux_table_entry, level, 5, 1);
CRUX__CHECK(crux_table_entry, dscp, 6, 1);
CRUX__CHECK(crux_table_entry, traffic_class, 7, 1);
CRUX__CHECK(crux_table_entry, sport, 8, 2);
CRUX__CHECK(crux_table_entry, flags, 10, 2);
CRUX__CHECK(crux_table_entry, reserved0, 12, 4);
CRUX__CHECK(crux_table_entry, peer, 16, 16);
CRUX__CHECK(crux_table_entry, job_id, 32, 64);
CRUX__CHECK(crux_table_entry, plan_generation, 96, 8);
CRUX__CHECK(crux_table_entry, tcp_dport, 104, 2);
CRUX__CHECK(crux_table_entry, tcp_sports, 106, 16);
CRUX__CHECK(crux_table_entry, reserved, 122, 6);
_Static_assert(sizeof(struct crux_table_entry) == CRUX_TABLE_ENTRY_SIZE, "entry size");
_Static_assert(offsetof(struct crux_table_entry, peer) == 4 * 4, "peer is words 4..7");
_Static_assert(offsetof(struct crux_table_entry, job_id) == 8 * 4, "job_id from word 8");
/* The word-wise copies below view the structs as arrays of atomic u32. */
_Static_assert(sizeof(_Atomic uint32_t) == sizeof(uint32_t), "atomic u32 is a plain u32");
_Static_assert(sizeof(_Atomic uint64_t) == sizeof(uint64_t), "atomic u64 is a plain u64");

#define CRUX__WORDS (CRUX_TABLE_ENTRY_SIZE / 4)

static inline uint32_t crux__load32(const void *p, memory_order mo)
{
    return atomic_load_explicit((const _Atomic uint32_t *)p, mo);
}

static inline uint64_t crux__load64(const void *p, memory_order mo)
{
    return atomic_load_explicit((const _Atomic uint64_t *)p, mo);
}

/* Header fields the writer changes after creation; the rest are fixed once the file is in
 * place. `generation` uses acquire so entries read after it are at least that new. */
static inline uint64_t crux__table_generation(const struct crux_table_header *h)
{
    return crux__load64(&h->generation, memory_order_acquire);
}

static inline int crux__table_retired(const struct crux_table_header *h)
{
    return (crux__load32(&h->flags, memory_order_relaxed) & CRUX_TABLE_RETIRED) != 0;
}

/* Every reader entry point below reads the mapping under CRUX_BUS_GUARDED: a file shrunk
 * while mapped reads as unusable (a table of generation 0, retired, invalid, no entry), never
 * as a crash. */
struct crux__header_read {
    const struct crux_table_header *h;
    uint64_t generation;
    int retired;
};

static void crux__header_read(void *ctx)
{
    struct crux__header_read *c = ctx;
    c->generation = crux__table_generation(c->h);
    c->retired = crux__table_retired(c->h);
}

static inline uint64_t crux_table_generation(const struct crux_table_header *h)
{
    struct crux__header_read c = {h, 0, 1};
    return crux__bus_call(crux__header_read, &c) == 0 ? c.generation : 0;
}

static inline int crux_table_retired(const struct crux_table_header *h)
{
    struct crux__header_read c = {h, 0, 1};
    return crux__bus_call(crux__header_read, &c) == 0 ? c.retired : 1;
}

static inline const struct crux_table_entry *crux_table_entries(const void *base)
{
    return (const struct crux_table_entry *)((const char *)base + CRUX_TABLE_HEADER_SIZE);
}

static inline int crux__table_validate(const void *base, size_t len)
{
    const struct crux_table_header *h = (const struct crux_table_header *)base;
    if (base == NULL || len < CRUX_TABLE_HEADER_SIZE)
        return -1;
    if (h->magic != CRUX_TABLE_MAGIC || h->version != CRUX_TABLE_VERSION)
        return -1;
    if (h->header_size != CRUX_TABLE_HEADER_SIZE || h->entry_size != CRUX_TABLE_ENTRY_SIZE)
        return -1;
    if ((len - CRUX_TABLE_HEADER_SIZE) / CRUX_TABLE_ENTRY_SIZE < h->capacity)
        return -1;
    return 0;
}

/* 0 if `base` (a mapping of `len` bytes) holds a table this header understands, else -1. */
struct crux__validate {
    const void *base;
    size_t len;
    int rc;
};

static void crux__validate_fn(void *ctx)
{
    struct crux__validate *c = ctx;
    c->rc = crux__table_validate(c->base, c->len);
}

static inline int crux_table_validate(const void *base, size_t len)
{
    struct crux__validate c = {base, len, -1};
    return crux__bus_call(crux__validate_fn, &c) == 0 ? c.rc : -1;
}

/* Seqlock read of one entry into *out. 0 on a consistent copy, -1 if the writer kept the
 * entry busy for CRUX_TABLE_READ_TRIES attempts (the caller should fail open). */
static inline int crux_table_read_entry(const struct crux_table_entry *e,
                                        struct crux_table_entry *out)
{
    const uint32_t *src = (const uint32_t *)e;
    uint32_t words[CRUX__WORDS]; /* memcpy'd into *out at the end: no type punning on it */
    for (int tries = 0; tries < CRUX_TABLE_READ_TRIES; tries++) {
        uint32_t s1 = crux__load32(&e->seq, memory_order_acquire);
        if (s1 & 1u)
            continue; /* writer is mid-change */
        words[0] = s1;
        for (int i = 1; i < CRUX__WORDS; i++)
            words[i] = crux__load32(&src[i], memory_order_relaxed);
        /* Order the body loads before the re-check of seq. */
        atomic_thread_fence(memory_order_acquire);
        if (crux__load32(&e->seq, memory_order_relaxed) == s1) {
            memcpy(out, words, sizeof words);
            return 0;
        }
    }
    return -1;
}

/* One pass over the table for (job_id, peer): 0 and *out filled for the per-peer entry; with
 * `or_job_wide`, 1 and *out filled for the job's job-wide entry when there is no per-peer one;
 * -1 otherwise (not found, invalid table, bad job id, or entries that stayed torn). */
static inline int crux__table_find_raw(const void *base, size_t len, const char *job_id,
                                       const uint8_t peer[16], int or_job_wide,
                                       struct crux_table_entry *out)
{
    static const uint8_t zero_peer[16];
    char want[CRUX_JOB_ID_LEN] = {0};
    size_t n;
    if (job_id == NULL || crux__table_validate(base, len) != 0)
        return -1;
    n = strlen(job_id);
    if (n == 0 || n >= CRUX_JOB_ID_LEN)
        return -1;
    memcpy(want, job_id, n);
    if (peer == NULL)
        peer = zero_peer;

    const struct crux_table_header *h = (const struct crux_table_header *)base;
    const struct crux_table_entry *entries = crux_table_entries(base);
    uint32_t used = crux__load32(&h->used, memory_order_acquire);
    uint32_t want_peer[4], want_job[CRUX_JOB_ID_LEN / 4];
    memcpy(want_peer, peer, 16);
    memcpy(want_job, want, CRUX_JOB_ID_LEN);
    int found = -1;
    if (used > h->capacity)
        used = h->capacity;
    for (uint32_t i = 0; i < used; i++) {
        /* Screen on the job id and peer without copying the entry: most entries differ there.
         * A mismatch counts only if seq was even and unchanged around the loads; anything else
         * gets the full seqlock read. */
        const uint32_t *w = (const uint32_t *)&entries[i];
        uint32_t s1 = crux__load32(&entries[i].seq, memory_order_acquire);
        int other_job = 0, other_peer = 0, jobwide = 1;
        for (int k = 0; k < CRUX_JOB_ID_LEN / 4 && !other_job; k++)
            other_job = crux__load32(&w[8 + k], memory_order_relaxed) != want_job[k];
        for (int k = 0; k < 4 && !other_job; k++) {
            uint32_t v = crux__load32(&w[4 + k], memory_order_relaxed);
            jobwide &= v == 0;
            other_peer |= v != want_peer[k];
        }
        /* this job's job-wide entry is a candidate when no per-peer entry turns up */
        int differs = other_job || (other_peer && !(or_job_wide && jobwide && found < 0));
        atomic_thread_fence(memory_order_acquire);
        if (differs && !(s1 & 1u) && crux__load32(&entries[i].seq, memory_order_relaxed) == s1)
            continue;
        struct crux_table_entry e;
        if (crux_table_read_entry(&entries[i], &e) != 0)
            continue; /* torn for too long: treat as absent */
        if (e.state != CRUX_ENTRY_LIVE || memcmp(e.job_id, want, CRUX_JOB_ID_LEN) != 0)
            continue;
        if (memcmp(e.peer, peer, 16) == 0) {
            *out = e;
            return 0;
        }
        if (or_job_wide && found < 0 && memcmp(e.peer, zero_peer, 16) == 0) {
            *out = e;
            found = 1;
        }
    }
    return found;
}

struct crux__find {
    const void *base;
    size_t len;
    const char *job_id;
    const uint8_t *peer;
    int or_job_wide;
    int rc;
    struct crux_table_entry e;
};

static void crux__find_fn(void *ctx)
{
    struct crux__find *c = ctx;
    c->rc = crux__table_find_raw(c->base, c->len, c->job_id, c->peer, c->or_job_wide, &c->e);
}

static inline int crux__table_find(const void *base, size_t len, const char *job_id,
                                   const uint8_t peer[16], int or_job_wide,
                                   struct crux_table_entry *out)
{
    struct crux__find c = {base, len, job_id, peer, or_job_wide, -1, {0}};
    if (crux__bus_call(crux__find_fn, &c) != 0 || c.rc < 0)
        return -1;
    *out = c.e; /* only from a read that finished */
    return c.rc;
}

/* Find the live entry for (job_id, peer). peer is 16 bytes (IPv6 or IPv4-mapped), or NULL for
 * the job-wide entry. 0 and *out filled if found; -1 if not found, the table is invalid, the
 * job id is too long, or an entry stayed torn: in every case the caller fails open. */
static inline int crux_table_lookup(const void *base, size_t len, const char *job_id,
                                    const uint8_t peer[16], struct crux_table_entry *out)
{
    return crux__table_find(base, len, job_id, peer, 0, out);
}

/* The decision for a connection: the (job_id, peer) entry, else the job's job-wide entry, in
 * one pass. 0 per-peer, 1 job-wide (*out filled), -1 none (fail open). */
static inline int crux_table_decision(const void *base, size_t len, const char *job_id,
                                      const uint8_t peer[16], struct crux_table_entry *out)
{
    return crux__table_find(base, len, job_id, peer, 1, out);
}

/* Single-writer seqlock store of the first `words` 32-bit words (at most 32) of a record whose
 * first word is its seq; the words after them are left alone (the QP records' counters, which
 * others add to: crux_qps.h). The seq in *val is ignored. */
static inline void crux_seq_write_words(void *rec, const void *val, int words)
{
    _Atomic uint32_t *seq = (_Atomic uint32_t *)rec;
    uint32_t s = atomic_load_explicit(seq, memory_order_relaxed);
    atomic_store_explicit(seq, s + 1, memory_order_relaxed);
    /* The odd seq must be visible before any body store. */
    atomic_thread_fence(memory_order_release);
    uint32_t w[CRUX__WORDS];
    memcpy(w, val, (size_t)words * 4);
    _Atomic uint32_t *dst = (_Atomic uint32_t *)rec;
    for (int i = 1; i < words; i++)
        atomic_store_explicit(&dst[i], w[i], memory_order_relaxed);
    /* Body before the even seq. */
    atomic_store_explicit(seq, s + 2, memory_order_release);
}

/* The same for a whole 128-byte record (decision table entries). */
static inline void crux_seq_write128(void *rec, const void *val)
{
    crux_seq_write_words(rec, val, CRUX__WORDS);
}

/* Writer side (single writer only): replace entry *e with *val under the seqlock. */
static inline void crux_table_write_entry(struct crux_table_entry *e,
                                          const struct crux_table_entry *val)
{
    crux_seq_write128(e, val);
}

#endif /* CRUX_TABLE_H */
