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
};

#define NO_SLOT (-1)

static size_t file_size(unsigned links)
{
    return CRUX_PCIE_HEADER_SIZE + (size_t)links * sizeof(struct crux_pcie_link);
}

/* ---- own pid ------------------------------------------------------------------------
 * glibc no longer caches getpid() (a syscall, ~100 ns with mitigations): cache it here and
 * forget it in fork children. A raw clone() without glibc's fork would keep the parent's pid:
 * such a child must not use this library. */

static _Atomic int32_t my_pid;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void forget_pid(void)
{
    atomic_store_explicit(&my_pid, 0, memory_order_relaxed);
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

/* ---- liveness ------------------------------------------------------------------------ */

static int is_zombie(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT; /* gone between kill() and here */
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *rp = strrchr(buf, ')'); /* comm may hold spaces and parentheses */
    if (rp == NULL || rp[1] != ' ')
        return 0;
    return rp[2] == 'Z' || rp[2] == 'X';
}

static int pid_alive(int32_t pid)
{
    if (pid <= 0)
        return 0;
    if (kill((pid_t)pid, 0) == -1 && errno == ESRCH)
        return 0;
    return !is_zombie((pid_t)pid); /* EPERM: exists, someone else's */
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
    l->nwaiters--;
}

/* Purge a dead holder and (all=1) every dead waiter, or (all=0) only the best waiter.
 * Returns how many were purged; wakes the waiters when the link became free. */
static unsigned purge_dead(struct crux_pcie_link *l, int all)
{
    unsigned purged = 0;
    if (l->holder_pid != 0 && !pid_alive(l->holder_pid)) {
        l->holder_pid = 0;
        l->holder_level = 0;
        purged++;
    }
    if (all) {
        for (int i = 0; i < CRUX_PCIE_QUEUE && l->nwaiters > 0; i++) {
            if (l->queue[i].pid != 0 && !pid_alive(l->queue[i].pid)) {
                drop_slot(l, i);
                purged++;
            }
        }
    } else {
        int b;
        while ((b = best_slot(l)) != NO_SLOT && !pid_alive(l->queue[b].pid)) {
            drop_slot(l, b);
            purged++;
        }
    }
    if (purged) {
        l->recovered += purged;
        if (l->holder_pid == 0)
            wake_all(l);
    }
    return purged;
}

/* After EOWNERDEAD: the dead owner may have stopped anywhere inside a critical section. Every
 * single write leaves a consistent-enough state once the queue is recounted: a queue slot is
 * occupied iff its pid (written last) is set. */
static void repair(struct crux_pcie_link *l)
{
    unsigned n = 0;
    for (int i = 0; i < CRUX_PCIE_QUEUE; i++)
        if (l->queue[i].pid != 0)
            n++;
    l->nwaiters = n;
    if (l->holder_level >= CRUX_PCIE_LEVELS)
        l->holder_level = 0;
    l->repairs++;
    purge_dead(l, 1);
    wake_all(l);
}

static int link_lock(struct crux_pcie_link *l)
{
    int rc = pthread_mutex_lock(&l->mutex);
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

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int crux_pcie_acquire_timed(crux_pcie_t *p, unsigned link, unsigned level, int64_t timeout_ns)
{
    struct crux_pcie_link *l = get_link(p, link);
    if (l == NULL || level >= CRUX_PCIE_LEVELS)
        return -EINVAL;
    int32_t me = self_pid();
    int rc = link_lock(l);
    if (rc != 0)
        return rc;
    if (l->holder_pid == 0 && l->nwaiters == 0) { /* fast path */
        l->holder_pid = me;
        l->holder_level = level;
        l->grants++;
        link_unlock(l, 0);
        return 0;
    }
    if (l->nwaiters >= CRUX_PCIE_QUEUE)
        purge_dead(l, 1);
    int slot = NO_SLOT;
    for (int i = 0; i < CRUX_PCIE_QUEUE; i++) {
        if (l->queue[i].pid == 0) {
            slot = i;
            break;
        }
    }
    if (slot == NO_SLOT) {
        link_unlock(l, 0);
        return -ENOSPC;
    }
    uint64_t seq = l->next_seq++;
    l->queue[slot].level = level;
    l->queue[slot].seq = seq;
    l->queue[slot].pid = me; /* last: see repair() */
    l->nwaiters++;
    int64_t deadline = timeout_ns < 0 ? INT64_MAX : now_ns() + timeout_ns;
    int timed_out = 0;
    int pend_wake = 0; /* we purged someone and freed the link: wake the others too */
    for (;;) {
        /* Our slot may have been purged by a repair if our pid looked dead (it cannot, we are
         * running) - still, re-find it by seq to stay safe against a corrupt queue. */
        if (l->queue[slot].pid != me || l->queue[slot].seq != seq) {
            if (l->nwaiters >= CRUX_PCIE_QUEUE) {
                link_unlock(l, 0);
                return -ENOSPC;
            }
            for (slot = 0; slot < CRUX_PCIE_QUEUE && l->queue[slot].pid != 0; slot++)
                ;
            if (slot == CRUX_PCIE_QUEUE) { /* count and slots disagree: recount, give up */
                repair(l);
                link_unlock(l, 1);
                return -ENOSPC;
            }
            l->queue[slot].level = level;
            l->queue[slot].seq = seq;
            l->queue[slot].pid = me;
            l->nwaiters++;
        }
        if (l->holder_pid == 0) {
            int b = best_slot(l);
            if (b != slot && b != NO_SLOT && purge_dead(l, 0)) {
                b = best_slot(l);
                pend_wake = 1;
            }
            if (b == slot) {
                drop_slot(l, slot);
                l->holder_pid = me;
                l->holder_level = level;
                l->grants++;
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
            link_unlock(l, wake);
            return -ETIMEDOUT;
        }
        uint32_t seen = atomic_load_explicit((_Atomic uint32_t *)&l->wake, memory_order_acquire);
        link_unlock(l, pend_wake);
        pend_wake = 0;
        int64_t left = deadline - now_ns();
        int64_t wait = left < CRUX_PCIE_POLL_NS ? left : CRUX_PCIE_POLL_NS;
        int polled = 0;
        if (wait > 0) {
            struct timespec ts = {.tv_sec = wait / 1000000000LL, .tv_nsec = wait % 1000000000LL};
            long r = syscall(SYS_futex, &l->wake, FUTEX_WAIT, seen, &ts, NULL, 0);
            polled = r == -1 && errno == ETIMEDOUT;
        }
        if (deadline != INT64_MAX && now_ns() >= deadline)
            timed_out = 1;
        rc = link_lock(l);
        if (rc != 0)
            return rc; /* ENOTRECOVERABLE: the link is unusable for everyone, fail open */
        if (polled && purge_dead(l, 1) && l->holder_pid == 0)
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
    int rc = link_lock(l);
    if (rc != 0)
        return rc;
    if (l->holder_pid != self_pid()) {
        link_unlock(l, 0);
        return -EPERM;
    }
    l->holder_pid = 0;
    l->holder_level = 0;
    int wake = l->nwaiters > 0;
    if (wake)
        wake_all(l);
    link_unlock(l, wake);
    return 0;
}

int crux_pcie_stats(crux_pcie_t *p, unsigned link, struct crux_pcie_stats *out)
{
    struct crux_pcie_link *l = get_link(p, link);
    if (l == NULL || out == NULL)
        return -EINVAL;
    int rc = link_lock(l);
    if (rc != 0)
        return rc;
    int wake = purge_dead(l, 1) > 0 && l->holder_pid == 0 && l->nwaiters > 0;
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
