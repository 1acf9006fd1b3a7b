/*
 * crux_pcie.h - PCIe semaphores: one priority-aware lock per shared PCIe link, in a
 * shared-memory file that the crux agent creates (crux_pcie_create, transport/pcie.py) and
 * every job on the host maps (crux_pcie_open). When a higher-priority job wants a PCIe link
 * that several jobs share, lower-priority jobs wait for it.
 *
 * File layout: a 64-byte header at offset 0, then `links` link records of `link_size` bytes.
 * A link record holds a process-shared robust pthread mutex, so its size is that of this ABI:
 * the file lives in /run, never leaves the host, and open() refuses a file whose link_size
 * differs from sizeof(struct crux_pcie_link).
 *
 * Grant rule: the link is granted when it is free AND the caller is the best alive waiter:
 * highest level first, FIFO (lowest sequence number) within a level. Non-preemptive: a holder
 * keeps the link until it releases it. An arrival that finds the link free and nobody queued
 * takes it at once (fast path); otherwise it queues, so a higher level arrival goes ahead of
 * every queued lower level and nobody overtakes an equal or higher level already queued.
 *
 * Waiting: waiters sleep on a futex word in the link (`wake`), bumped by release, with a short
 * timeout (CRUX_PCIE_POLL_NS). This is a condition variable built on the futex directly rather
 * than a pthread_cond_t: glibc before 2.41 keeps per-group waiter references in a shared
 * condvar (__g_refs) that a waiter SIGKILLed inside pthread_cond_wait never drops, and the next
 * signal/broadcast that switches groups then waits for it forever. A killed futex waiter leaves
 * nothing behind.
 *
 * Liveness: nothing may deadlock because a job died.
 *   - The link mutex is PTHREAD_MUTEX_ROBUST: a process that dies holding it hands the next
 *     locker EOWNERDEAD; it calls pthread_mutex_consistent and repairs the link (recounts the
 *     queue, purges dead holder and waiters; `repairs` counts these).
 *   - A dead holder or queued waiter is purged (`recovered` counts them) by the waiters: on
 *     every poll timeout they check the holder and every queued pid, and on every wake-up the
 *     best waiter when it is not themselves. Dead = kill(pid, 0) fails with ESRCH, or
 *     /proc/<pid>/stat says zombie (a killed job whose parent has not reaped it yet).
 * Limitations:
 *   - Holders and waiters are identified by pid (getpid(), the thread-group id): every job that
 *     maps the file must see the others' pids in one pid namespace (the host's, or one shared
 *     namespace). A job in its own pid namespace (a container without hostPID) must not use the
 *     file: its pids would collide with others' and liveness checks would be wrong. The agent
 *     should give such jobs no path (they fail open, without the semaphore).
 *   - A pid reused by a new process after its holder died unnoticed looks alive: the link stays
 *     held until that process exits. Waiters poll every 10 ms, so the window is small.
 *   - Threads of one process share a pid: any of them may release a link another took.
 *   - Not re-entrant: a holder that acquires the same link again waits for itself.
 *
 * Errors are negative errno values; callers fail open (proceed without the semaphore).
 */
#ifndef CRUX_PCIE_H
#define CRUX_PCIE_H

#include <pthread.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>

#define CRUX_PCIE_MAGIC 0x3149435058555243ULL /* "CRUXPCI1" read as a little-endian u64 */
#define CRUX_PCIE_VERSION 1
#define CRUX_PCIE_DEFAULT_PATH "/run/crux/pcie"
#define CRUX_PCIE_HEADER_SIZE 64
#define CRUX_PCIE_LEVELS 8        /* levels 0..7, 7 the highest */
#define CRUX_PCIE_QUEUE 64        /* waiters per link */
#define CRUX_PCIE_MAX_LINKS 1024
#ifndef CRUX_PCIE_POLL_NS
#define CRUX_PCIE_POLL_NS 10000000L /* 10 ms: how often a waiter checks for dead pids */
#endif

struct crux_pcie_header {
    uint64_t magic;       /* CRUX_PCIE_MAGIC */
    uint32_t version;     /* CRUX_PCIE_VERSION */
    uint32_t header_size; /* 64 */
    uint32_t link_size;   /* sizeof(struct crux_pcie_link) */
    uint32_t links;       /* number of link records, 1..CRUX_PCIE_MAX_LINKS */
    uint32_t levels;      /* CRUX_PCIE_LEVELS */
    uint32_t queue_len;   /* CRUX_PCIE_QUEUE */
    uint32_t creator_pid;
    uint8_t reserved[28];
};
_Static_assert(sizeof(struct crux_pcie_header) == CRUX_PCIE_HEADER_SIZE, "header size");

struct crux_pcie_waiter {
    int32_t pid;    /* 0 = empty slot; written last when queueing */
    uint32_t level;
    uint64_t seq;   /* arrival order on this link, unique */
};

struct crux_pcie_link {
    alignas(64) pthread_mutex_t mutex; /* process-shared, robust; guards everything below */
    uint32_t wake;        /* futex word: bumped on release/purge, read atomically */
    int32_t holder_pid;   /* 0 = free */
    uint32_t holder_level;
    uint32_t nwaiters;    /* occupied queue slots */
    uint64_t next_seq;
    uint64_t grants;      /* acquisitions granted */
    uint64_t contended;   /* of which had to queue */
    uint64_t recovered;   /* dead holders and waiters purged */
    uint64_t repairs;     /* link mutexes recovered from EOWNERDEAD */
    struct crux_pcie_waiter queue[CRUX_PCIE_QUEUE];
};

typedef struct crux_pcie crux_pcie_t;

struct crux_pcie_stats {
    int32_t holder_pid;   /* 0 = free */
    uint32_t holder_level;
    uint32_t waiters[CRUX_PCIE_LEVELS]; /* queued waiters per level */
    uint64_t grants;
    uint64_t contended;
    uint64_t recovered;
    uint64_t repairs;
};

#ifdef __cplusplus
extern "C" {
#endif

/* Agent side: create (or replace, atomically by rename) the file at `path` with `links` free
 * links, mode 0660. 0 or a negative errno. Replace it only while no job uses it. */
int crux_pcie_create(const char *path, unsigned links);

/* Map an existing file; NULL with errno set (EINVAL for a file that is not a valid semaphore
 * file of this version and ABI) on failure. */
crux_pcie_t *crux_pcie_open(const char *path);
void crux_pcie_close(crux_pcie_t *p);
unsigned crux_pcie_links(const crux_pcie_t *p);

/* Block until `link` is granted at `level` (0..CRUX_PCIE_LEVELS-1). 0 or a negative errno:
 * -EINVAL bad link/level/handle, -ENOSPC the link's queue is full, -ENOTRECOVERABLE. */
int crux_pcie_acquire(crux_pcie_t *p, unsigned link, unsigned level);
/* As acquire, giving up after timeout_ns (< 0: never) with -ETIMEDOUT. */
int crux_pcie_acquire_timed(crux_pcie_t *p, unsigned link, unsigned level, int64_t timeout_ns);
/* Only the holder's process may release: -EPERM otherwise (also when the link is free). */
int crux_pcie_release(crux_pcie_t *p, unsigned link);

/* Snapshot of one link (purges dead pids first). 0 or a negative errno. */
int crux_pcie_stats(crux_pcie_t *p, unsigned link, struct crux_pcie_stats *out);

/* Lock-free look for a holder's fast path (the wrapper's gate, crux_gate.c): the highest level
 * queued on `link`, -1 when nobody is queued (or the link is bad); *holder, when not NULL, gets
 * 0 (free), 1 (this process holds it) or 2 (another process does). Read without the link mutex,
 * so it may be stale by the time the caller acts: a hint, never a grant. Purges nothing. */
int crux_pcie_peek(const crux_pcie_t *p, unsigned link, int *holder);

/* Test hook: lock the link's internal mutex and return without unlocking, so a test can kill
 * the process while it holds it. Never call it otherwise. */
int crux_pcie__test_lock_internal(crux_pcie_t *p, unsigned link);

#ifdef __cplusplus
}
#endif

#endif /* CRUX_PCIE_H */
