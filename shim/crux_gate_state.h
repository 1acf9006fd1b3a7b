/*
 * crux_gate_state.h - private to the gate (crux_gate.c: the data path and hooks,
 * crux_gate_setup.c: configuration, evaluation, stats): the process's gate state and its
 * lock-free lookups. Not part of any file format; see crux_gate.h for the policy.
 *
 * State, all in this process:
 *   - contexts: the device contexts seen, with the provider's original post_send/poll_cq and
 *     the link they are gated on (NULL: not gated). Slots are never moved, so the trampolines
 *     scan them without a lock. A context's trampolines go in once (when it is gated, or at
 *     once when counting is on) and stay;
 *   - links: per semaphore link, `held` (this process holds it) and `busy` (QPs with signaled
 *     WRs outstanding), plus a mutex that only the idle<->busy transitions and yields take;
 *   - QPs: an open-addressing table keyed by (context slot, QPN), because a completion names
 *     its QP only by number. Each keeps the link it was created under (NULL: counted only), so
 *     a context gated later does not gate QPs whose outstanding WRs the link never counted.
 *     Inserts and deletes run under the setup lock; lookups are lock-free (the key is
 *     published last, with release).
 */
#ifndef CRUX_GATE_STATE_H
#define CRUX_GATE_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "crux_gate.h"
#include "crux_pcie.h"

#define MAX_CTX 64
#define MAX_LINKS 32
#define QP_BITS 14
#define QP_SLOTS (1u << QP_BITS)
#define QP_MASK (QP_SLOTS - 1)
#define KEY_EMPTY 0ull
#define KEY_DELETED (~0ull)
#define RETRY_NS 1000000000ull /* look again at an ungated context, or the level, after 1 s */

typedef int (*post_send_fn)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);
typedef int (*poll_cq_fn)(struct ibv_cq *, int, struct ibv_wc *);

struct glink {
    _Atomic int held;
    _Atomic int64_t busy;
    _Atomic uint64_t since_ns; /* when this process last took the link */
    _Atomic unsigned level;
    unsigned link;
    int broken; /* ENOTRECOVERABLE: the link is unusable, post ungated from now on */
    uint64_t busy_until_ns; /* its internal mutex was stuck: post ungated until then */
    uint64_t level_next_ns;
    pthread_mutex_t m;
};

struct gctx {
    struct ibv_context *_Atomic ctx; /* NULL: free slot */
    post_send_fn post_send;
    poll_cq_fn poll_cq;
    struct glink *_Atomic link; /* NULL: not gated */
    int swapped;                /* the trampolines are in (post_send/poll_cq are the provider's) */
    uint64_t retry_ns;
};

struct gqp {
    _Atomic uint64_t key; /* (context slot + 1) << 32 | QPN */
    _Atomic int64_t out;  /* signaled WRs posted, not yet polled */
    _Atomic int sig_all;
    struct glink *link;   /* the context's link when the QP was created; NULL: not gated */
    struct crux_qps_counters *_Atomic rec; /* its record's counters (NULL: not counted) */
    _Atomic uint64_t mark; /* busy time is counted up to here (CLOCK_MONOTONIC ns) */
};

struct crux_gate_state {
    pthread_mutex_t lock; /* setup: configuration, files, contexts, links, QP inserts/deletes */
    struct crux_gate_config cfg;
    crux_pcie_t *sem;
    uint64_t sem_retry_ns;
    int sem_reason;
    struct crux_links map;
    unsigned nlinks;
    _Atomic unsigned nctx; /* high-water mark of used context slots */
    struct glink links[MAX_LINKS];
    struct gctx ctxs[MAX_CTX];
    struct gqp qps[QP_SLOTS];
    _Atomic uint64_t contexts[CRUX_GATE_REASONS], ungated[CRUX_UNGATED_COUNT];
    _Atomic uint64_t acquires, waits, wait_ns, yields, releases, lost;
};

extern struct crux_gate_state crux_gate__g;
#define g crux_gate__g /* the process's one gate state (both .c files) */

#define RELAXED memory_order_relaxed
#define count(field, n) atomic_fetch_add_explicit(&g.field, (n), RELAXED)

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- lookups (lock-free: the trampolines' path) ----------------------------------------- */

static inline struct gctx *ctx_find(const struct ibv_context *ctx)
{
    unsigned n = atomic_load_explicit(&g.nctx, memory_order_acquire);
    for (unsigned i = 0; i < n; i++)
        if (atomic_load_explicit(&g.ctxs[i].ctx, memory_order_acquire) == ctx)
            return &g.ctxs[i];
    return NULL;
}

static inline uint64_t qp_key(const struct gctx *c, uint32_t qpn)
{
    return (uint64_t)(c - g.ctxs + 1) << 32 | qpn;
}

static inline unsigned qp_home(uint64_t key)
{
    return (unsigned)((key * 0x9E3779B97F4A7C15ull) >> (64 - QP_BITS));
}

static inline struct gqp *qp_find(uint64_t key)
{
    for (unsigned i = qp_home(key), n = 0; n < QP_SLOTS; i = (i + 1) & QP_MASK, n++) {
        uint64_t k = atomic_load_explicit(&g.qps[i].key, memory_order_acquire);
        if (k == key)
            return &g.qps[i];
        if (k == KEY_EMPTY)
            break;
    }
    return NULL;
}

/* crux_gate_setup.c: is device `dev` gated, and on which link (*out)? A crux_gate_reason;
 * `err` says why not. Under g.lock. */
int crux_gate__evaluate(const char *dev, struct glink **out, char *err, size_t errlen);

#endif /* CRUX_GATE_STATE_H */
