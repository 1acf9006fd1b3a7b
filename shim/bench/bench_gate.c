/*
 * bench_gate - what the PCIe gate (crux_gate.c) adds to ibv_post_send/ibv_poll_cq, without a
 * NIC: three fake device contexts whose ops tables accept every WR (post) and return queued
 * completions (poll). One device is on a shared link in the map, so the gate swaps its ops for
 * the trampolines; one is not and is set up before counting is turned on, so its calls go
 * straight to the fake ops: the baseline; the third is not gated but counted (the trampolines
 * of a job with an id, crux_gate.h "Counting"). The QPs of the gated and the counted context
 * count into QP records as the wrapper's connected QPs do. Every WR has one 4 KiB SGE. The
 * semaphore and map files are real (the agent's formats), in the directory given.
 *
 * usage: bench_gate DIR ITERS
 * Prints key=value pairs, ns per call (per post+poll pair where it says so):
 *   base_post        ibv_post_send of one signaled WR, ungated context
 *   counted_post     the same on a counted QP of a context that is not gated
 *   gated_post       the same on a gated QP while this process holds the link: the fast path
 *   unsignaled_post  an unsignaled WR on a gated QP (no counting, no semaphore)
 *   waiter_post      gated_post while a process of a lower level waits for the link
 *   base_pair        post one WR + poll its completion, ungated
 *   counted_pair     the same, counted, not gated (the busy time's clock read at each)
 *   held_pair        the same on a gated QP while another QP keeps the link held
 *   pingpong_pair    the same with nothing else outstanding: every post takes the link and
 *                    every poll gives it back (acquire + release each time)
 *   base_poll_empty / counted_poll_empty / gated_poll_empty   ibv_poll_cq finding nothing
 * bench/pcie.py drives it.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "crux_gate.h"
#include "crux_pcie.h"
#include "crux_shim.h"

static struct ibv_device dev_gated = {.name = "gated0"}, dev_plain = {.name = "plain0"},
                         dev_count = {.name = "count0"};
static struct ibv_context ctx_gated, ctx_plain, ctx_count;
static struct ibv_cq cq_gated, cq_plain, cq_count;
static struct ibv_qp qp_plain, qp_a, qp_b, qp_c;
static long pending;
static uint32_t pending_qpn;

static int fake_post(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    (void)qp, (void)wr, (void)bad;
    return 0;
}

static int fake_poll(struct ibv_cq *cq, int num, struct ibv_wc *wc)
{
    (void)cq;
    if (pending == 0 || num < 1)
        return 0;
    pending--;
    wc[0].qp_num = pending_qpn;
    wc[0].opcode = IBV_WC_RDMA_WRITE;
    wc[0].status = IBV_WC_SUCCESS;
    return 1;
}

static int job_level(void)
{
    return 3;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static char buf[4096];
static struct ibv_sge sge = {.length = sizeof buf};
static struct ibv_send_wr signaled_wr = {.opcode = IBV_WR_RDMA_WRITE, .sg_list = &sge,
                                         .num_sge = 1, .send_flags = IBV_SEND_SIGNALED};
static struct ibv_send_wr unsignaled_wr = {.opcode = IBV_WR_RDMA_WRITE, .sg_list = &sge,
                                           .num_sge = 1};

/* The wrapper's connect: a record for the QP, its counters handed to the gate. */
static void record(void *records, struct ibv_qp *qp)
{
    struct crux_qps_record r = {.qpn = qp->qp_num};
    memcpy(r.device, qp->context->device->name, strlen(qp->context->device->name));
    crux_gate_qp_counters(qp, crux_qps_add(records, &r));
}

static double posts(struct ibv_qp *qp, struct ibv_send_wr *wr, long iters)
{
    struct ibv_send_wr *bad;
    for (long i = 0; i < iters / 10; i++) /* warm-up */
        ibv_post_send(qp, wr, &bad);
    double t0 = now();
    for (long i = 0; i < iters; i++)
        ibv_post_send(qp, wr, &bad);
    return (now() - t0) / (double)iters;
}

static double pairs(struct ibv_qp *qp, struct ibv_cq *cq, long iters)
{
    struct ibv_send_wr *bad;
    struct ibv_wc wc;
    pending_qpn = qp->qp_num;
    double t0 = 0;
    for (long i = -iters / 10; i < iters; i++) {
        if (i == 0)
            t0 = now();
        ibv_post_send(qp, &signaled_wr, &bad);
        pending = 1;
        if (ibv_poll_cq(cq, 1, &wc) != 1)
            abort();
    }
    return (now() - t0) / (double)iters;
}

static double polls_empty(struct ibv_cq *cq, long iters)
{
    struct ibv_wc wc;
    pending = 0;
    double t0 = now();
    for (long i = 0; i < iters; i++)
        ibv_poll_cq(cq, 1, &wc);
    return (now() - t0) / (double)iters;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: bench_gate DIR ITERS\n");
        return 2;
    }
    long iters = atol(argv[2]);
    char sem[4200], map[4200];
    snprintf(sem, sizeof sem, "%s/pcie", argv[1]);
    snprintf(map, sizeof map, "%s/pcie-links", argv[1]);
    FILE *f = fopen(map, "w");
    if (f == NULL || crux_pcie_create(sem, 1) != 0) {
        perror(argv[1]);
        return 1;
    }
    fputs("crux-pcie-links 1 1\ngated0 0 -\n", f);
    fclose(f);
    struct crux_gate_config cfg = {.pcie_path = sem, .links_path = map, .job_level = job_level,
                                   .quantum_ns = CRUX_GATE_QUANTUM_NS, .max_wait_ns = -1};
    crux_gate_configure(&cfg);
    struct ibv_context *ctxs[] = {&ctx_gated, &ctx_plain, &ctx_count};
    struct ibv_device *devs[] = {&dev_gated, &dev_plain, &dev_count};
    for (int i = 0; i < 3; i++) {
        ctxs[i]->device = devs[i];
        ctxs[i]->ops.post_send = fake_post;
        ctxs[i]->ops.poll_cq = fake_poll;
    }
    sge.addr = (uintptr_t)buf;
    cq_gated.context = &ctx_gated;
    cq_plain.context = &ctx_plain;
    cq_count.context = &ctx_count;
    qp_plain = (struct ibv_qp){.context = &ctx_plain, .qp_num = 1};
    qp_a = (struct ibv_qp){.context = &ctx_gated, .qp_num = 2};
    qp_b = (struct ibv_qp){.context = &ctx_gated, .qp_num = 3};
    qp_c = (struct ibv_qp){.context = &ctx_count, .qp_num = 4};
    struct ibv_qp_init_attr ia = {.qp_type = IBV_QPT_RC};
    crux_gate_qp_created(&qp_plain, &ia); /* before counting is on: the baseline */
    cfg.count = 1;
    crux_gate_configure(&cfg);
    crux_gate_qp_created(&qp_a, &ia);
    crux_gate_qp_created(&qp_b, &ia);
    crux_gate_qp_created(&qp_c, &ia);
    size_t len = CRUX_QPS_HEADER_SIZE + 4 * CRUX_QPS_RECORD_SIZE;
    void *records = aligned_alloc(64, len);
    crux_qps_init(records, len, (uint32_t)getpid(), "bench");
    record(records, &qp_a);
    record(records, &qp_b);
    record(records, &qp_c);
    if (ctx_gated.ops.post_send == fake_post || ctx_plain.ops.post_send != fake_post ||
        ctx_count.ops.post_send == fake_post) {
        fprintf(stderr, "bench_gate: the trampolines are not on the gated and counted contexts "
                        "only\n");
        return 1;
    }

    double base_post = posts(&qp_plain, &signaled_wr, iters);
    double base_pair = pairs(&qp_plain, &cq_plain, iters);
    double base_poll = polls_empty(&cq_plain, iters);
    double counted_post = posts(&qp_c, &signaled_wr, iters);
    double counted_pair = pairs(&qp_c, &cq_count, iters);
    double counted_poll = polls_empty(&cq_count, iters);
    double pingpong = pairs(&qp_a, &cq_gated, iters);
    struct ibv_send_wr *bad;
    ibv_post_send(&qp_b, &signaled_wr, &bad); /* B keeps the link held from here on */
    double held_pair = pairs(&qp_a, &cq_gated, iters);
    double gated_post = posts(&qp_a, &signaled_wr, iters);
    double unsignaled = posts(&qp_a, &unsignaled_wr, iters);
    double gated_poll = polls_empty(&cq_gated, iters);

    pid_t child = fork(); /* a lower level queues for the link this process holds */
    if (child == 0) {
        crux_pcie_acquire(crux_pcie_open(sem), 0, 0);
        _exit(0);
    }
    crux_pcie_t *p = crux_pcie_open(sem);
    struct crux_pcie_stats st;
    do
        crux_pcie_stats(p, 0, &st);
    while (st.waiters[0] == 0);
    double waiter_post = posts(&qp_a, &signaled_wr, iters);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);

    struct crux_gate_stats gs;
    crux_gate_stats(&gs);
    const struct crux_qps_record *rc = (const struct crux_qps_record *)(
        (const char *)records + CRUX_QPS_HEADER_SIZE) + 2;
    if (rc->qpn != qp_c.qp_num || rc->counters.bytes_posted != rc->counters.wrs_posted * 4096 ||
        rc->counters.wrs_posted < (uint64_t)iters) {
        fprintf(stderr, "bench_gate: the counted QP's record does not add up\n");
        return 1;
    }
    printf("base_post=%.2f counted_post=%.2f gated_post=%.2f unsignaled_post=%.2f "
           "waiter_post=%.2f base_pair=%.2f counted_pair=%.2f held_pair=%.2f pingpong_pair=%.2f "
           "base_poll_empty=%.2f counted_poll_empty=%.2f gated_poll_empty=%.2f acquires=%llu "
           "releases=%llu\n",
           base_post, counted_post, gated_post, unsignaled, waiter_post, base_pair, counted_pair,
           held_pair, pingpong, base_poll, counted_poll, gated_poll,
           (unsigned long long)gs.acquires, (unsigned long long)gs.releases);
    return 0;
}
