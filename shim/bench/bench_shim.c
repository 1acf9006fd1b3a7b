/*
 * bench_shim - cost of the shim's work inside an intercepted ibv_modify_qp, without a NIC.
 *
 * usage: bench_shim ENTRIES ITERS
 * Builds a decision table of ENTRIES live entries in memory (half per-peer, half job-wide, the
 * wanted job's entries last so every lookup scans the whole table) and times, per call:
 *   decide_peer_ns     crux_decide hitting a per-peer entry
 *   decide_jobwide_ns  crux_decide falling back to the job-wide entry (two scans)
 *   decide_miss_ns     crux_decide finding nothing (fail open)
 *   record_ns          crux_qps_add + crux_qps_remove of one QP record
 *   fixed_ns           the wrapper's other per-connect work: two uncontended mutex
 *                      lock/unlock pairs, two clock_gettime calls and a getpid
 * Prints one line of key=value pairs. bench/shim.py drives it.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crux_shim.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void peer_of(uint32_t i, uint8_t out[16])
{
    memset(out, 0, 16);
    out[10] = out[11] = 0xff;
    out[12] = 10;
    out[13] = (uint8_t)(i >> 16);
    out[14] = (uint8_t)(i >> 8);
    out[15] = (uint8_t)i;
}

static void *build_table(uint32_t n, size_t *len)
{
    *len = CRUX_TABLE_HEADER_SIZE + (size_t)n * CRUX_TABLE_ENTRY_SIZE;
    void *base = calloc(1, *len);
    struct crux_table_header *h = base;
    h->magic = CRUX_TABLE_MAGIC;
    h->version = CRUX_TABLE_VERSION;
    h->header_size = CRUX_TABLE_HEADER_SIZE;
    h->entry_size = CRUX_TABLE_ENTRY_SIZE;
    h->capacity = n;
    h->used = n;
    h->generation = 1;
    struct crux_table_entry *e = (struct crux_table_entry *)((char *)base + CRUX_TABLE_HEADER_SIZE);
    for (uint32_t i = 0; i < n; i++) {
        struct crux_table_entry v;
        memset(&v, 0, sizeof v);
        v.state = CRUX_ENTRY_LIVE;
        v.level = 1;
        v.dscp = 26;
        v.traffic_class = 104;
        v.sport = (uint16_t)(0xC000 + i);
        int wanted = i >= n - 2; /* the last two: the measured job's peer and job-wide entry */
        snprintf(v.job_id, sizeof v.job_id, "%s-%u", wanted ? "bench" : "other", wanted ? 0 : i / 2);
        if (i % 2 == 0)
            peer_of(i, v.peer);
        else
            v.flags = CRUX_ENTRY_JOB_WIDE;
        crux_table_write_entry(&e[i], &v);
    }
    return base;
}

static double time_decide(const void *t, size_t len, const uint8_t peer[16], long iters, int want)
{
    struct ibv_ah_attr ah;
    struct crux_applied d;
    memset(&ah, 0, sizeof ah);
    ah.is_global = 1;
    memcpy(ah.grh.dgid.raw, peer, 16);
    double t0 = now();
    for (long i = 0; i < iters; i++) {
        if (crux_decide(t, len, "bench-0", &ah, &d) != want) {
            fprintf(stderr, "bench_shim: unexpected outcome %d\n", d.outcome);
            exit(1);
        }
    }
    return (now() - t0) / (double)iters;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: bench_shim ENTRIES ITERS\n");
        return 2;
    }
    uint32_t n = (uint32_t)strtoul(argv[1], NULL, 0);
    long iters = strtol(argv[2], NULL, 0);
    if (n < 2 || iters < 1) {
        fprintf(stderr, "bench_shim: ENTRIES >= 2 and ITERS >= 1\n");
        return 2;
    }
    size_t len;
    void *t = build_table(n, &len);
    uint8_t hit[16], other[16];
    peer_of(n - 2, hit);
    peer_of(0xfffffe, other);

    double peer_ns = time_decide(t, len, hit, iters, CRUX_OUT_APPLIED);
    double jobwide_ns = time_decide(t, len, other, iters, CRUX_OUT_APPLIED);
    ((struct crux_table_entry *)((char *)t + CRUX_TABLE_HEADER_SIZE))[n - 1].state = 0;
    double miss_ns = time_decide(t, len, other, iters, CRUX_OUT_NO_ENTRY);

    size_t qlen = CRUX_QPS_HEADER_SIZE + CRUX_QPS_CAPACITY * CRUX_QPS_RECORD_SIZE;
    void *q = calloc(1, qlen);
    crux_qps_init(q, qlen, (uint32_t)getpid(), "bench-0");
    struct crux_qps_record r;
    memset(&r, 0, sizeof r);
    snprintf(r.device, sizeof r.device, "mlx5_0");
    double t0 = now();
    for (long i = 0; i < iters; i++) {
        r.qpn = (uint32_t)i;
        crux_qps_count(q, CRUX_OUT_APPLIED);
        crux_qps_add(q, &r);
        crux_qps_remove(q, r.qpn, r.device);
    }
    double record_ns = (now() - t0) / (double)iters;

    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    volatile pid_t sink = 0;
    t0 = now();
    for (long i = 0; i < iters; i++) {
        struct timespec ts;
        pthread_mutex_lock(&m);
        clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
        pthread_mutex_unlock(&m);
        pthread_mutex_lock(&m);
        sink = getpid();
        clock_gettime(CLOCK_REALTIME_COARSE, &ts);
        pthread_mutex_unlock(&m);
    }
    double fixed_ns = (now() - t0) / (double)iters;
    (void)sink;

    printf("entries=%u decide_peer_ns=%.1f decide_jobwide_ns=%.1f decide_miss_ns=%.1f "
           "record_ns=%.1f fixed_ns=%.1f\n", n, peer_ns, jobwide_ns, miss_ns, record_ns, fixed_ns);
    free(q);
    free(t);
    return 0;
}
