/*
 * crux_pcie.c - PCIe semaphores; see crux_pcie.h for the layout, grant rule and liveness.
 */
#define _GNU_SOURCE
#include "crux_pcie.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct crux_pcie {
    void *base;
    size_t size;
    struct crux_pcie_link *links;
    unsigned nlinks;
    int64_t lease_ns; /* CRUX_PCIE_LEASE_NS, or $CRUX_PCIE_LEASE_MS at open; 0: none */
};

#define NO_SLOT (-1)

static size_t file_size(unsigned links)
{
    return CRUX_PCIE_HEADER_SIZE + (size_t)links * sizeof(struct crux_pcie_link);
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- /proc/<pid>/stat ------------------------------------------------------------------ */

/* 1 with the state letter and start time (field 22) + 1; 0 when it cannot be read (unknown:
 * hidepid, no /proc); -1 when the process is gone. */
static int proc_stat(pid_t pid, char *state, uint64_t *start)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        /* gone between kill() and here, or hidden from us (hidepid=2): kill() tells which */
        if (errno == ENOENT && pid > 0 && kill(pid, 0) == -1 && errno == ESRCH)
            return -1;
        return 0;
    }
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *rp = strrchr(buf, ')'); /* comm may hold spaces and parentheses */
    if (rp == NULL || rp[1] != ' ' || rp[2] == '\0')
        return 0;
    *state = rp[2];
    char *f = rp + 2; /* field 3; the start time is field 22 */
    for (int i = 0; i < 19; i++) {
        f = strchr(f, ' ');
        if (f == NULL)
            return 0;
        f++;
    }
    char *end;
    unsigned long long v = strtoull(f, &end, 10);
    if (end == f)
        return 0;
    *start = (uint64_t)v + 1;
    return 1;
}

/* ---- own pid and start time ----------------------------------------------------------
 * glibc no longer caches getpid() (a syscall, ~100 ns with mitigations): cache it here and
 * forget it in fork children. A raw clone() without glibc's fork would keep the parent's pid:
 * such a child must not use this library. */

static _Atomic int32_t my_pid;
static _Atomic uint64_t my_start; /* start time + 1; 0: not read yet; UINT64_MAX: unreadable */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void forget_pid(void)
{
    atomic_store_explicit(&my_pid, 0, memory_order_relaxed);
    atomic_store_explicit(&my_start, 0, memory_order_relaxed);
}

static void install_atfork(void)
{
    pthread_atfork(NULL, NULL, forget_pid);
}

static int32_t self_pid(void)
{
    int32_t pid = atomic_load_explicit(&my_pid, memory_order_relaxed);
    if (pid == 0) {
        pthread_once(&atfork_once, install_atfork);
        pid = (int32_t)getpid();
        atomic_store_explicit(&my_pid, pid, memory_order_relaxed);
    }
    return pid;
}

/* What a holder or waiter records as its start time: 0 when /proc cannot be read, in which
 * case nobody else can check it either. */
static uint64_t self_start(void)
{
    uint64_t s = atomic_load_explicit(&my_start, memory_order_relaxed);
    if (s == 0) {
        char st;
        if (proc_stat((pid_t)self_pid(), &st, &s) != 1)
            s = UINT64_MAX;
        atomic_store_explicit(&my_start, s, memory_order_relaxed);
    }
    return s == UINT64_MAX ? 0 : s;
}

/* ---- liveness and trust ------------------------------------------------------------------ */

enum verdict { V_OK, V_DEAD, V_STOPPED, V_FOREIGN, V_STALE, V_EXPIRED };

/* Is `pid`, recorded with start time `start`, still the live, running process that recorded
 * it? full = 0: only whether it exists (one kill()). */
static enum verdict check_pid(int32_t pid, uint64_t start, int full)
{
    if (pid <= 0)
        return V_FOREIGN; /* only ever written by someone else */
    if (kill((pid_t)pid, 0) == -1 && errno == ESRCH)
        return V_DEAD; /* EPERM: exists, someone else's */
    if (!full)
        return V_OK;
    char state = 0;
    uint64_t s = 0;
    int r = proc_stat((pid_t)pid, &state, &s);
    if (r < 0)
        return V_DEAD;
    if (r == 0)
        return V_OK; /* cannot tell */
    if (state == 'Z' || state == 'X')
        return V_DEAD; /* a killed job whose parent has not reaped it yet */
    if (state == 'T' || state == 't')
        return V_STOPPED;
    return s == start ? V_OK : V_FOREIGN;
}

static void count_verdict(struct crux_pcie_link *l, enum verdict v)
{
    switch (v) {
    case V_DEAD: l->recovered++; break;
    case V_STOPPED: l->stopped++; break;
    case V_FOREIGN: l->foreign++; break;
    case V_STALE: l->stale++; break;
    case V_EXPIRED: l->expired++; break;
    case V_OK: break;
    }
}

/* ---- link state (all under the link mutex) ------------------------------------------- */

static void wake_all(struct crux_pcie_link *l)
{
    atomic_fetch_add_explicit((_Atomic uint32_t *)&l->wake, 1, memory_order_release);
}

static void futex_wake_all(struct crux_pcie_link *l)
{
    syscall(SYS_futex, &l->wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* holder_pid is read without the mutex (crux_pcie_peek) and cleared without it by a release
 * or revoke that could not have the mutex: always an atomic store. */
static void set_holder(struct crux_pcie_link *l, int32_t pid)
{
    atomic_store_explicit((_Atomic int32_t *)&l->holder_pid, pid, memory_order_relaxed);
}

/* `since`: when the hold started keeping someone waiting (0: not yet; the first waiter or
 * stats to find it held stamps it), so the uncontended fast path reads no clock. */
static void grant(struct crux_pcie_link *l, int32_t me, unsigned level, int64_t since)
{
    l->holder_level = level;
    l->holder_start = self_start();
    l->held_since_ns = since;
    set_holder(l, me);
    l->grants++;
}

/* Is it time for a /proc check pass on this link (at most one per CRUX_PCIE_CHECK_NS, a
 * checked_ns in the future counts as due)? Marks it done. */
static int checks_due(struct crux_pcie_link *l, int64_t now)
{
    int64_t c = l->checked_ns;
    if (c <= now && now - c < CRUX_PCIE_CHECK_NS)
        return 0;
    l->checked_ns = now;
    return 1;
}

/* The level a lease is measured against: a level out of range (written by someone else)
 * counts as the lowest. */
static unsigned holder_level(const struct crux_pcie_link *l)
{
    return l->holder_level < CRUX_PCIE_LEVELS ? l->holder_level : 0;
}

/* Does the lease let a waiter at `level` (< 0: none) end the current hold? */
static int lease_over(const struct crux_pcie_link *l, int level, int64_t lease_ns, int64_t now)
{
    return level >= 0 && lease_ns > 0 && (unsigned)level >= holder_level(l) &&
           (l->held_since_ns > now || now - l->held_since_ns >= lease_ns);
}

/* Nanoseconds until the lease lets a waiter at `level` end the current hold; -1: never. */
static int64_t lease_left(const struct crux_pcie_link *l, int level, int64_t lease_ns,
                          int64_t now)
{
    if (l->holder_pid == 0 || l->holder_pid == self_pid() || lease_ns <= 0 ||
        (unsigned)level < holder_level(l))
        return -1;
    if (l->held_since_ns == 0)
        return lease_ns; /* not stamped yet: check_holder does at the next look */
    if (l->held_since_ns > now)
        return 0;
    int64_t left = l->held_since_ns + lease_ns - now;
    return left > 0 ? left : 0;
}

/* Best queued waiter: highest level, then lowest seq. NO_SLOT when the queue is empty. */
static int best_slot(const struct crux_pcie_link *l)
{
    int best = NO_SLOT;
    unsigned seen = 0;
    for (int i = 0; i < CRUX_PCIE_QUEUE && seen < l->nwaiters; i++) {
        const struct crux_pcie_waiter *w = &l->queue[i];
        if (w->pid == 0)
            continue;
        seen++;
        if (best == NO_SLOT || w->level > l->queue[best].level ||
            (w->level == l->queue[best].level && w->seq < l->queue[best].seq))
            best = i;
    }
    return best;
}

static void drop_slot(struct crux_pcie_link *l, int i)
{
    l->queue[i].pid = 0;
    if (l->nwaiters > 0)
        l->nwaiters--;
}

static int64_t slot_polled(const struct crux_pcie_link *l, int i)
{
    return atomic_load_explicit((const _Atomic int64_t *)&l->queue[i].polled_ns,
                                memory_order_relaxed);
}

/* A queued slot: stale (not refreshed, abandoned), or its pid checked (full: /proc too). Our
 * own process's slots are never checked but for staleness. */
static enum verdict check_slot(const struct crux_pcie_link *l, int i, int64_t now, int procs,
                               int full)
{
    int64_t t = slot_polled(l, i);
    if (t <= 0 || t > now || now - t >= CRUX_PCIE_STALE_NS)
        return V_STALE;
    if (!procs || l->queue[i].pid == self_pid())
        return V_OK;
    return check_pid(l->queue[i].pid, l->queue[i].start, full);
}

/* End the current hold if its holder is dead, stopped or another process (procs: the /proc
 * checks are due), or its lease is over for a waiter at `level` (< 0: never by lease). */
static unsigned check_holder(struct crux_pcie_link *l, int level, int64_t lease_ns, int64_t now,
                             int procs)
{
    int32_t h = l->holder_pid;
    if (h == 0 || h == self_pid())
        return 0;
    if (l->held_since_ns == 0)
        l->held_since_ns = now; /* the lease runs from the first time someone finds it held */
    enum verdict v = procs ? check_pid(h, l->holder_start, 1) : V_OK;
    if (v == V_OK && lease_over(l, level, lease_ns, now))
        v = V_EXPIRED;
    if (v == V_OK)
        return 0;
    count_verdict(l, v);
    set_holder(l, 0);
    l->holder_level = 0;
    return 1;
}

/* Purge what may not hold or block the link: the holder (check_holder), then (all) every
 * stale or dead queued slot, recounting the queue, and the best waiter while it is not ours
 * and is stale, dead, stopped or foreign. Returns how many were purged; wakes the waiters
 * when the link became free. */
static unsigned purge(struct crux_pcie_link *l, int level, int64_t lease_ns, int64_t now,
                      int all, int procs)
{
    unsigned purged = check_holder(l, level, lease_ns, now, procs);
    if (all) {
        unsigned n = 0;
        for (int i = 0; i < CRUX_PCIE_QUEUE; i++) {
            if (l->queue[i].pid == 0)
                continue;
            enum verdict v = check_slot(l, i, now, procs, 0);
            if (v == V_OK) {
                n++;
            } else {
                l->queue[i].pid = 0;
                count_verdict(l, v);
                purged++;
            }
        }
        l->nwaiters = n;
    }
    int b;
    while ((b = best_slot(l)) != NO_SLOT && l->queue[b].pid != self_pid()) {
        enum verdict v = check_slot(l, b, now, procs, 1);
        if (v == V_OK)
            break;
        drop_slot(l, b);
        count_verdict(l, v);
        purged++;
    }
    if (purged && l->holder_pid == 0)
        wake_all(l);
    return purged;
}

/* After EOWNERDEAD: the dead owner may have stopped anywhere inside a critical section. Every
 * single write leaves a consistent-enough state once the queue is recounted: a queue slot is
 * occupied iff its pid (written last) is set. */
static void repair(struct crux_pcie_link *l)
{
    if (l->holder_level >= CRUX_PCIE_LEVELS)
        l->holder_level = 0;
    l->repairs++;
    purge(l, -1, 0, now_ns(), 1, 1); /* recounts the queue */
    wake_all(l);
}

/* Take the link mutex within CRUX_PCIE_LOCK_NS: -EBUSY when someone keeps it longer (stopped
 * inside it, or hostile). */
static int link_lock(struct crux_pcie_link *l)
{
    int rc = pthread_mutex_trylock(&l->mutex);
    if (rc == EBUSY) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += CRUX_PCIE_LOCK_NS;
        while (ts.tv_nsec >= 1000000000L) {
            ts.tv_nsec -= 1000000000L;
            ts.tv_sec++;
        }
        rc = pthread_mutex_clocklock(&l->mutex, CLOCK_MONOTONIC, &ts);
        if (rc == ETIMEDOUT)
            return -EBUSY;
    }
    if (rc == 0)
        return 0;
    if (rc == EOWNERDEAD) {
        if (pthread_mutex_consistent(&l->mutex) != 0) {
            pthread_mutex_unlock(&l->mutex);
            return -ENOTRECOVERABLE;
        }
        repair(l);
        return 0;
    }
    return -rc;
}

static void link_unlock(struct crux_pcie_link *l, int wake)
{
    pthread_mutex_unlock(&l->mutex);
    if (wake)
        futex_wake_all(l);
}

/* Clear holder_pid from `pid` to 0 without the mutex (which someone keeps): a release or revoke
 * that could not have it. Waiters then miss at most one wake-up (their poll finds the link
 * free). 1 cleared, 0 it was not `pid`'s. */
static int clear_holder_unlocked(struct crux_pcie_link *l, int32_t pid)
{
    int32_t want = pid;
    if (pid == 0 || !atomic_compare_exchange_strong((_Atomic int32_t *)&l->holder_pid, &want, 0))
        return 0;
    wake_all(l);
    futex_wake_all(l);
    return 1;
}

static struct crux_pcie_link *get_link(crux_pcie_t *p, unsigned link)
{
    if (p == NULL || link >= p->nlinks)
        return NULL;
    return &p->links[link];
}

/* ---- file ---------------------------------------------------------------------------- */

int crux_pcie_create(const char *path, unsigned links)
{
    if (path == NULL || links == 0 || links > CRUX_PCIE_MAX_LINKS)
        return -EINVAL;
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0660);
    if (fd < 0)
        return -errno;
    size_t size = file_size(links);
    int rc = 0;
    void *base = MAP_FAILED;
    if (fchmod(fd, 0660) != 0 || ftruncate(fd, (off_t)size) != 0) {
        rc = -errno;
        goto out;
    }
    base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = -errno;
        goto out;
    }
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    struct crux_pcie_link *ls = (struct crux_pcie_link *)((char *)base + CRUX_PCIE_HEADER_SIZE);
    for (unsigned i = 0; i < links && rc == 0; i++) {
        memset(&ls[i], 0, sizeof ls[i]);
        rc = -pthread_mutex_init(&ls[i].mutex, &ma);
        ls[i].next_seq = 1;
    }
    pthread_mutexattr_destroy(&ma);
    if (rc != 0)
        goto out;
    struct crux_pcie_header *h = base;
    memset(h, 0, sizeof *h);
    h->version = CRUX_PCIE_VERSION;
    h->header_size = CRUX_PCIE_HEADER_SIZE;
    h->link_size = (uint32_t)sizeof(struct crux_pcie_link);
    h->links = links;
    h->levels = CRUX_PCIE_LEVELS;
    h->queue_len = CRUX_PCIE_QUEUE;
    h->creator_pid = (uint32_t)getpid();
    atomic_thread_fence(memory_order_release);
    h->magic = CRUX_PCIE_MAGIC; /* last: a half-written file never validates */
    if (msync(base, size, MS_SYNC) != 0 || rename(tmp, path) != 0)
        rc = -errno;
out:
    if (base != MAP_FAILED)
        munmap(base, size);
    close(fd);
    if (rc != 0)
        unlink(tmp);
    return rc;
}

crux_pcie_t *crux_pcie_open(const char *path)
{
    if (path == NULL) {
        errno = EINVAL;
        return NULL;
    }
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    struct crux_pcie_header h;
    int err = EINVAL;
    if (fstat(fd, &st) != 0) {
        err = errno;
        goto fail;
    }
    if (!S_ISREG(st.st_mode) || st.st_size < CRUX_PCIE_HEADER_SIZE)
        goto fail;
    if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h)
        goto fail;
    if (h.magic != CRUX_PCIE_MAGIC || h.version != CRUX_PCIE_VERSION ||
        h.header_size != CRUX_PCIE_HEADER_SIZE || h.link_size != sizeof(struct crux_pcie_link) ||
        h.levels != CRUX_PCIE_LEVELS || h.queue_len != CRUX_PCIE_QUEUE || h.links == 0 ||
        h.links > CRUX_PCIE_MAX_LINKS || (uint64_t)st.st_size != file_size(h.links))
        goto fail;
    crux_pcie_t *p = calloc(1, sizeof *p);
    if (p == NULL) {
        err = ENOMEM;
        goto fail;
    }
    p->size = file_size(h.links);
    p->base = mmap(NULL, p->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p->base == MAP_FAILED) {
        err = errno;
        free(p);
        goto fail;
    }
    close(fd);
    p->links = (struct crux_pcie_link *)((char *)p->base + CRUX_PCIE_HEADER_SIZE);
    p->nlinks = h.links;
    p->lease_ns = CRUX_PCIE_LEASE_NS;
    const char *lease = getenv("CRUX_PCIE_LEASE_MS");
    if (lease != NULL && *lease != '\0') {
        char *end;
        unsigned long long ms = strtoull(lease, &end, 10);
        if (*end == '\0' && ms <= 3600000ull)
            p->lease_ns = (int64_t)ms * 1000000LL;
    }
    self_start(); /* read /proc/self/stat now rather than on the first grant */
    return p;
fail:
    close(fd);
    errno = err;
    return NULL;
}

void crux_pcie_close(crux_pcie_t *p)
{
    if (p == NULL)
        return;
    munmap(p->base, p->size);
    free(p);
}

unsigned crux_pcie_links(const crux_pcie_t *p)
{
    return p == NULL ? 0 : p->nlinks;
}

/* ---- acquire / release --------------------------------------------------------------- */

/* Our queue slot at `slot` for (me, seq): put it back where a purge took it (a waiter that
 * looked dead, stopped or stale to someone else, or a slot abandoned and reused). -ENOSPC when
 * the queue filled meanwhile. */
static int requeue(struct crux_pcie_link *l, int *slot, int32_t me, unsigned level, uint64_t seq,
                   int64_t now)
{
    if (l->queue[*slot].pid == me && l->queue[*slot].seq == seq)
        return 0;
    int i = 0;
    while (i < CRUX_PCIE_QUEUE && l->queue[i].pid != 0)
        i++;
    if (i == CRUX_PCIE_QUEUE)
        return -ENOSPC;
    l->queue[i].level = level;
    l->queue[i].seq = seq;
    l->queue[i].start = self_start();
    l->queue[i].polled_ns = now;
    l->queue[i].pid = me; /* last: see repair() */
    l->nwaiters++;
    *slot = i;
    return 0;
}

static void futex_wait(struct crux_pcie_link *l, uint32_t seen, int64_t wait, int *polled)
{
    struct timespec ts = {.tv_sec = wait / 1000000000LL, .tv_nsec = wait % 1000000000LL};
    long r = syscall(SYS_futex, &l->wake, FUTEX_WAIT, seen, &ts, NULL, 0);
    if (r == -1 && errno == ETIMEDOUT)
        *polled = 1;
}

int crux_pcie_acquire_timed(crux_pcie_t *p, unsigned link, unsigned level, int64_t timeout_ns)
{
    struct crux_pcie_link *l = get_link(p, link);
    if (l == NULL || level >= CRUX_PCIE_LEVELS)
        return -EINVAL;
    int32_t me = self_pid();
    int rc = link_lock(l);
    if (rc != 0)
        return rc; /* -EBUSY: nothing queued, nothing changed */
    if (l->holder_pid == 0 && l->nwaiters == 0) { /* fast path */
        grant(l, me, level, 0);
        link_unlock(l, 0);
        return 0;
    }
    /* Contended: end a hold that may not go on (dead, stopped, foreign, past its lease for us)
     * before queueing behind it. */
    int64_t now = now_ns();
    int pend_wake = 0; /* we purged someone and freed the link: wake the others too */
    int checked = checks_due(l, now); /* has this call checked the holder's pid yet? */
    if (purge(l, (int)level, p->lease_ns, now, l->nwaiters >= CRUX_PCIE_QUEUE, checked) &&
        l->holder_pid == 0)
        pend_wake = 1;
    if (l->holder_pid == 0 && l->nwaiters == 0) {
        grant(l, me, level, now);
        l->contended++;
        link_unlock(l, 0);
        return 0;
    }
    int slot = 0;
    uint64_t seq = l->next_seq++;
    if (requeue(l, &slot, me, level, seq, now) != 0) {
        link_unlock(l, pend_wake);
        return -ENOSPC;
    }
    int64_t deadline = timeout_ns < 0 ? INT64_MAX : now + timeout_ns;
    int timed_out = 0;
    for (;;) {
        /* Our slot may have been purged (stale after a long descheduling, or looked dead to a
         * corrupt check): put it back with our seq, so we keep our place. */
        if (requeue(l, &slot, me, level, seq, now) != 0) {
            link_unlock(l, pend_wake);
            return -ENOSPC;
        }
        atomic_store_explicit((_Atomic int64_t *)&l->queue[slot].polled_ns, now,
                              memory_order_relaxed);
        if (l->holder_pid == 0) {
            int b = best_slot(l);
            if (b != slot && b != NO_SLOT && purge(l, (int)level, p->lease_ns, now, 0, 1)) {
                b = best_slot(l);
                pend_wake = 1;
            }
            if (b == slot) {
                drop_slot(l, slot);
                grant(l, me, level, now);
                l->contended++;
                link_unlock(l, 0); /* the others will find the link held anyway */
                return 0;
            }
        }
        if (timed_out) {
            drop_slot(l, slot);
            int wake = l->holder_pid == 0 && l->nwaiters > 0;
            if (wake)
                wake_all(l); /* we may have been the best waiter: let the next one look */
            link_unlock(l, wake || pend_wake);
            return -ETIMEDOUT;
        }
        uint32_t seen = atomic_load_explicit((_Atomic uint32_t *)&l->wake, memory_order_acquire);
        int64_t wait = CRUX_PCIE_POLL_NS;
        int64_t lease = lease_left(l, (int)level, p->lease_ns, now);
        if (lease >= 0 && lease < wait)
            wait = lease; /* wake when the lease lets us end the hold */
        if (!checked && l->holder_pid != 0 && l->holder_pid != me && l->checked_ns <= now) {
            /* another waiter checked the holder less than CRUX_PCIE_CHECK_NS ago: look at it
             * ourselves as soon as that is due, not a whole poll later */
            int64_t due = l->checked_ns + CRUX_PCIE_CHECK_NS - now;
            if (due < wait)
                wait = due > 0 ? due : 0;
        }
        link_unlock(l, pend_wake);
        pend_wake = 0;
        int64_t left = deadline - now_ns();
        if (left < wait)
            wait = left;
        int polled = wait <= 0;
        if (wait > 0)
            futex_wait(l, seen, wait, &polled);
        now = now_ns();
        if (deadline != INT64_MAX && now >= deadline)
            timed_out = 1;
        while ((rc = link_lock(l)) == -EBUSY) {
            /* Someone keeps the link mutex. Go on waiting (our slot is not refreshed meanwhile
             * and may be dropped as stale: requeue puts it back) until our deadline; then
             * leave the slot abandoned for the next purge and fail open. */
            now = now_ns();
            if (now >= deadline) {
                if (l->queue[slot].pid == me && l->queue[slot].seq == seq)
                    atomic_store_explicit((_Atomic int64_t *)&l->queue[slot].polled_ns, 0,
                                          memory_order_relaxed);
                return -EBUSY;
            }
            seen = atomic_load_explicit((_Atomic uint32_t *)&l->wake, memory_order_acquire);
            left = deadline - now;
            futex_wait(l, seen, left < CRUX_PCIE_POLL_NS ? left : CRUX_PCIE_POLL_NS, &polled);
        }
        if (rc != 0)
            return rc; /* ENOTRECOVERABLE: the link is unusable for everyone, fail open */
        now = now_ns();
        int procs = checks_due(l, now);
        checked |= procs;
        if (purge(l, (int)level, p->lease_ns, now, polled, procs) && l->holder_pid == 0)
            pend_wake = 1;
    }
}

int crux_pcie_acquire(crux_pcie_t *p, unsigned link, unsigned level)
{
    return crux_pcie_acquire_timed(p, link, level, -1);
}

int crux_pcie_release(crux_pcie_t *p, unsigned link)
{
    struct crux_pcie_link *l = get_link(p, link);
    if (l == NULL)
        return -EINVAL;
    int32_t me = self_pid();
    int rc = link_lock(l);
    if (rc == -EBUSY)
        return clear_holder_unlocked(l, me) ? 0 : -EPERM;
    if (rc != 0)
        return rc;
    if (l->holder_pid != me) {
        link_unlock(l, 0);
        return -EPERM;
    }
    set_holder(l, 0);
    l->holder_level = 0;
    int wake = l->nwaiters > 0;
    if (wake)
        wake_all(l);
    link_unlock(l, wake);
    return 0;
}

int crux_pcie_revoke(crux_pcie_t *p, unsigned link, int32_t pid)
{
    struct crux_pcie_link *l = get_link(p, link);
    if (l == NULL || pid < 0)
        return -EINVAL;
    int rc = link_lock(l);
    if (rc == -EBUSY) {
        int32_t h = atomic_load_explicit((_Atomic int32_t *)&l->holder_pid,
                                         memory_order_relaxed);
        if (h == 0 || (pid != 0 && h != pid) || !clear_holder_unlocked(l, h))
            return 0;
        atomic_fetch_add_explicit((_Atomic uint64_t *)&l->revoked, 1, memory_order_relaxed);
        return 1;
    }
    if (rc != 0)
        return rc;
    int32_t h = l->holder_pid;
    if (h == 0 || (pid != 0 && h != pid)) {
        link_unlock(l, 0);
        return 0;
    }
    set_holder(l, 0);
    l->holder_level = 0;
    l->revoked++;
    wake_all(l);
    link_unlock(l, 1);
    return 1;
}

int crux_pcie_stats(crux_pcie_t *p, unsigned link, struct crux_pcie_stats *out)
{
    struct crux_pcie_link *l = get_link(p, link);
    if (l == NULL || out == NULL)
        return -EINVAL;
    int rc = link_lock(l);
    if (rc != 0)
        return rc;
    int64_t now = now_ns();
    int wake = purge(l, -1, 0, now, 1, 1) > 0 && l->holder_pid == 0 && l->nwaiters > 0;
    memset(out, 0, sizeof *out);
    out->holder_pid = l->holder_pid;
    out->holder_level = l->holder_level;
    for (int i = 0; i < CRUX_PCIE_QUEUE; i++)
        if (l->queue[i].pid != 0 && l->queue[i].level < CRUX_PCIE_LEVELS)
            out->waiters[l->queue[i].level]++;
    out->grants = l->grants;
    out->contended = l->contended;
    out->recovered = l->recovered;
    out->repairs = l->repairs;
    out->expired = l->expired;
    out->stopped = l->stopped;
    out->foreign = l->foreign;
    out->stale = l->stale;
    out->revoked = l->revoked;
    int64_t since = l->held_since_ns;
    out->held_ns = l->holder_pid != 0 && since > 0 && since <= now ? now - since : 0;
    link_unlock(l, wake);
    return 0;
}

int crux_pcie_peek(const crux_pcie_t *p, unsigned link, int *holder)
{
    if (holder != NULL)
        *holder = 0;
    if (p == NULL || link >= p->nlinks)
        return -1;
    const struct crux_pcie_link *l = &p->links[link];
    if (holder != NULL) {
        int32_t pid = atomic_load_explicit((const _Atomic int32_t *)&l->holder_pid,
                                           memory_order_relaxed);
        *holder = pid == 0 ? 0 : pid == self_pid() ? 1 : 2;
    }
    /* one shared load when nobody waits: the uncontended holder's every post comes here */
    if (atomic_load_explicit((const _Atomic uint32_t *)&l->nwaiters, memory_order_relaxed) == 0)
        return -1;
    int top = -1;
    for (int i = 0; i < CRUX_PCIE_QUEUE; i++) {
        const struct crux_pcie_waiter *w = &l->queue[i];
        if (atomic_load_explicit((const _Atomic int32_t *)&w->pid, memory_order_relaxed) == 0)
            continue;
        int lv = (int)atomic_load_explicit((const _Atomic uint32_t *)&w->level,
                                           memory_order_relaxed);
        if (lv > top && lv < CRUX_PCIE_LEVELS)
            top = lv;
    }
    return top;
}

int crux_pcie__test_lock_internal(crux_pcie_t *p, unsigned link)
{
    struct crux_pcie_link *l = get_link(p, link);
    if (l == NULL)
        return -EINVAL;
    return link_lock(l);
}
