/*
 * bench_nccl_profiler.c - what libcrux_nccl_profiler.so adds per event (bench/nccl_profiler.py).
 *
 *   bench_nccl_profiler PLUGIN [COLLS]
 *
 * Drives the plugin's ncclProfiler_v6 as NCCL 2.29+ would, from one thread, with no NCCL: per
 * collective a Coll start and stop, OPS proxy ops, each with STEPS steps (start, the SendWait
 * state with its size, stop), then the ops' stops. Prints, per case, ns per call: the same
 * loop through a plugin whose calls do nothing is subtracted, so what remains is the plugin.
 * The record file goes to $CRUX_QP_DIR (a scratch directory).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../nccl/err.h"
#include "../nccl/profiler.h"

static ncclResult_t nop_init(void **c, uint64_t id, int *m, const char *n, int a, int b, int r,
                             ncclDebugLogger_t l)
{
    (void)id, (void)m, (void)n, (void)a, (void)b, (void)r, (void)l;
    static int tag;
    *c = &tag;
    return ncclSuccess;
}
static ncclResult_t nop_start(void *c, void **h, ncclProfilerEventDescr_v6_t *d)
{
    (void)c, (void)d;
    static int tag;
    *h = &tag;
    return ncclSuccess;
}
static ncclResult_t nop_stop(void *h) { (void)h; return ncclSuccess; }
static ncclResult_t nop_record(void *h, ncclProfilerEventState_v6_t s,
                               ncclProfilerEventStateArgs_v6_t *a)
{
    (void)h, (void)s, (void)a;
    return ncclSuccess;
}
static ncclResult_t nop_fin(void *c) { (void)c; return ncclSuccess; }
static const ncclProfiler_v6_t NOP = {"nop", nop_init, nop_start, nop_stop, nop_record, nop_fin};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

/* ns per call over `colls` collectives of `ops` ops of `steps` steps */
static double run(const ncclProfiler_v6_t *p, void *ctx, long colls, int ops, int steps)
{
    ncclProfilerEventDescr_v6_t coll = {.type = ncclProfileColl, .rank = 0};
    coll.coll.func = "AllReduce";
    coll.coll.datatype = "ncclFloat32";
    coll.coll.count = 1 << 20;
    ncclProfilerEventDescr_v6_t op = {.type = ncclProfileProxyOp};
    op.proxyOp.pid = getpid(), op.proxyOp.isSend = 1, op.proxyOp.nSteps = steps;
    op.proxyOp.chunkSize = 1 << 19;
    ncclProfilerEventDescr_v6_t step = {.type = ncclProfileProxyStep};
    ncclProfilerEventStateArgs_v6_t args = {.proxyStep = {.transSize = 1 << 19}};
    void *hc, *ho[64], *hs;
    long calls = 0;
    double t0 = now();
    for (long i = 0; i < colls; i++) {
        p->startEvent(ctx, &hc, &coll);
        p->stopEvent(hc);
        calls += 2;
        for (int o = 0; o < ops; o++) {
            op.parentObj = hc;
            p->startEvent(ctx, &ho[o], &op);
            for (int s = 0; s < steps; s++) {
                step.parentObj = ho[o];
                step.proxyStep.step = s;
                p->startEvent(ctx, &hs, &step);
                p->recordEventState(hs, ncclProfilerProxyStepSendWait, &args);
                p->stopEvent(hs);
            }
            calls += 1 + 3 * steps;
        }
        for (int o = 0; o < ops; o++)
            p->stopEvent(ho[o]);
        calls += ops;
    }
    return (now() - t0) / (double)calls;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PLUGIN [COLLS]\n", argv[0]);
        return 2;
    }
    long colls = argc > 2 ? atol(argv[2]) : 200000;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    const ncclProfiler_v6_t *p = lib ? dlsym(lib, "ncclProfiler_v6") : NULL;
    if (p == NULL) {
        fprintf(stderr, "%s: no ncclProfiler_v6 (%s)\n", argv[1], dlerror());
        return 1;
    }
    void *ctx = NULL, *nctx = NULL;
    int mask = 0;
    if (p->init(&ctx, 42, &mask, "bench", 1, 8, 0, NULL) != ncclSuccess
        || NOP.init(&nctx, 42, &mask, "bench", 1, 8, 0, NULL) != ncclSuccess)
        return 1;
    static const struct { const char *name; int ops, steps; } cases[] = {
        {"collective alone (start+stop)", 0, 0},
        {"+ 2 proxy ops x 4 steps", 2, 4},
        {"+ 16 proxy ops x 8 steps", 16, 8},
    };
    printf("case,calls_per_coll,plugin_ns_per_call,baseline_ns_per_call,added_ns_per_call,"
           "added_ns_per_coll\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int ops = cases[i].ops, steps = cases[i].steps;
        long n = ops ? colls / (ops * steps) : colls;
        run(p, ctx, n / 10, ops, steps); /* warm the pools and caches */
        double got = run(p, ctx, n, ops, steps), base = run(&NOP, nctx, n, ops, steps);
        int per = 2 + ops * (2 + 3 * steps);
        printf("%s,%d,%.1f,%.1f,%.1f,%.0f\n", cases[i].name, per, got, base, got - base,
               (got - base) * per);
    }
    p->finalize(ctx);
    return 0;
}
