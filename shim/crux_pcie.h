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
 * keeps the link until it releases it, except as bounded under "Trust" below. An arrival that finds the link free and nobody queued
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
 * Trust: every job in the agent's group maps the file read-write, so any of them can write any
 * byte of it, and a job can stop itself (SIGSTOP) at any point. The file is a priority hint
 * between cooperating jobs, never a mutual-exclusion lock for data: what a member writes can
 * cost the others no more than bounded waits, after which they go ahead without the link
 * (fail open). The bounds (issue 37, item 2; docs/security.md):
 *   - Internal lock. The link mutex is only ever taken with a deadline (CRUX_PCIE_LOCK_NS,
 *     2 ms): a process stopped (or spinning) inside it costs each acquire, release or stats at
 *     most that, after which the call fails with -EBUSY having changed nothing (release then
 *     clears its own holder_pid with one compare-and-swap instead). A waiter that cannot take
 *     it again before its own deadline leaves its queue slot marked abandoned (polled_ns = 0,
 *     a lock-free store), which the next purge drops.
 *   - Lease. A hold that has kept waiters waiting for CRUX_PCIE_LEASE_NS (20 ms) ends for
 *     any waiter of an equal or higher level (`expired`). The lease runs from the first time a
 *     waiter (or stats) finds the link held (held_since_ns, 0 until then: the uncontended fast
 *     path reads no clock), so a job that streamed alone for a long time still gets the
 *     lease to give the link up at its next post. An honest holder (the wrapper's gate)
 *     gives the link up at its next post anyway when such a level waits, so the lease only
 *     takes it from a holder that does not post: stopped, stuck, gone quiet with work in flight,
 *     or hostile. Lower levels never take it by lease: they wait their own timeout, as they
 *     would for an honest busy holder. CRUX_PCIE_LEASE_MS in the environment of the process
 *     that opens the file (read at open, 0: none) changes it for that process's waits.
 *   - Stopped holders (/proc/<pid>/stat state T or t) lose the link to any waiter at once
 *     (`stopped`); so do stopped queued waiters.
 *   - Membership. A holder or waiter records its process start time (/proc/<pid>/stat field 22,
 *     plus one). One whose pid's start time differs is not the process that took the link (a
 *     pid written by another member, such as holder_pid = 1, or a pid reused after its owner
 *     died) and is purged at once (`foreign`). The start time of another process is readable
 *     by any member, so this stops a careless or accidental write, not a member that forges
 *     both fields: that one is bounded by the lease and by the waiters' timeouts.
 *   - Queue slots. Every waiter refreshes its slot's polled_ns each time it looks at the link
 *     (at least every CRUX_PCIE_POLL_NS); a slot not refreshed for CRUX_PCIE_STALE_NS (100 ms)
 *     is dropped (`stale`), so a forged, stopped or abandoned entry cannot hold the queue.
 *   - The agent can take the link from its holder (crux_pcie_revoke, `revoked`). A revoked or
 *     purged holder's later release fails with -EPERM and changes nothing: release checks that
 *     holder_pid is the caller's pid.
 *   - Times are CLOCK_MONOTONIC, one clock for the whole host. A time in the future (forged)
 *     counts as expired or stale.
 * These checks cost syscalls (kill, a read of /proc/<pid>/stat), so they run only on the
 * contended path: at a contended arrival and on a waiter's poll, at most once per
 * CRUX_PCIE_CHECK_NS per link (`checked_ns`). The uncontended acquire and release are the
 * mutex and a few stores, as before.
 *
 * Liveness: nothing may deadlock because a job died.
 *   - The link mutex is PTHREAD_MUTEX_ROBUST: a process that dies holding it hands the next
 *     locker EOWNERDEAD; it calls pthread_mutex_consistent and repairs the link (recounts the
 *     queue, purges dead holder and waiters; `repairs` counts these).
 *   - A dead holder or queued waiter is purged (`recovered` counts them) by the waiters: on
 *     a poll timeout (at most one check pass per link per CRUX_PCIE_CHECK_NS) they check the
 *     holder and every queued pid, and on every wake-up the best waiter when it is not
 *     themselves. Dead = kill(pid, 0) fails with ESRCH, or /proc/<pid>/stat says zombie (a
 *     killed job whose parent has not reaped it yet). Queued waiters other than the best get
 *     kill() only: a zombie or stopped one is found when it becomes the best.
 * Limitations:
 *   - Holders and waiters are identified by pid (getpid(), the thread-group id): every job that
 *     maps the file must see the others' pids in one pid namespace (the host's, or one shared
 *     namespace), and one time namespace (start times and CLOCK_MONOTONIC are per time
 *     namespace). A job in its own pid namespace (a container without hostPID) must not use the
 *     file: its pids would collide with others' and liveness checks would be wrong. The agent
 *     should give such jobs no path (they fail open, without the semaphore).
 *   - Where /proc/<pid> of another user cannot be read (hidepid), the stopped and start-time
 *     checks see nothing and only death, the lease and the timeouts apply.
 *   - Threads of one process share a pid: any of them may release a link another took, and a
 *     waiter never takes the link by lease from its own process.
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
#define CRUX_PCIE_VERSION 2 /* 2: lease, start times, bounded internal lock (issue 37) */
#define CRUX_PCIE_DEFAULT_PATH "/run/crux/pcie"
#define CRUX_PCIE_HEADER_SIZE 64
#define CRUX_PCIE_LEVELS 8        /* levels 0..7, 7 the highest */
#define CRUX_PCIE_QUEUE 64        /* waiters per link */
#define CRUX_PCIE_MAX_LINKS 1024
#ifndef CRUX_PCIE_POLL_NS
#define CRUX_PCIE_POLL_NS 10000000L /* 10 ms: how often a waiter checks for dead pids */
#endif
#ifndef CRUX_PCIE_LOCK_NS
#define CRUX_PCIE_LOCK_NS 2000000L /* 2 ms: longest wait for a link's internal mutex */
#endif
#ifndef CRUX_PCIE_LEASE_NS
#define CRUX_PCIE_LEASE_NS 20000000L /* 20 ms: a hold equal or higher levels may end */
#endif
#ifndef CRUX_PCIE_STALE_NS
#define CRUX_PCIE_STALE_NS 100000000L /* 100 ms: a queue slot not refreshed is dropped */
#endif
#ifndef CRUX_PCIE_CHECK_NS
#define CRUX_PCIE_CHECK_NS 1000000L /* 1 ms: at most one /proc check pass per link */
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
    int32_t pid;        /* 0 = empty slot; written last when queueing */
    uint32_t level;
    uint64_t seq;       /* arrival order on this link, unique */
    uint64_t start;     /* the waiter's start time (/proc/<pid>/stat field 22) + 1 */
    int64_t polled_ns;  /* CLOCK_MONOTONIC when it last looked; 0: abandoned */
};

/* A link record has a fixed layout on every architecture (the mutex gets 64 bytes of its own),
 * which transport/pcie.py mirrors: offsets are asserted below. */
struct crux_pcie_link {
    alignas(64) union {   /* process-shared, robust; guards everything below */
        pthread_mutex_t mutex;
        uint8_t mutex_space[64];
    };
    uint32_t wake;        /* 64: futex word: bumped on release/purge, read atomically */
    int32_t holder_pid;   /* 68: 0 = free */
    uint32_t holder_level;/* 72 */
    uint32_t nwaiters;    /* 76: occupied queue slots */
    uint64_t holder_start;/* 80: the holder's start time + 1 (as crux_pcie_waiter.start) */
    int64_t held_since_ns;/* 88: CLOCK_MONOTONIC when first found held by another (0: not yet) */
    uint64_t next_seq;    /* 96 */
    int64_t checked_ns;   /* 104: last /proc check pass on this link */
    uint64_t reserved0[2];
    uint64_t grants;      /* 128: acquisitions granted */
    uint64_t contended;   /* of which had to queue */
    uint64_t recovered;   /* dead holders and waiters purged */
    uint64_t repairs;     /* link mutexes recovered from EOWNERDEAD */
    uint64_t expired;     /* holders past the lease, ended by an equal or higher waiter */
    uint64_t stopped;     /* stopped holders and waiters purged */
    uint64_t foreign;     /* holders and waiters whose pid is another process (start time) */
    uint64_t stale;       /* queue slots not refreshed (abandoned, forged) dropped */
    uint64_t revoked;     /* holders the agent took the link from (crux_pcie_revoke) */
    uint64_t reserved1[7];
    struct crux_pcie_waiter queue[CRUX_PCIE_QUEUE]; /* 256 */
};
_Static_assert(sizeof(pthread_mutex_t) <= 64, "mutex space");
_Static_assert(offsetof(struct crux_pcie_link, wake) == 64, "layout");
_Static_assert(offsetof(struct crux_pcie_link, holder_pid) == 68, "layout");
_Static_assert(offsetof(struct crux_pcie_link, holder_start) == 80, "layout");
_Static_assert(offsetof(struct crux_pcie_link, held_since_ns) == 88, "layout");
_Static_assert(offsetof(struct crux_pcie_link, checked_ns) == 104, "layout");
_Static_assert(offsetof(struct crux_pcie_link, grants) == 128, "layout");
_Static_assert(offsetof(struct crux_pcie_link, queue) == 256, "layout");
_Static_assert(sizeof(struct crux_pcie_waiter) == 32, "layout");
_Static_assert(sizeof(struct crux_pcie_link) == 256 + 32 * CRUX_PCIE_QUEUE, "layout");

typedef struct crux_pcie crux_pcie_t;

struct crux_pcie_stats {
    int32_t holder_pid;   /* 0 = free */
    uint32_t holder_level;
    uint32_t waiters[CRUX_PCIE_LEVELS]; /* queued waiters per level */
    uint64_t grants;
    uint64_t contended;
    uint64_t recovered;
    uint64_t repairs;
    uint64_t expired;
    uint64_t stopped;
    uint64_t foreign;
    uint64_t stale;
    uint64_t revoked;
    int64_t held_ns;      /* how long the hold has been seen by others (0: free, or not yet) */
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
 * -EINVAL bad link/level/handle, -ENOSPC the link's queue is full, -ENOTRECOVERABLE, -EBUSY the
 * link's internal mutex was not had within CRUX_PCIE_LOCK_NS (someone stopped inside it). */
int crux_pcie_acquire(crux_pcie_t *p, unsigned link, unsigned level);
/* As acquire, giving up after timeout_ns (< 0: never) with -ETIMEDOUT (or -EBUSY when the
 * internal mutex stays taken): at most timeout_ns + CRUX_PCIE_LOCK_NS. */
int crux_pcie_acquire_timed(crux_pcie_t *p, unsigned link, unsigned level, int64_t timeout_ns);
/* Only the holder's process may release: -EPERM otherwise (also when the link is free, or was
 * taken from this process by the lease, a purge or the agent). Bounded like acquire. */
int crux_pcie_release(crux_pcie_t *p, unsigned link);

/* Agent side: take `link` from its holder when that is `pid` (0: whoever holds it). 1 revoked,
 * 0 the link was not held (by pid), or a negative errno. The waiters are woken; the old holder's
 * release then fails with -EPERM. */
int crux_pcie_revoke(crux_pcie_t *p, unsigned link, int32_t pid);

/* Snapshot of one link (purges dead, stopped and foreign pids first, never by lease). 0 or a
 * negative errno (-EBUSY: internal mutex stuck). */
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
