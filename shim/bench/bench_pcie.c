/*
 * bench_pcie.c - microbenchmark of crux_pcie.c, run by bench/pcie.py.
 *
 *   bench_pcie PATH PROCS ITERS
 *
 * PROCS = 1: uncontended acquire+release on link 0, ITERS times, one process (warm-up of
 * ITERS/10 first); prints ns per acquire+release pair.
 * PROCS > 1: PROCS forked processes hammer link 0 (ITERS acquire+release each, level = rank % 2,
 * a few dozen ns of work inside), started together; prints throughput and acquire latency
 * percentiles over all processes. Output: one line of key=value pairs.
 */
#define _GNU_SOURCE
#include "crux_pcie.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s PATH PROCS ITERS\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    int procs = atoi(argv[2]);
    long iters = atol(argv[3]);
    if (procs < 1 || iters < 1 || crux_pcie_create(path, 1) != 0) {
        fprintf(stderr, "bad arguments or cannot create %s\n", path);
        return 2;
    }
    if (procs == 1) {
        crux_pcie_t *p = crux_pcie_open(path);
        if (p == NULL)
            return 1;
        for (long i = 0; i < iters / 10; i++)
            if (crux_pcie_acquire(p, 0, 3) != 0 || crux_pcie_release(p, 0) != 0)
                return 1;
        int64_t t0 = now_ns();
        for (long i = 0; i < iters; i++) {
            crux_pcie_acquire(p, 0, 3);
            crux_pcie_release(p, 0);
        }
        int64_t t1 = now_ns();
        printf("procs=1 iters=%ld ns_per_op=%.1f\n", iters, (double)(t1 - t0) / (double)iters);
        crux_pcie_close(p);
        return 0;
    }
    size_t n = (size_t)procs * (size_t)iters;
    size_t shm_size = 64 + n * sizeof(int64_t);
    char *shm = mmap(NULL, shm_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shm == MAP_FAILED)
        return 1;
    _Atomic int *ready = (_Atomic int *)shm;
    volatile long *counter = (volatile long *)(shm + 8);
    int64_t *lat = (int64_t *)(shm + 64);
    for (int r = 0; r < procs; r++) {
        if (fork() == 0) {
            crux_pcie_t *p = crux_pcie_open(path);
            if (p == NULL)
                _exit(1);
            atomic_fetch_add(ready, 1);
            while (atomic_load(ready) < procs + 1)
                ;
            for (long i = 0; i < iters; i++) {
                int64_t a = now_ns();
                if (crux_pcie_acquire(p, 0, (unsigned)(r % 2)) != 0)
                    _exit(1);
                lat[(size_t)r * (size_t)iters + (size_t)i] = now_ns() - a;
                *counter = *counter + 1;
                crux_pcie_release(p, 0);
            }
            _exit(0);
        }
    }
    while (atomic_load(ready) < procs)
        ;
    int64_t t0 = now_ns();
    atomic_fetch_add(ready, 1);
    int bad = 0;
    for (int r = 0; r < procs; r++) {
        int st;
        wait(&st);
        bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    int64_t t1 = now_ns();
    qsort(lat, n, sizeof *lat, cmp64);
    printf("procs=%d iters=%ld ops_per_s=%.0f ns_per_op=%.1f p50_acquire_ns=%lld "
           "p99_acquire_ns=%lld max_acquire_ns=%lld count_ok=%d\n",
           procs, iters, (double)n * 1e9 / (double)(t1 - t0), (double)(t1 - t0) / (double)n,
           (long long)lat[n / 2], (long long)lat[n * 99 / 100], (long long)lat[n - 1],
           !bad && *counter == (long)n);
    return bad;
}
