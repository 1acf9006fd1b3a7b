/*
 * rdma_stream - stream RDMA WRITEs over one RC QP pair between two local RDMA devices for a
 * given time and report the completed bytes as it goes: the traffic of one job for the PCIe
 * gate's rig test (tests/test_rdma_pcie.py).
 *
 * Verbs are loaded the way NCCL >= 2.30 loads them (verbs_loader.h): $NCCL_IBVERBS_LIB, else
 * the names, and dlvsym(handle, name, "IBVERBS_1.1"); ibv_post_send/ibv_poll_cq are verbs.h's inline
 * calls through the context's ops table, as in NCCL. It keeps --depth signaled WRITEs of
 * --size bytes in flight from --dev-a to --dev-b: every completion polled (one at a time) is
 * followed by one new post, so the QP never drains while it streams. SIGTERM ends the stream
 * early, the same way (drain, report, exit 0).
 *
 * usage: rdma_stream [--dev-a rxe0] [--dev-b rxe1] [--gid 1] [--seconds 5] [--size 65536]
 *                    [--depth 16] [--report-ms 20]
 * stdout, one JSON object a line, t = CLOCK_MONOTONIC seconds (comparable across processes):
 *   {"ready": true, "t": T}          connected, about to post
 *   {"t": T, "bytes": B}             every --report-ms, from a thread (also while a post waits)
 *   {"t": T, "bytes": B, "done": true}   after the last completion
 * Exit 0, or 1 with the reason on stderr.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DIE(...) do { fprintf(stderr, "rdma_stream: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

#include "verbs_loader.h"

static struct {
    struct ibv_device **(*get_device_list)(int *);
    const char *(*get_device_name)(struct ibv_device *);
    struct ibv_context *(*open_device)(struct ibv_device *);
    int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
    int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
} v;

struct side {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_mr *mr;
    struct ibv_qp *qp;
    union ibv_gid gid;
    enum ibv_mtu mtu;
    char *buf;
};

static _Atomic unsigned long long completed;
static volatile sig_atomic_t stop;
static long report_ms = 20;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void load_verbs(void)
{
    void *h = open_verbs();
    v.get_device_list = sym(h, "ibv_get_device_list");
    v.get_device_name = sym(h, "ibv_get_device_name");
    v.open_device = sym(h, "ibv_open_device");
    v.query_port = sym(h, "ibv_query_port");
    v.query_gid = sym(h, "ibv_query_gid");
    v.alloc_pd = sym(h, "ibv_alloc_pd");
    v.reg_mr = sym(h, "ibv_reg_mr");
    v.create_cq = sym(h, "ibv_create_cq");
    v.create_qp = sym(h, "ibv_create_qp");
    v.modify_qp = sym(h, "ibv_modify_qp");
}

static void side_open(struct side *s, const char *dev, int gid, size_t size, int depth)
{
    int n = 0;
    struct ibv_device **list = v.get_device_list(&n);
    for (int i = 0; list != NULL && i < n && s->ctx == NULL; i++)
        if (strcmp(v.get_device_name(list[i]), dev) == 0)
            s->ctx = v.open_device(list[i]);
    if (s->ctx == NULL)
        DIE("no RDMA device %s", dev);
    struct ibv_port_attr port;
    memset(&port, 0, sizeof port);
    if (v.query_port(s->ctx, 1, &port) != 0 || v.query_gid(s->ctx, 1, gid, &s->gid) != 0)
        DIE("%s: query port/gid %d failed", dev, gid);
    s->mtu = port.active_mtu;
    s->buf = calloc(1, size);
    if ((s->pd = v.alloc_pd(s->ctx)) == NULL || s->buf == NULL ||
        (s->mr = v.reg_mr(s->pd, s->buf, size, IBV_ACCESS_LOCAL_WRITE |
                          IBV_ACCESS_REMOTE_WRITE)) == NULL ||
        (s->cq = v.create_cq(s->ctx, depth * 2, NULL, NULL, 0)) == NULL)
        DIE("%s: pd/mr/cq setup failed", dev);
    struct ibv_qp_init_attr ia = {.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = (uint32_t)depth, .max_recv_wr = 1,
                                          .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                            .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
    if ((s->qp = v.create_qp(s->pd, &ia)) == NULL ||
        v.modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                    IBV_QP_ACCESS_FLAGS) != 0)
        DIE("%s: create/INIT QP failed", dev);
}

static void connect_qp(struct side *s, const struct side *peer, int gid)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR, .path_mtu = s->mtu < peer->mtu ? s->mtu : peer->mtu,
        .dest_qp_num = peer->qp->qp_num, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
        .ah_attr = {.is_global = 1, .port_num = 1,
                    .grh = {.dgid = peer->gid, .sgid_index = (uint8_t)gid, .hop_limit = 64}}};
    struct ibv_qp_attr r = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
                            .rnr_retry = 7, .max_rd_atomic = 1};
    if (v.modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0 ||
        v.modify_qp(s->qp, &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0)
        DIE("RTR/RTS failed");
}

static void post_write(struct side *s, const struct side *peer, size_t size)
{
    struct ibv_sge sge = {.addr = (uintptr_t)s->buf, .length = (uint32_t)size,
                          .lkey = s->mr->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED,
                             .wr.rdma = {.remote_addr = (uintptr_t)peer->buf,
                                         .rkey = peer->mr->rkey}};
    struct ibv_send_wr *bad = NULL;
    if (ibv_post_send(s->qp, &wr, &bad) != 0)
        DIE("post_send failed");
}

static void on_term(int sig)
{
    (void)sig;
    stop = 1;
}

static void *reporter(void *arg)
{
    (void)arg;
    for (;;) {
        usleep((useconds_t)report_ms * 1000);
        printf("{\"t\": %.6f, \"bytes\": %llu}\n", now(), atomic_load(&completed));
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int gid = (int)arg(argc, argv, "--gid", 1), depth = (int)arg(argc, argv, "--depth", 16);
    double seconds = (double)arg(argc, argv, "--seconds", 5);
    size_t size = (size_t)arg(argc, argv, "--size", 65536);
    report_ms = arg(argc, argv, "--report-ms", 20);
    struct side a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGTERM, on_term);
    load_verbs();
    side_open(&a, sarg(argc, argv, "--dev-a", "rxe0"), gid, size, depth);
    side_open(&b, sarg(argc, argv, "--dev-b", "rxe1"), gid, size, depth);
    connect_qp(&a, &b, gid);
    connect_qp(&b, &a, gid);
    double start = now(), end = start + seconds;
    printf("{\"ready\": true, \"t\": %.6f}\n", start);
    pthread_t th;
    pthread_create(&th, NULL, reporter, NULL);
    int inflight = 0;
    for (; inflight < depth; inflight++)
        post_write(&a, &b, size);
    double last = now();
    while (inflight > 0) {
        struct ibv_wc wc;
        int n = ibv_poll_cq(a.cq, 1, &wc);
        if (n < 0 || (n == 1 && wc.status != IBV_WC_SUCCESS))
            DIE("completion error: %s %d", n < 0 ? "poll" : "status", n < 0 ? n : (int)wc.status);
        double t = now();
        if (n == 0) {
            if (t - last > 30)
                DIE("no completion in 30 s");
            continue;
        }
        last = t;
        inflight--;
        atomic_fetch_add(&completed, size);
        if (t < end && !stop) { /* may wait here: the PCIe gate */
            post_write(&a, &b, size);
            inflight++;
            last = now();
        }
    }
    printf("{\"t\": %.6f, \"bytes\": %llu, \"done\": true}\n", now(), atomic_load(&completed));
    return 0;
}
