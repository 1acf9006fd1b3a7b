/*
 * crux_nccl_profiler.c - libcrux_nccl_profiler.so, an NCCL profiler plugin (NCCL >= 2.23) that
 * records when each communicator of the process has data on the network, for the crux agent's
 * t_j and iteration period (docs/measurement.md). crux-run loads it with
 * NCCL_PROFILER_PLUGIN=libcrux_nccl_profiler.so and its directory on LD_LIBRARY_PATH, the one
 * spelling every NCCL from 2.23 accepts (docs/nccl-profiler-abi.md).
 *
 * It exports ncclProfiler_v1 ... ncclProfiler_v6; NCCL takes the newest it knows. It asks for
 * collectives and p2p operations (their function and size), proxy operations (one channel and
 * peer of one of them) and proxy steps (one network transfer each): a step's hand-off to the
 * network (SendWait; for a receive, its arrival) opens the op's network time, each step's
 * completion extends it. When an op stops, its time goes into the communicator's newest burst
 * (crux_ncclrec.h), under a per-communicator spin lock; the record file is rewritten at most
 * every 200 ms by whichever thread gets there. Everything else returns a NULL handle.
 *
 * Fails open: without memory, a record directory or a usable descriptor, events are dropped
 * and NCCL runs as without the plugin. The one exception is init, which fails (NCCL then
 * unloads the plugin and goes on) only when it cannot allocate its state.
 *
 * Chaining: with CRUX_NCCL_PROFILER_NEXT=<plugin> (crux-run sets it when the job named its own
 * NCCL_PROFILER_PLUGIN), every call is forwarded to that plugin's struct of the same version,
 * with parent handles translated to its own; the event mask NCCL uses is the union of both.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "crux_nccl_prof.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT const int crux_nccl_profiler_marker = 1; /* tells a chain that names us from a plugin */

static const int MASK = ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp
                        | ncclProfileProxyStep;

/* The chained plugin's calls (every version's struct has this shape; only the descriptor
 * types of init and startEvent differ, and each version's wrapper below uses its own). */
struct nc_api {
    const char *name;
    void *init;
    ncclResult_t (*start)(void *ctx, void **h, void *descr);
    ncclResult_t (*stop)(void *h);
    ncclResult_t (*record)(void *h, int state, void *args);
    ncclResult_t (*finalize)(void *ctx);
};
static const struct nc_api *next_api;

_Static_assert(offsetof(ncclProfilerEventDescr_v1_t, coll.datatype) == 84, "v1 datatype");
_Static_assert(offsetof(ncclProfilerEventDescr_v2_t, coll.datatype) == 88, "v2 datatype");
_Static_assert(offsetof(ncclProfilerEventDescr_v4_t, coll.datatype) == 72, "v4 datatype");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, coll.parentGroup) == 104, "v5 group");
_Static_assert(offsetof(ncclProfilerEventDescr_v6_t, p2p.parentGroup) == 64, "v6 group");
_Static_assert(offsetof(ncclProfilerEventDescr_v1_t, proxyOp.isSend) == 44, "proxyOp");
_Static_assert(sizeof(ncclProfiler_v1_t) == 48 && sizeof(ncclProfiler_v6_t) == 48, "api");

/* ncclFunc_t (v1) and ncclDataType_t (v1) codes; the strings (v2+) are NCCL's static ones,
 * so a one-entry cache by address makes the lookup a compare. */
static const uint8_t FUNC_V1[8] = {CRUX_NCCL_BROADCAST, CRUX_NCCL_REDUCE, CRUX_NCCL_ALLGATHER,
                                   CRUX_NCCL_REDUCESCATTER, CRUX_NCCL_ALLREDUCE, CRUX_NCCL_OTHER,
                                   CRUX_NCCL_SEND, CRUX_NCCL_RECV};
static const uint8_t SIZE_V1[12] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

static uint8_t func_of(const char *s)
{
    static const char *const names[] = {"", "AllReduce", "AllGather", "ReduceScatter",
                                        "Broadcast", "Reduce", "Send", "Recv"};
    static const char *_Atomic seen_s;
    static _Atomic uint8_t seen_f;
    if (s == NULL)
        return CRUX_NCCL_OTHER;
    if (s == seen_s)
        return seen_f;
    uint8_t f = CRUX_NCCL_OTHER;
    for (uint8_t i = 1; i < 8; i++)
        if (strcmp(s, names[i]) == 0)
            f = i;
    seen_f = f;
    seen_s = s; /* a racing reader may pair them wrongly: a miscount, no more */
    return f;
}

static uint64_t size_of(const char *s)
{
    static const char *_Atomic seen_s;
    static _Atomic uint8_t seen_n;
    if (s == NULL)
        return 1;
    if (s == seen_s)
        return seen_n;
    uint8_t n = 1; /* "ncclInt8", "ncclFloat8e4m3", "ncclFloat8e5m2", "Unknown" (ncclUint8) */
    if (strstr(s, "64") != NULL)
        n = 8;
    else if (strstr(s, "32") != NULL)
        n = 4;
    else if (strstr(s, "16") != NULL)
        n = 2;
    seen_n = n;
    seen_s = s;
    return n;
}

/* --- events, whatever the version ------------------------------------------------------ */

static void *start(struct nc_comm *c, const struct nc_event *e)
{
    nc_note(1, 0);
    if (e->type == ncclProfileColl || e->type == ncclProfileP2p) {
        if (e->comm_hash != 0)
            nc_comm_hash(c, e->comm_hash);
        struct nc_coll *x = nc_pool_get(NC_COLL);
        x->func = e->func, x->comm = c, x->bytes = e->bytes;
        nc_count(c, e->func);
        return x;
    }
    if (e->type == ncclProfileProxyOp) {
        struct nc_op *o = nc_pool_get(NC_OP);
        o->is_send = e->is_send != 0;
        o->comm = c;
        o->coll = nc_pool_kind(e->parent) == NC_COLL ? e->parent : NULL;
        if (e->n_steps > 0 && e->chunk > 0)
            o->planned = (uint64_t)e->n_steps * (uint64_t)e->chunk;
        return o;
    }
    if (e->type == ncclProfileProxyStep) {
        if (nc_pool_kind(e->parent) != NC_OP) {
            nc_note(0, e->parent != NULL);
            return NULL;
        }
        return &((struct nc_op *)e->parent)->step;
    }
    return NULL;
}

static void step_state(struct nc_op *o, int state, uint64_t size)
{
    if (state == ncclProfilerProxyStepSendWait) {
        if (o->first == 0)
            o->first = nc_now();
        o->sent += size;
    } else if (state == ncclProfilerProxyStepRecvFlushWait
               || state == ncclProfilerProxyStepRecvGPUWait) {
        if (o->first == 0)
            o->first = nc_now();
    }
}

static void step_stop(struct nc_op *o)
{
    uint64_t t = nc_now();
    if (o->first == 0)
        o->first = t;
    o->last = t;
}

static ncclResult_t stop_event(void *h)
{
    if (h == NULL)
        return ncclSuccess;
    switch (nc_pool_kind(h)) { /* by address: nothing but our own handles is read */
    case NC_COLL:
        if (next_api && ((struct nc_coll *)h)->next)
            next_api->stop(((struct nc_coll *)h)->next);
        break;
    case NC_OP: {
        struct nc_op *o = h;
        if (next_api && o->next)
            next_api->stop(o->next);
        if (o->last != 0 && o->comm != NULL)
            nc_burst(o->comm, o->first, o->last, o->coll,
                     o->sent ? o->sent : o->is_send ? o->planned : 0);
        o->comm = NULL; /* a second stop adds nothing */
        break;
    }
    case NC_STEP:
        step_stop(((struct nc_step *)h)->op);
        break;
    case NC_FWD: {
        struct nc_fwd *f = h;
        if (next_api && f->next)
            next_api->stop(f->next);
        if (f->op != NULL)
            step_stop(f->op);
        break;
    }
    default:
        nc_note(0, 1);
    }
    return ncclSuccess;
}

static void record(void *h, int state, uint64_t size, void *args)
{
    if (h == NULL)
        return;
    int kind = nc_pool_kind(h);
    if (kind == 0) {
        nc_note(0, 1);
        return;
    }
    void *theirs = kind == NC_FWD ? ((struct nc_fwd *)h)->next
                   : kind == NC_COLL ? ((struct nc_coll *)h)->next
                   : kind == NC_OP ? ((struct nc_op *)h)->next : NULL;
    if (next_api && theirs)
        next_api->record(theirs, state, args);
    struct nc_op *o = kind == NC_STEP ? ((struct nc_step *)h)->op
                      : kind == NC_FWD ? ((struct nc_fwd *)h)->op : NULL;
    if (o != NULL)
        step_state(o, state, size);
}

/* Our handle and the chained plugin's as one handle for NCCL. */
static void *joined(void *ours, void *theirs)
{
    int kind = nc_pool_kind(ours);
    if (kind == NC_COLL) {
        ((struct nc_coll *)ours)->next = theirs;
        return ours;
    }
    if (kind == NC_OP) {
        ((struct nc_op *)ours)->next = theirs;
        return ours;
    }
    if (kind != NC_STEP && theirs == NULL)
        return NULL;
    struct nc_fwd *f = nc_pool_get(NC_FWD);
    if (f == NULL)
        return ours;
    f->op = kind == NC_STEP ? ((struct nc_step *)ours)->op : NULL;
    f->next = theirs;
    return f;
}

static int init_common(void **context, uint64_t comm_hash, int nnodes, int nranks,
                       int rank, int version)
{
    nc_api_version = version;
    struct nc_comm *c = nc_comm_new(comm_hash, nnodes, nranks, rank);
    *context = c;
    if (c == NULL)
        return 1;
    nc_set_mask((uint32_t)MASK);
    return 0;
}

static ncclResult_t finalize(void *context)
{
    struct nc_comm *c = context;
    if (c == NULL)
        return ncclSuccess;
    if (next_api && c->next_ctx)
        next_api->finalize(c->next_ctx);
    nc_comm_done(c);
    return ncclSuccess;
}

/* --- one wrapper per API version ------------------------------------------------------- */

/* The chained plugin's init of `version`, called with NCCL's arguments (CALL), its mask OR-ed
 * into NCCL's after it. */
#define CHAIN_INIT(version, type, CALL)                                                      \
    do {                                                                                     \
        const type *n = nc_chain_sym(version);                                               \
        if (n != NULL) {                                                                     \
            void *nctx = NULL;                                                               \
            *mask = 0; /* what it asks for, then ours on top */                                                               \
            if (n->init CALL == ncclSuccess) {                                               \
                ((struct nc_comm *)*context)->next_ctx = nctx;                               \
                next_api = (const struct nc_api *)n;                                         \
            }                                                                                \
        }                                                                                    \
        *mask = (n != NULL && next_api != NULL ? *mask : 0) | MASK;                          \
    } while (0)

/* Decodes descriptor `d` of any version into `e`, calls the chained plugin with a copy whose
 * parents are its own handles, and writes NCCL's handle. PXN: a proxy op another process
 * created arrives with that process's context and parent: neither is touched. */
#define START_BODY(DESCR_T, FILL, GROUPS)                                                    \
    *h = NULL;                                                                               \
    if (d == NULL || ctx == NULL)                                                            \
        return ncclSuccess;                                                                  \
    if (d->type == ncclProfileProxyOp && d->proxyOp.pid != nc_pid)                           \
        return ncclSuccess;                                                                  \
    struct nc_comm *c = ctx;                                                                 \
    struct nc_event e = {.type = d->type, .parent = d->parentObj};                           \
    FILL;                                                                                    \
    void *ours = start(c, &e);                                                               \
    if (next_api != NULL && c->next_ctx != NULL) {                                           \
        DESCR_T copy = *d;                                                                   \
        copy.parentObj = nc_their(d->parentObj);                                             \
        GROUPS;                                                                              \
        void *theirs = NULL;                                                                 \
        next_api->start(c->next_ctx, &theirs, &copy);                                        \
        ours = joined(ours, theirs);                                                         \
    }                                                                                        \
    *h = ours;                                                                               \
    return ncclSuccess;

#define FILL_OPS                                                                             \
    if (d->type == ncclProfileProxyOp) {                                                     \
        e.is_send = d->proxyOp.isSend, e.n_steps = d->proxyOp.nSteps;                        \
        e.chunk = d->proxyOp.chunkSize;                                                      \
    }

/* v1 (NCCL 2.23): numeric function and type codes; the communicator's hash per collective */
static ncclResult_t init_v1(void **context, int *mask)
{
    if (init_common(context, 0, 0, 0, 0, 1) != 0)
        return ncclSystemError;
    CHAIN_INIT(1, ncclProfiler_v1_t, (&nctx, mask));
    return ncclSuccess;
}

static ncclResult_t start_v1(void *ctx, void **h, ncclProfilerEventDescr_v1_t *d)
{
    START_BODY(ncclProfilerEventDescr_v1_t, {
        if (d->type == ncclProfileColl) {
            e.func = d->coll.func < 8 ? FUNC_V1[d->coll.func] : CRUX_NCCL_OTHER;
            e.bytes = d->coll.count * (d->coll.datatype < 12 ? SIZE_V1[d->coll.datatype] : 1);
            e.comm_hash = d->coll.commHash;
        } else if (d->type == ncclProfileP2p) {
            e.func = d->p2p.func < 8 ? FUNC_V1[d->p2p.func] : CRUX_NCCL_OTHER;
            e.bytes = d->p2p.count * (d->p2p.datatype < 12 ? SIZE_V1[d->p2p.datatype] : 1);
            e.comm_hash = d->p2p.commHash;
        }
        FILL_OPS
    }, {})
}

/* v1-v3 step states carry no sizes (NCCL passes none, or the deprecated proxyOp ones); v4 on
 * give a send step's size with its SendWait state */
#define RECORD(N, SIZE)                                                                     \
    static ncclResult_t record_v##N(void *h, ncclProfilerEventState_v##N##_t s,              \
                                    ncclProfilerEventStateArgs_v##N##_t *a)                  \
    {                                                                                        \
        record(h, (int)s, SIZE, a);                                                          \
        return ncclSuccess;                                                                  \
    }
RECORD(1, 0)
RECORD(2, 0)
RECORD(3, 0)
#define STEP_SIZE (a != NULL && s == ncclProfilerProxyStepSendWait ? a->proxyStep.transSize : 0)

/* v2 (2.24, 2.25) and v3 (2.26): strings; v3 drops trafficBytes, which moves nothing we read */
#define FILL_V2                                                                              \
    if (d->type == ncclProfileColl) {                                                        \
        e.func = func_of(d->coll.func);                                                      \
        e.bytes = d->coll.count * size_of(d->coll.datatype);                                 \
        e.comm_hash = d->coll.commHash;                                                      \
    } else if (d->type == ncclProfileP2p) {                                                  \
        e.func = func_of(d->p2p.func);                                                       \
        e.bytes = d->p2p.count * size_of(d->p2p.datatype);                                   \
        e.comm_hash = d->p2p.commHash;                                                       \
    }                                                                                        \
    FILL_OPS

static ncclResult_t init_v2(void **context, int *mask)
{
    if (init_common(context, 0, 0, 0, 0, 2) != 0)
        return ncclSystemError;
    CHAIN_INIT(2, ncclProfiler_v2_t, (&nctx, mask));
    return ncclSuccess;
}

static ncclResult_t start_v2(void *ctx, void **h, ncclProfilerEventDescr_v2_t *d)
{
    START_BODY(ncclProfilerEventDescr_v2_t, FILL_V2, {})
}

static ncclResult_t init_v3(void **context, int *mask)
{
    if (init_common(context, 0, 0, 0, 0, 3) != 0)
        return ncclSystemError;
    CHAIN_INIT(3, ncclProfiler_v3_t, (&nctx, mask));
    return ncclSuccess;
}

static ncclResult_t start_v3(void *ctx, void **h, ncclProfilerEventDescr_v3_t *d)
{
    START_BODY(ncclProfilerEventDescr_v3_t, FILL_V2, {})
}

/* v4 (2.27) on: the communicator comes with init; step sizes come with the states */
#define FILL_V4                                                                              \
    if (d->type == ncclProfileColl) {                                                        \
        e.func = func_of(d->coll.func);                                                      \
        e.bytes = d->coll.count * size_of(d->coll.datatype);                                 \
    } else if (d->type == ncclProfileP2p) {                                                  \
        e.func = func_of(d->p2p.func);                                                       \
        e.bytes = d->p2p.count * size_of(d->p2p.datatype);                                   \
    }                                                                                        \
    FILL_OPS

RECORD(4, STEP_SIZE)
RECORD(5, STEP_SIZE)
RECORD(6, STEP_SIZE)

static ncclResult_t init_v4(void **context, int *mask, const char *name, uint64_t hash,
                            int nnodes, int nranks, int rank, ncclDebugLogger_t log)
{
    if (init_common(context, hash, nnodes, nranks, rank, 4) != 0)
        return ncclSystemError;
    CHAIN_INIT(4, ncclProfiler_v4_t, (&nctx, mask, name, hash, nnodes, nranks, rank, log));
    return ncclSuccess;
}

static ncclResult_t start_v4(void *ctx, void **h, ncclProfilerEventDescr_v4_t *d)
{
    START_BODY(ncclProfilerEventDescr_v4_t, FILL_V4, {})
}

/* v5 (2.28) and v6 (2.29+): a collective's Group parent moved to parentGroup */
#define GROUPS_V5                                                                            \
    if (d->type == ncclProfileColl)                                                          \
        copy.coll.parentGroup = nc_their(d->coll.parentGroup);                               \
    else if (d->type == ncclProfileP2p)                                                      \
        copy.p2p.parentGroup = nc_their(d->p2p.parentGroup);

static ncclResult_t init_v5(void **context, uint64_t id, int *mask, const char *name,
                            int nnodes, int nranks, int rank, ncclDebugLogger_t log)
{
    if (init_common(context, id, nnodes, nranks, rank, 5) != 0)
        return ncclSystemError;
    CHAIN_INIT(5, ncclProfiler_v5_t, (&nctx, id, mask, name, nnodes, nranks, rank, log));
    return ncclSuccess;
}

static ncclResult_t start_v5(void *ctx, void **h, ncclProfilerEventDescr_v5_t *d)
{
    START_BODY(ncclProfilerEventDescr_v5_t, FILL_V4, GROUPS_V5)
}

static ncclResult_t init_v6(void **context, uint64_t id, int *mask, const char *name,
                            int nnodes, int nranks, int rank, ncclDebugLogger_t log)
{
    if (init_common(context, id, nnodes, nranks, rank, 6) != 0)
        return ncclSystemError;
    CHAIN_INIT(6, ncclProfiler_v6_t, (&nctx, id, mask, name, nnodes, nranks, rank, log));
    return ncclSuccess;
}

static ncclResult_t start_v6(void *ctx, void **h, ncclProfilerEventDescr_v6_t *d)
{
    START_BODY(ncclProfilerEventDescr_v6_t, FILL_V4, GROUPS_V5)
}

EXPORT const ncclProfiler_v6_t ncclProfiler_v6 = {"crux", init_v6, start_v6, stop_event,
                                                   record_v6, finalize};
EXPORT const ncclProfiler_v5_t ncclProfiler_v5 = {"crux", init_v5, start_v5, stop_event,
                                                   record_v5, finalize};
EXPORT const ncclProfiler_v4_t ncclProfiler_v4 = {"crux", init_v4, start_v4, stop_event,
                                                   record_v4, finalize};
EXPORT const ncclProfiler_v3_t ncclProfiler_v3 = {"crux", init_v3, start_v3, stop_event,
                                                   record_v3, finalize};
EXPORT const ncclProfiler_v2_t ncclProfiler_v2 = {"crux", init_v2, start_v2, stop_event,
                                                   record_v2, finalize};
EXPORT const ncclProfiler_v1_t ncclProfiler_v1 = {"crux", init_v1, start_v1, stop_event,
                                                   record_v1, finalize};
