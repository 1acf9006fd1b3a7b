/*
 * nccl_harness.c - drives an NCCL profiler plugin through its real ABI, without NCCL or a GPU
 * (tests/test_nccl_profiler.py, bench/nccl_profiler.py).
 *
 *   nccl_harness PLUGIN RELEASE < script
 *
 * PLUGIN is opened the way NCCL opens NCCL_PROFILER_PLUGIN (dlopen of the name, then
 * libnccl-profiler-<name>.so, RTLD_NOW | RTLD_LOCAL); RELEASE (e.g. 2.27) picks the versions
 * that release looks up, newest first, as its src/plugin/profiler.cc does; the first found
 * is used. It prints "api N". Then one command per line (handles and contexts are small
 * integer ids; "-" is NULL):
 *
 *   init C NRANKS RANK HASH          the version's init, with a comm hash (v4+: in init)
 *   coll C H PARENT FUNC COUNT DTYPE  start a collective (FUNC, DTYPE: NCCL's names)
 *   p2p C H PARENT FUNC COUNT DTYPE PEER
 *   op C H PARENT ISSEND NSTEPS CHUNK PID   a proxy op (PID 0: this process)
 *   step C H PARENT STEP             a proxy step
 *   event C H TYPE PARENT            an event of any other type (bit value)
 *   state H STATE SIZE               recordEventState (SIZE -: no args)
 *   stop H
 *   fin C
 *   at US                            wait until US microseconds after the script began
 *   junk H ADDRESS                   set handle H to an arbitrary address (malformed input)
 *   mem                              print "hwm KB": this process's peak resident memory
 *   fork                             a child inits communicator 63 (hash 6363), runs one
 *                                    collective on it, finalizes and exits; then go on
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../nccl/err.h"
#include "../nccl/profiler.h"

#define HANDLES 65536
#define CTXS 64

static void *hs[HANDLES], *ctxs[CTXS];
static int mask, api;
static const void *plugin;

static const char *const FUNCS[] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter",
                                    "AllReduce", "SendRecv", "Send", "Recv"};
static const char *const TYPES[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32",
                                    "ncclInt64", "ncclUint64", "ncclFloat16", "ncclFloat32",
                                    "ncclFloat64", "ncclBfloat16"};

static uint8_t code(const char *s, const char *const *names, int n)
{
    if (s == NULL) /* an event line: a descriptor NCCL left zero */
        return 0;
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return (uint8_t)i;
    return (uint8_t)n;
}

/* NCCL's strings are static: keep every name read from the script for the process's life */
static const char *keep(const char *s)
{
    for (int i = 0; i < 8; i++)
        if (strcmp(s, FUNCS[i]) == 0)
            return FUNCS[i];
    for (int i = 0; i < 10; i++)
        if (strcmp(s, TYPES[i]) == 0)
            return TYPES[i];
    return strdup(s);
}

static void *handle(const char *id)
{
    return strcmp(id, "-") == 0 ? NULL : hs[atoi(id) % HANDLES];
}

/* Fills the fields every version shares, then the version's own. */
#define FILL(d, type_, parent_)                                                              \
    memset(&d, 0, sizeof d);                                                                 \
    d.type = type_;                                                                          \
    d.parentObj = parent_;                                                                   \
    d.rank = 0;

#define START(V)                                                                             \
    do {                                                                                     \
        ncclProfilerEventDescr_v##V##_t d;                                                   \
        FILL(d, type, parent);                                                               \
        if (type == ncclProfileProxyOp) {                                                    \
            d.proxyOp.pid = pid, d.proxyOp.isSend = a1, d.proxyOp.nSteps = a2;               \
            d.proxyOp.chunkSize = a3;                                                        \
        } else if (type == ncclProfileProxyStep) {                                           \
            d.proxyStep.step = a1;                                                           \
        }                                                                                    \
        EXTRA_##V;                                                                           \
        ((const ncclProfiler_v##V##_t *)plugin)->startEvent(ctx, h, &d);                     \
    } while (0)

#define COLL_STR                                                                             \
    if (type == ncclProfileColl) {                                                           \
        d.coll.func = func, d.coll.count = count, d.coll.datatype = dtype;                   \
    } else if (type == ncclProfileP2p) {                                                     \
        d.p2p.func = func, d.p2p.count = count, d.p2p.datatype = dtype, d.p2p.peer = a1;     \
    }
#define COLL_HASH                                                                            \
    if (type == ncclProfileColl)                                                             \
        d.coll.commHash = hash;                                                              \
    else if (type == ncclProfileP2p)                                                         \
        d.p2p.commHash = hash;
#define EXTRA_1                                                                              \
    if (type == ncclProfileColl) {                                                           \
        d.coll.func = code(func, FUNCS, 8), d.coll.count = count;                            \
        d.coll.datatype = code(dtype, TYPES, 10), d.coll.commHash = hash;                    \
    } else if (type == ncclProfileP2p) {                                                     \
        d.p2p.func = code(func, FUNCS, 8), d.p2p.count = count;                              \
        d.p2p.datatype = code(dtype, TYPES, 10), d.p2p.peer = a1, d.p2p.commHash = hash;     \
    }
#define EXTRA_2 COLL_STR COLL_HASH
#define EXTRA_3 COLL_STR COLL_HASH
#define EXTRA_4 COLL_STR
/* v5+: NCCL's Coll/P2p parent is the CollApi/P2pApi event, the Group is parentGroup; the
 * script's one parent stands for both */
#define GROUP                                                                                \
    if (type == ncclProfileColl)                                                             \
        d.coll.parentGroup = parent;                                                         \
    else if (type == ncclProfileP2p)                                                         \
        d.p2p.parentGroup = parent;
#define EXTRA_5 COLL_STR GROUP
#define EXTRA_6 COLL_STR GROUP

static void start(void *ctx, void **h, uint64_t type, void *parent, const char *func,
                  size_t count, const char *dtype, int a1, int a2, int a3, pid_t pid,
                  uint64_t hash)
{
    switch (api) {
    case 1: START(1); break;
    case 2: START(2); break;
    case 3: START(3); break;
    case 4: START(4); break;
    case 5: START(5); break;
    default: START(6); break;
    }
}

static uint64_t hashes[CTXS];

static void init(int c, int nranks, int rank, uint64_t hash)
{
    void **ctx = &ctxs[c % CTXS];
    hashes[c % CTXS] = hash;
    ncclResult_t r;
    switch (api) {
    case 1: r = ((const ncclProfiler_v1_t *)plugin)->init(ctx, &mask); break;
    case 2: r = ((const ncclProfiler_v2_t *)plugin)->init(ctx, &mask); break;
    case 3: r = ((const ncclProfiler_v3_t *)plugin)->init(ctx, &mask); break;
    case 4: r = ((const ncclProfiler_v4_t *)plugin)->init(ctx, &mask, "c", hash, 1, nranks,
                                                           rank, NULL); break;
    case 5: r = ((const ncclProfiler_v5_t *)plugin)->init(ctx, hash, &mask, "c", 1, nranks,
                                                           rank, NULL); break;
    default: r = ((const ncclProfiler_v6_t *)plugin)->init(ctx, hash, &mask, "c", 1, nranks,
                                                            rank, NULL); break;
    }
    printf("init %d -> %d mask %#x\n", c, (int)r, mask);
}

/* The ABI calls every version shares: stopEvent, recordEventState, finalize. */
struct common {
    const char *name;
    void *init, *start;
    ncclResult_t (*stop)(void *);
    ncclResult_t (*record)(void *, int, void *);
    ncclResult_t (*finalize)(void *);
};

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s PLUGIN RELEASE < script\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL && strchr(argv[1], '/') == NULL) {
        char alt[256];
        snprintf(alt, sizeof alt, "libnccl-profiler-%s.so", argv[1]);
        lib = dlopen(alt, RTLD_NOW | RTLD_LOCAL);
    }
    if (lib == NULL) {
        fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    /* newest version each release looks up (docs/nccl-profiler-abi.md, section 1) */
    int minor = atoi(strchr(argv[2], '.') ? strchr(argv[2], '.') + 1 : argv[2]);
    int newest = minor >= 29 ? 6 : minor == 28 ? 5 : minor == 27 ? 4 : minor == 26 ? 3
               : minor >= 24 ? 2 : 1;
    for (int v = newest; v >= 1 && plugin == NULL; v--) {
        char sym[32];
        snprintf(sym, sizeof sym, "ncclProfiler_v%d", v);
        if ((plugin = dlsym(lib, sym)) != NULL)
            api = v;
    }
    if (plugin == NULL) {
        fprintf(stderr, "no ncclProfiler_vN for NCCL %s\n", argv[2]);
        return 1;
    }
    const struct common *p = plugin;
    printf("api %d name %s pid %d\n", api, p->name, (int)getpid());
    fflush(stdout);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char line[512], cmd[16], s1[64], s2[64], s3[64];
    while (fgets(line, sizeof line, stdin) != NULL) {
        int c = 0, h = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0;
        unsigned long long big = 0;
        if (sscanf(line, "%15s", cmd) != 1)
            continue;
        if (strcmp(cmd, "init") == 0 && sscanf(line, "%*s %d %d %d %llu", &c, &a1, &a2, &big) == 4) {
            init(c, a1, a2, big);
        } else if (strcmp(cmd, "coll") == 0 || strcmp(cmd, "p2p") == 0) {
            if (sscanf(line, "%*s %d %d %63s %63s %llu %63s %d", &c, &h, s1, s2, &big, s3, &a1) < 6)
                continue;
            start(ctxs[c % CTXS], &hs[h % HANDLES], cmd[0] == 'c' ? ncclProfileColl
                  : ncclProfileP2p, handle(s1), keep(s2), big, keep(s3), a1, 0, 0, 0,
                  hashes[c % CTXS]);
        } else if (strcmp(cmd, "op") == 0
                   && sscanf(line, "%*s %d %d %63s %d %d %d %d", &c, &h, s1, &a1, &a2, &a3, &a4) == 7) {
            start(ctxs[c % CTXS], &hs[h % HANDLES], ncclProfileProxyOp, handle(s1), NULL, 0, NULL,
                  a1, a2, a3, a4 ? (pid_t)a4 : getpid(), 0);
        } else if (strcmp(cmd, "step") == 0
                   && sscanf(line, "%*s %d %d %63s %d", &c, &h, s1, &a1) == 4) {
            start(ctxs[c % CTXS], &hs[h % HANDLES], ncclProfileProxyStep, handle(s1), NULL, 0,
                  NULL, a1, 0, 0, 0, 0);
        } else if (strcmp(cmd, "event") == 0
                   && sscanf(line, "%*s %d %d %llu %63s", &c, &h, &big, s1) == 4) {
            start(ctxs[c % CTXS], &hs[h % HANDLES], big, handle(s1), NULL, 0, NULL, 0, 0, 0, 0, 0);
        } else if (strcmp(cmd, "state") == 0 && sscanf(line, "%*s %63s %d %63s", s1, &a1, s2) == 3) {
            /* v4+ args: a union whose first word is the step's size; v1-v3: 16 bytes */
            uint64_t args[2] = {strtoull(s2, NULL, 10), 0};
            p->record(handle(s1), a1, strcmp(s2, "-") == 0 ? NULL : args);
        } else if (strcmp(cmd, "stop") == 0 && sscanf(line, "%*s %63s", s1) == 1) {
            p->stop(handle(s1));
        } else if (strcmp(cmd, "fin") == 0 && sscanf(line, "%*s %d", &c) == 1) {
            if (ctxs[c % CTXS] != NULL || api < 5) /* 2.28+ skips a NULL context */
                p->finalize(ctxs[c % CTXS]);
            ctxs[c % CTXS] = NULL;
        } else if (strcmp(cmd, "junk") == 0 && sscanf(line, "%*s %d %llx", &h, &big) == 2) {
            hs[h % HANDLES] = (void *)(uintptr_t)big;
        } else if (strcmp(cmd, "fork") == 0) {
            fflush(stdout);
            pid_t kid = fork();
            if (kid == 0) {
                init(63, 2, 1, 6363);
                start(ctxs[63], &hs[0], ncclProfileColl, NULL, "AllReduce", 8, "ncclInt8", 0,
                      0, 0, 0, 6363);
                p->stop(hs[0]);
                start(ctxs[63], &hs[1], ncclProfileProxyOp, hs[0], NULL, 0, NULL, 1, 1, 8,
                      getpid(), 0);
                start(ctxs[63], &hs[2], ncclProfileProxyStep, hs[1], NULL, 0, NULL, 0, 0, 0,
                      0, 0);
                p->stop(hs[2]);
                p->stop(hs[1]);
                p->finalize(ctxs[63]);
                fflush(stdout);
                _exit(0);
            }
            waitpid(kid, NULL, 0);
            printf("child %d\n", (int)kid);
        } else if (strcmp(cmd, "mem") == 0) {
            FILE *f = fopen("/proc/self/status", "r");
            while (f != NULL && fgets(line, sizeof line, f) != NULL)
                if (strncmp(line, "VmHWM:", 6) == 0)
                    printf("hwm %ld\n", atol(line + 6));
            if (f != NULL)
                fclose(f);
            fflush(stdout);
        } else if (strcmp(cmd, "at") == 0 && sscanf(line, "%*s %llu", &big) == 1) {
            struct timespec t = t0;
            t.tv_sec += (time_t)(big / 1000000);
            t.tv_nsec += (long)(big % 1000000) * 1000;
            if (t.tv_nsec >= 1000000000L)
                t.tv_sec++, t.tv_nsec -= 1000000000L;
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL);
        }
    }
    printf("done\n");
    return 0;
}
