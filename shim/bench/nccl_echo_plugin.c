/*
 * nccl_echo_plugin.c - a second NCCL profiler plugin, for the chaining tests
 * (tests/test_nccl_profiler.py): what a job's own plugin (NCCL Inspector, say) would see
 * behind crux's. It exports only ncclProfiler_v4 ... v6, asks for collectives, groups and
 * kernel channels, and checks every call: each handle it is given back and each event's
 * parent must be NULL or one of its own handles. At finalize it appends one line to
 * $ECHO_OUT: "starts S stops T records R foreign F contexts C".
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

#include "../nccl/err.h"
#include "../nccl/profiler.h"

#define POOL 65536
static struct ev { uint64_t type; } pool[POOL];
static _Atomic unsigned next_i, starts, stops, records, foreign, contexts;
static int ctx_tag;

static int ours(const void *p)
{
    const struct ev *e = p;
    return e >= pool && e < pool + POOL;
}

static ncclResult_t start_any(void *ctx, void **h, uint64_t type, void *parent)
{
    *h = NULL;
    if (ctx != &ctx_tag)
        foreign++;
    if (parent != NULL && !ours(parent))
        foreign++;
    starts++;
    struct ev *e = &pool[next_i++ % POOL];
    e->type = type;
    *h = e;
    return ncclSuccess;
}

static ncclResult_t stop(void *h)
{
    if (!ours(h))
        foreign++;
    stops++;
    return ncclSuccess;
}

static ncclResult_t record_any(void *h)
{
    if (!ours(h))
        foreign++;
    records++;
    return ncclSuccess;
}

static ncclResult_t record(void *h, ncclProfilerEventState_v4_t s,
                           ncclProfilerEventStateArgs_v4_t *a)
{
    (void)s, (void)a;
    return record_any(h);
}

static ncclResult_t record5(void *h, ncclProfilerEventState_v5_t s,
                            ncclProfilerEventStateArgs_v5_t *a)
{
    (void)s, (void)a;
    return record_any(h);
}

static ncclResult_t record6(void *h, ncclProfilerEventState_v6_t s,
                            ncclProfilerEventStateArgs_v6_t *a)
{
    (void)s, (void)a;
    return record_any(h);
}

static ncclResult_t init_any(void **ctx, int *mask)
{
    *ctx = &ctx_tag;
    *mask = ncclProfileColl | ncclProfileGroup | ncclProfileKernelCh;
    contexts++;
    return ncclSuccess;
}

static ncclResult_t finalize(void *ctx)
{
    const char *path = getenv("ECHO_OUT");
    FILE *f = path != NULL ? fopen(path, "a") : NULL;
    if (f != NULL) {
        fprintf(f, "starts %u stops %u records %u foreign %u contexts %u\n", starts, stops,
                records, foreign + (ctx != &ctx_tag), contexts);
        fclose(f);
    }
    return ncclSuccess;
}

static ncclResult_t init4(void **c, int *m, const char *n, uint64_t h, int nn, int nr, int r,
                          ncclDebugLogger_t l)
{
    (void)n, (void)h, (void)nn, (void)nr, (void)r, (void)l;
    return init_any(c, m);
}

static ncclResult_t init5(void **c, uint64_t id, int *m, const char *n, int nn, int nr, int r,
                          ncclDebugLogger_t l)
{
    (void)n, (void)id, (void)nn, (void)nr, (void)r, (void)l;
    return init_any(c, m);
}

static ncclResult_t start4(void *c, void **h, ncclProfilerEventDescr_v4_t *d)
{
    return start_any(c, h, d->type, d->parentObj);
}

static ncclResult_t start5(void *c, void **h, ncclProfilerEventDescr_v5_t *d)
{
    if ((d->type == ncclProfileColl && d->coll.parentGroup && !ours(d->coll.parentGroup))
        || (d->type == ncclProfileP2p && d->p2p.parentGroup && !ours(d->p2p.parentGroup)))
        foreign++;
    return start_any(c, h, d->type, d->parentObj);
}

static ncclResult_t start6(void *c, void **h, ncclProfilerEventDescr_v6_t *d)
{
    return start5(c, h, (ncclProfilerEventDescr_v5_t *)d); /* v6 extends v5's layout */
}

__attribute__((visibility("default"))) const ncclProfiler_v4_t ncclProfiler_v4 = {
    "echo", init4, start4, stop, record, finalize};
__attribute__((visibility("default"))) const ncclProfiler_v5_t ncclProfiler_v5 = {
    "echo", init5, start5, stop, record5, finalize};
__attribute__((visibility("default"))) const ncclProfiler_v6_t ncclProfiler_v6 = {
    "echo", init5, start6, stop, record6, finalize};
