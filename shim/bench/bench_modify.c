/*
 * bench_modify - time ibv_modify_qp(INIT->RTR, with IBV_QP_AV) on a real RDMA device, the call
 * the shim intercepts. Run it plain and with LD_PRELOAD=libcrux_ibverbs.so: the difference is
 * the shim's added cost. bench/shim.py drives it (inside the soft-RoCE VM where the host has no
 * RDMA).
 *
 * usage: bench_modify DEVICE GID_INDEX ITERS
 * Cycles one RC QP RESET -> INIT -> RTR toward its own GID and times only the RTR call.
 * Prints: iters=N rtr_ns_median=X rtr_ns_mean=Y
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: bench_modify DEVICE GID_INDEX ITERS\n");
        return 2;
    }
    int n = 0, gid_index = atoi(argv[2]), iters = atoi(argv[3]);
    struct ibv_device **list = ibv_get_device_list(&n);
    struct ibv_context *ctx = NULL;
    for (int i = 0; list && i < n && !ctx; i++)
        if (strcmp(ibv_get_device_name(list[i]), argv[1]) == 0)
            ctx = ibv_open_device(list[i]);
    union ibv_gid gid;
    struct ibv_port_attr port;
    if (!ctx || ibv_query_gid(ctx, 1, gid_index, &gid) || ibv_query_port(ctx, 1, &port)) {
        fprintf(stderr, "bench_modify: cannot open %s\n", argv[1]);
        return 1;
    }
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 1, .max_recv_wr = 1,
                                          .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *qp = pd && cq ? ibv_create_qp(pd, &ia) : NULL;
    double *t = calloc((size_t)iters, sizeof *t);
    if (!qp || !t) {
        fprintf(stderr, "bench_modify: QP setup failed\n");
        return 1;
    }
    for (int i = 0; i < iters; i++) {
        struct ibv_qp_attr r = {.qp_state = IBV_QPS_RESET};
        struct ibv_qp_attr in = {.qp_state = IBV_QPS_INIT, .port_num = 1};
        struct ibv_qp_attr rtr = {
            .qp_state = IBV_QPS_RTR, .path_mtu = port.active_mtu, .dest_qp_num = qp->qp_num,
            .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
            .ah_attr = {.is_global = 1, .port_num = 1,
                        .grh = {.dgid = gid, .sgid_index = (uint8_t)gid_index, .hop_limit = 64}}};
        if (ibv_modify_qp(qp, &r, IBV_QP_STATE) ||
            ibv_modify_qp(qp, &in, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                          IBV_QP_ACCESS_FLAGS)) {
            fprintf(stderr, "bench_modify: RESET/INIT failed\n");
            return 1;
        }
        double t0 = now();
        int rc = ibv_modify_qp(qp, &rtr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                               IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                               IBV_QP_MIN_RNR_TIMER);
        t[i] = now() - t0;
        if (rc) {
            fprintf(stderr, "bench_modify: RTR failed: %d\n", rc);
            return 1;
        }
    }
    double sum = 0;
    for (int i = 0; i < iters; i++)
        sum += t[i];
    qsort(t, (size_t)iters, sizeof *t, cmp);
    printf("iters=%d rtr_ns_median=%.0f rtr_ns_mean=%.0f\n", iters, t[iters / 2], sum / iters);
    return 0;
}
