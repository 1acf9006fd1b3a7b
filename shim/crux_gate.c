/*
 * crux_gate.c - the gate's data path: hold the job's PCIe link semaphore while its RDMA
 * traffic crosses the link (policy and fail-open rules: crux_gate.h; state:
 * crux_gate_state.h), the ops trampolines, and the wrapper's QP/context hooks. The
 * trampolines also count each QP's traffic into its record (crux_gate.h, "Counting").
 *
 * The hold protocol is a Dekker pair: a post makes `busy` positive, then reads `held`; a
 * release clears `held`, then reads `busy` and keeps the link if a post came in between. One of
 * the two always sees the other (sequentially consistent atomics), so no post slips through
 * ungated while the link is being given back.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "crux_gate_state.h"

/* ---- the hold protocol ------------------------------------------------------------------ */

/* Take the link for this process (l->m held, l->held clear). A failure leaves the post to go
 * ahead ungated, counted. */
static void link_take(struct glink *l)
{
    uint64_t t0 = now_ns();
    if (l->broken || t0 < l->busy_until_ns) {
        count(ungated[CRUX_UNGATED_ERROR], 1);
        return;
    }
    if (t0 >= l->level_next_ns && g.cfg.job_level != NULL) { /* the plan may have moved us */
        int lv = g.cfg.job_level();
        if (lv >= 0)
            atomic_store_explicit(&l->level, crux_gate_level(lv), RELAXED);
        l->level_next_ns = t0 + RETRY_NS;
    }
    int holder;
    int top = crux_pcie_peek(g.sem, l->link, &holder);
    if (holder == 1) { /* not re-entrant: acquiring would wait for ourselves */
        count(ungated[CRUX_UNGATED_SELF], 1);
        return;
    }
    unsigned level = atomic_load_explicit(&l->level, RELAXED);
    int rc = crux_pcie_acquire_timed(g.sem, l->link, level, g.cfg.max_wait_ns);
    uint64_t t1 = now_ns();
    if (rc == 0) {
        atomic_store_explicit(&l->since_ns, t1, RELAXED);
        atomic_store(&l->held, 1);
        count(acquires, 1);
        if (holder != 0 || top >= 0) {
            count(waits, 1);
            count(wait_ns, t1 - t0);
        }
        return;
    }
    count(ungated[rc == -ETIMEDOUT ? CRUX_UNGATED_TIMEOUT : CRUX_UNGATED_ERROR], 1);
    if (rc == -ENOTRECOVERABLE || rc == -EINVAL)
        l->broken = 1;
    else if (rc == -EBUSY) /* someone keeps the link's internal mutex: do not pay 2 ms a post */
        l->busy_until_ns = t1 + CRUX_GATE_BUSY_BACKOFF_NS;
}

#define YIELD 1 /* a better waiter is queued */
#define LOST 2  /* the link is no longer ours: taken by the lease or revoked by the agent */

/* Should a holder give the link up now? Called on every signaled post: two loads from one
 * cache line of the shared file (holder pid, waiter count) when nobody is queued. */
static inline int must_yield(struct glink *l)
{
    int holder;
    int top = crux_pcie_peek(g.sem, l->link, &holder);
    if (__builtin_expect(holder != 1, 0))
        return LOST;
    int level = (int)atomic_load_explicit(&l->level, RELAXED);
    if (__builtin_expect(top < level, 1))
        return 0;
    return top > level ||
           now_ns() - atomic_load_explicit(&l->since_ns, RELAXED) >= g.cfg.quantum_ns
               ? YIELD : 0;
}

static void link_slow(struct glink *l)
{
    pthread_mutex_lock(&l->m);
    int why;
    if (!atomic_load(&l->held)) {
        link_take(l);
    } else if ((why = must_yield(l)) != 0) { /* release, then queue behind the better waiter */
        atomic_store(&l->held, 0);
        if (why == LOST) {
            count(lost, 1); /* nothing to release: it is someone else's, or free */
        } else {
            crux_pcie_release(g.sem, l->link);
            count(yields, 1);
        }
        link_take(l);
    }
    pthread_mutex_unlock(&l->m);
}

/* The last busy QP went idle: give the link back unless a post came in meanwhile. */
static void link_idle(struct glink *l)
{
    pthread_mutex_lock(&l->m);
    if (atomic_load(&l->held)) {
        /* Clear held, then look at busy: qp_posted does the mirror image without the lock
         * (busy up, then held read), so with both orders sequentially consistent either we see
         * its post and keep the link, or it sees held == 0 and takes the slow path. */
        atomic_store(&l->held, 0);
        if (atomic_load(&l->busy) > 0) {
            atomic_store(&l->held, 1);
        } else {
            crux_pcie_release(g.sem, l->link);
            count(releases, 1);
        }
    }
    pthread_mutex_unlock(&l->m);
}

/* ---- counting (crux_qps.h: struct crux_qps_counters) ------------------------------------ */

static inline void add(uint64_t *field, uint64_t n)
{
    atomic_fetch_add_explicit((_Atomic uint64_t *)field, n, RELAXED);
}

/* Busy time of q up to `now`: what passed since the last mark. Called at every completion;
 * another thread's completion or post may move the mark meanwhile, and the exchange gives each
 * nanosecond to one caller only. */
static inline void busy_until(struct gqp *q, uint64_t now)
{
    uint64_t prev = atomic_exchange_explicit(&q->mark, now, RELAXED);
    struct crux_qps_counters *k = atomic_load_explicit(&q->rec, memory_order_acquire);
    if (k != NULL && now > prev)
        add(&k->busy_ns, now - prev);
}

/* Does this opcode carry the sg_list's bytes out of this NIC? A READ's bytes come in (they
 * are the peer's traffic); an atomic's 8 bytes and the memory-window verbs carry no data. */
static inline int egress(enum ibv_wr_opcode op)
{
    return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE ||
           op == IBV_WR_RDMA_WRITE_WITH_IMM || op == IBV_WR_SEND_WITH_INV || op == IBV_WR_TSO;
}

/* The WRs from `wr` up to `stop` (exclusive), which the provider accepted: it has checked
 * their num_sge against the QP, so reading their sg_lists cannot run past them. */
static inline void count_posted(struct gqp *q, const struct ibv_send_wr *wr,
                                const struct ibv_send_wr *stop)
{
    struct crux_qps_counters *k = atomic_load_explicit(&q->rec, memory_order_acquire);
    if (k == NULL)
        return;
    uint64_t bytes = 0, wrs = 0;
    for (; wr != NULL && wr != stop; wr = wr->next, wrs++)
        if (egress(wr->opcode))
            for (int i = 0; i < wr->num_sge; i++)
                bytes += wr->sg_list[i].length;
    if (wrs > 0)
        add(&k->wrs_posted, wrs);
    if (bytes > 0)
        add(&k->bytes_posted, bytes);
}

/* ---- outstanding work ------------------------------------------------------------------- */

/* n signaled WRs posted on q (its link l, NULL when it is not gated). */
static inline void qp_posted(struct glink *l, struct gqp *q, int64_t n)
{
    if (atomic_fetch_add(&q->out, n) == 0) {
        /* idle -> busy: busy time starts now (before the provider sees the WRs, so before any
         * of their completions) */
        atomic_store_explicit(&q->mark, now_ns(), RELAXED);
        if (l == NULL)
            return;
        atomic_fetch_add(&l->busy, 1);
    } else if (l == NULL) {
        return;
    }
    if (__builtin_expect(atomic_load(&l->held) && !must_yield(l), 1))
        return;
    link_slow(l);
}

/* n of q's signaled WRs done (or, for an error, maybe) at `now`: clamp at zero, count the busy
 * time, idle the link. */
static void qp_done(struct glink *l, struct gqp *q, int64_t n, uint64_t now)
{
    int64_t v = atomic_load_explicit(&q->out, RELAXED), left;
    do {
        if (v <= 0)
            return;
        left = v > n ? v - n : 0;
    } while (!atomic_compare_exchange_weak(&q->out, &v, left));
    busy_until(q, now);
    if (left == 0 && l != NULL && atomic_fetch_sub(&l->busy, 1) <= 1)
        link_idle(l);
}

static inline int64_t signaled(const struct ibv_send_wr *wr, int all)
{
    int64_t n = 0;
    for (; wr != NULL; wr = wr->next)
        n += all || (wr->send_flags & IBV_SEND_SIGNALED);
    return n;
}

/* ---- trampolines ------------------------------------------------------------------------ */

static int gate_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    struct gctx *c = ctx_find(qp->context);
    if (c == NULL) /* cannot happen: ops are swapped only after the slot is published */
        return EINVAL;
    struct gqp *q = qp_find(qp_key(c, qp->qp_num));
    if (q == NULL) {
        if (atomic_load_explicit(&c->link, RELAXED) != NULL && signaled(wr, 0) > 0)
            count(ungated[CRUX_UNGATED_UNTRACKED], 1);
        return c->post_send(qp, wr, bad);
    }
    int all = atomic_load_explicit(&q->sig_all, RELAXED);
    int64_t n = signaled(wr, all);
    if (n > 0) {
        if (q->link == NULL && atomic_load_explicit(&c->link, RELAXED) != NULL)
            count(ungated[CRUX_UNGATED_UNTRACKED], 1); /* created before its context was gated */
        qp_posted(q->link, q, n);
    }
    int rc = c->post_send(qp, wr, bad);
    struct ibv_send_wr *stop = rc == 0 ? NULL : bad != NULL && *bad != NULL ? *bad : wr;
    count_posted(q, wr, stop);
    if (rc != 0 && n > 0) /* WRs from *bad on were not posted: they will never complete */
        qp_done(q->link, q, bad != NULL && *bad != NULL ? signaled(*bad, all) : n, now_ns());
    return rc;
}

static int gate_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc)
{
    struct gctx *c = ctx_find(cq->context);
    if (c == NULL)
        return -1;
    int n = c->poll_cq(cq, num, wc);
    uint64_t now = 0; /* read once per poll, and only for a completion that needs it */
    for (int i = 0; i < n; i++) {
        /* a receive is the peer's traffic, gated by its own host; an error entry's opcode is
         * undefined, so it counts as a send (clamped at zero) */
        if ((wc[i].opcode & IBV_WC_RECV) && wc[i].status == IBV_WC_SUCCESS)
            continue;
        struct gqp *q = qp_find(qp_key(c, wc[i].qp_num));
        if (q == NULL)
            continue;
        if (now == 0)
            now = now_ns();
        qp_done(q->link, q, 1, now);
    }
    return n;
}

/* The context's slot, gated if it can be, its ops swapped for the trampolines when it is gated
 * or counted; NULL when every slot is taken. */
static struct gctx *ctx_gate(struct ibv_context *ctx)
{
    struct gctx *c = ctx_find(ctx);
    if (c != NULL && (c->link != NULL || now_ns() < c->retry_ns))
        return c;
    if (c == NULL) {
        unsigned n = atomic_load(&g.nctx), i = 0;
        while (i < n && atomic_load(&g.ctxs[i].ctx) != NULL)
            i++;
        if (i == MAX_CTX) {
            count(contexts[CRUX_GATE_FULL], 1);
            return NULL;
        }
        c = &g.ctxs[i];
        memset(c, 0, sizeof *c);
        atomic_store(&c->ctx, ctx);
        if (i == n)
            atomic_store(&g.nctx, n + 1);
    }
    char err[160] = "";
    struct glink *l = NULL;
    int why = crux_gate__evaluate(ctx->device->name, &l, err, sizeof err);
    count(contexts[why], 1);
    if (why != CRUX_GATE_GATED) {
        if (g.cfg.log)
            fprintf(stderr, "crux-shim: pcie gate %s: %s%s%s\n", ctx->device->name,
                    crux_gate_reason_names[why], err[0] ? ": " : "", err);
        c->retry_ns = now_ns() + RETRY_NS;
    } else {
        if (g.cfg.log)
            fprintf(stderr, "crux-shim: pcie gate %s: gated, link %u level %u\n",
                    ctx->device->name, l->link, atomic_load(&l->level));
        atomic_store(&c->link, l);
    }
    if (c->swapped || (l == NULL && !g.cfg.count))
        return c;
    /* Once per context: a second swap would keep our own trampolines as "the provider's". */
    c->post_send = ctx->ops.post_send;
    c->poll_cq = ctx->ops.poll_cq;
    c->swapped = 1;
    /* callers on other threads see the old or the new pointer; both work */
    atomic_store_explicit((_Atomic post_send_fn *)&ctx->ops.post_send, gate_post_send,
                          memory_order_release);
    atomic_store_explicit((_Atomic poll_cq_fn *)&ctx->ops.poll_cq, gate_poll_cq,
                          memory_order_release);
    return c;
}

/* ---- the wrapper's hooks ---------------------------------------------------------------- */

void crux_gate_qp_created(struct ibv_qp *qp, const struct ibv_qp_init_attr *attr)
{
    if (qp == NULL || qp->context == NULL)
        return;
    pthread_mutex_lock(&g.lock);
    struct gctx *c = ctx_gate(qp->context);
    if (c != NULL && c->swapped) {
        uint64_t key = qp_key(c, qp->qp_num);
        struct gqp *q = qp_find(key); /* a QPN reused behind our back: start it afresh */
        for (unsigned i = qp_home(key), n = 0; q == NULL && n < QP_SLOTS;
             i = (i + 1) & QP_MASK, n++) {
            uint64_t k = atomic_load(&g.qps[i].key);
            if (k == KEY_EMPTY || k == KEY_DELETED)
                q = &g.qps[i];
        }
        if (q != NULL) { /* a full table leaves the QP untracked: ungated and uncounted */
            atomic_store(&q->out, 0);
            atomic_store(&q->sig_all, attr != NULL && attr->sq_sig_all);
            atomic_store(&q->rec, NULL); /* until its record is written: crux_gate_qp_counters */
            atomic_store(&q->mark, 0);
            q->link = c->link;
            atomic_store_explicit(&q->key, key, memory_order_release);
        }
    }
    pthread_mutex_unlock(&g.lock);
}

void crux_gate_qp_destroyed(struct ibv_qp *qp)
{
    struct gctx *c = qp != NULL ? ctx_find(qp->context) : NULL;
    if (c == NULL || !c->swapped)
        return;
    uint64_t key = qp_key(c, qp->qp_num);
    struct gqp *q = qp_find(key);
    if (q == NULL)
        return;
    /* Its unpolled completions will never be counted: let the link go idle now (its busy time
     * ends here). Outside g.lock, which must not wait for a link mutex that a blocked acquire
     * may hold. Then its record is freed by the wrapper: stop counting into it first. */
    qp_done(q->link, q, INT64_MAX, now_ns());
    atomic_store_explicit(&q->rec, NULL, memory_order_release);
    pthread_mutex_lock(&g.lock);
    unsigned i = (unsigned)(q - g.qps);
    if (atomic_load(&q->key) != key) {
        /* deleted meanwhile by another thread's destroy of the same QP: nothing to do */
    } else if (atomic_load(&g.qps[(i + 1) & QP_MASK].key) != KEY_EMPTY) {
        atomic_store(&q->key, KEY_DELETED);
    } else {
        /* a slot followed by an empty one can be empty too (no probe chain runs through it),
         * so deleted markers do not pile up as QPs come and go */
        atomic_store(&q->key, KEY_EMPTY);
        while (atomic_load(&g.qps[i = (i - 1) & QP_MASK].key) == KEY_DELETED)
            atomic_store(&g.qps[i].key, KEY_EMPTY);
    }
    pthread_mutex_unlock(&g.lock);
}

void crux_gate_qp_counters(struct ibv_qp *qp, struct crux_qps_counters *k)
{
    struct gctx *c = qp != NULL ? ctx_find(qp->context) : NULL;
    struct gqp *q = c != NULL && c->swapped ? qp_find(qp_key(c, qp->qp_num)) : NULL;
    if (q != NULL)
        atomic_store_explicit(&q->rec, k, memory_order_release);
}

void crux_gate_context_closed(struct ibv_context *ctx)
{
    pthread_mutex_lock(&g.lock);
    struct gctx *c = ctx_find(ctx);
    if (c != NULL) /* its QPs are gone; a new context may come back at the same address */
        atomic_store(&c->ctx, NULL);
    pthread_mutex_unlock(&g.lock);
}
