/*
 * rc_pair - connect RC QP pairs between two local RDMA devices and RDMA-WRITE both ways.
 *
 * The shim's acceptance program. Built twice from this source:
 *   rc_pair_nccl   loads verbs the way NCCL does (src/misc/ibvsymbols.cc), never linking
 *                  libibverbs: dlopen() a library, then dlvsym(handle, name, "IBVERBS_1.1") for
 *                  every verb NCCL requires and the two it takes at newer versions if present.
 *                  Which library, by NCCL generation (-DNCCL_LOADER=...):
 *                    229 (NCCL <= 2.29): "libibverbs.so", else "libibverbs.so.1", by name;
 *                    230 (NCCL >= 2.30, the default): $NCCL_IBVERBS_LIB first, then the names;
 *   rc_pair_direct linked against libibverbs (-DDIRECT_LINK), for LD_PRELOAD.
 * Like NCCL it sets grh.flow_label = 0 and its own traffic class (--tc) at RTR.
 *
 * usage: rc_pair --dev-a rxe0 --dev-b rxe1 [--gid 1] [--tc 0] [--pairs 1] [--writes 8]
 *                [--size 4096] [--gap-ms 0] [--keep 0]
 *        rc_pair --resolve   load the verbs only and print, as one JSON object, which file
 *                            each verb resolved from (dladdr): needs no RDMA device
 * --keep 1 leaves the QPs undestroyed at exit, so the shim's QP records stay live.
 * One JSON line per pair on stdout: both QPs' numbers and their address vector read back with
 * ibv_query_qp. Exit 0 when every write of every pair completed, else 1 (reason on stderr).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DIE(...) do { fprintf(stderr, "rc_pair: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

#include "verbs_loader.h"

static struct {
    struct ibv_device **(*get_device_list)(int *);
    void (*free_device_list)(struct ibv_device **);
    const char *(*get_device_name)(struct ibv_device *);
    struct ibv_context *(*open_device)(struct ibv_device *);
    int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
    int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
    int (*dereg_mr)(struct ibv_mr *);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
    int (*destroy_cq)(struct ibv_cq *);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
    int (*query_qp)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *);
    int (*destroy_qp)(struct ibv_qp *);
} v;

#ifdef DIRECT_LINK
static void load_verbs(void)
{
    v.get_device_list = ibv_get_device_list;
    v.free_device_list = ibv_free_device_list;
    v.get_device_name = ibv_get_device_name;
    v.open_device = ibv_open_device;
    v.query_port = (void *)&ibv_query_port;
    v.query_gid = ibv_query_gid;
    v.alloc_pd = ibv_alloc_pd;
    v.reg_mr = (void *)&ibv_reg_mr;
    v.dereg_mr = ibv_dereg_mr;
    v.create_cq = ibv_create_cq;
    v.destroy_cq = ibv_destroy_cq;
    v.create_qp = ibv_create_qp;
    v.modify_qp = ibv_modify_qp;
    v.query_qp = ibv_query_qp;
    v.destroy_qp = ibv_destroy_qp;
}
#else
/* Every symbol NCCL requires, so a wrapper that forgets one fails here as it would in NCCL. */
static const char *const nccl_symbols[] = {
    "ibv_get_device_list", "ibv_free_device_list", "ibv_get_device_name", "ibv_open_device",
    "ibv_close_device", "ibv_get_async_event", "ibv_ack_async_event", "ibv_query_device",
    "ibv_query_port", "ibv_query_gid", "ibv_query_qp", "ibv_alloc_pd", "ibv_dealloc_pd",
    "ibv_reg_mr", "ibv_dereg_mr", "ibv_create_cq", "ibv_destroy_cq", "ibv_create_qp",
    "ibv_modify_qp", "ibv_destroy_qp", "ibv_fork_init", "ibv_event_type_str",
};

/* Verbs NCCL takes at a newer version when the library has them, silently otherwise. */
static const char *const nccl_optional[][2] = {
    {"ibv_reg_mr_iova2", "IBVERBS_1.8"}, {"ibv_reg_dmabuf_mr", "IBVERBS_1.12"},
};

static void print_file(const char *name, void *fn)
{
    Dl_info info;
    const char *file = fn != NULL && dladdr(fn, &info) != 0 ? info.dli_fname : "";
    printf("\"%s\": \"%s\"", name, file);
}

/* --resolve: {"nccl_loader": N, "verbs": {name: file, ...}} for every verb NCCL resolves. */
static int resolve_only(void)
{
    void *h = open_verbs();
    printf("{\"nccl_loader\": %d, \"verbs\": {", NCCL_LOADER);
    for (size_t i = 0; i < sizeof nccl_symbols / sizeof *nccl_symbols; i++) {
        print_file(nccl_symbols[i], sym(h, nccl_symbols[i]));
        printf(", ");
    }
    for (size_t i = 0; i < sizeof nccl_optional / sizeof *nccl_optional; i++) {
        print_file(nccl_optional[i][0], dlvsym(h, nccl_optional[i][0], nccl_optional[i][1]));
        printf(i + 1 < sizeof nccl_optional / sizeof *nccl_optional ? ", " : "");
    }
    printf("}}\n");
    return 0;
}

static void load_verbs(void)
{
    void *h = open_verbs();
    for (size_t i = 0; i < sizeof nccl_symbols / sizeof *nccl_symbols; i++)
        sym(h, nccl_symbols[i]);
    v.get_device_list = sym(h, "ibv_get_device_list");
    v.free_device_list = sym(h, "ibv_free_device_list");
    v.get_device_name = sym(h, "ibv_get_device_name");
    v.open_device = sym(h, "ibv_open_device");
    v.query_port = sym(h, "ibv_query_port");
    v.query_gid = sym(h, "ibv_query_gid");
    v.alloc_pd = sym(h, "ibv_alloc_pd");
    v.reg_mr = sym(h, "ibv_reg_mr");
    v.dereg_mr = sym(h, "ibv_dereg_mr");
    v.create_cq = sym(h, "ibv_create_cq");
    v.destroy_cq = sym(h, "ibv_destroy_cq");
    v.create_qp = sym(h, "ibv_create_qp");
    v.modify_qp = sym(h, "ibv_modify_qp");
    v.query_qp = sym(h, "ibv_query_qp");
    v.destroy_qp = sym(h, "ibv_destroy_qp");
}
#endif

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

static struct ibv_context *open_named(const char *name)
{
    int n = 0;
    struct ibv_device **list = v.get_device_list(&n);
    struct ibv_context *ctx = NULL;
    for (int i = 0; list != NULL && i < n && ctx == NULL; i++)
        if (strcmp(v.get_device_name(list[i]), name) == 0)
            ctx = v.open_device(list[i]);
    if (list != NULL)
        v.free_device_list(list);
    if (ctx == NULL)
        DIE("no RDMA device %s", name);
    return ctx;
}

static void side_open(struct side *s, const char *dev, int gid_index, size_t size)
{
    struct ibv_port_attr port; /* the exported query_port fills its compat prefix */
    memset(&port, 0, sizeof port);
    memset(s, 0, sizeof *s);
    s->ctx = open_named(dev);
    if (v.query_port(s->ctx, 1, &port) != 0 || v.query_gid(s->ctx, 1, gid_index, &s->gid) != 0)
        DIE("%s: query port/gid %d failed", dev, gid_index);
    s->mtu = port.active_mtu;
    s->buf = calloc(1, size);
    if ((s->pd = v.alloc_pd(s->ctx)) == NULL || s->buf == NULL ||
        (s->mr = v.reg_mr(s->pd, s->buf, size, IBV_ACCESS_LOCAL_WRITE |
                          IBV_ACCESS_REMOTE_WRITE)) == NULL ||
        (s->cq = v.create_cq(s->ctx, 256, NULL, NULL, 0)) == NULL)
        DIE("%s: pd/mr/cq setup failed", dev);
}

static void qp_create(struct side *s)
{
    struct ibv_qp_init_attr ia = {.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 128, .max_recv_wr = 1,
                                          .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
                            .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
    if ((s->qp = v.create_qp(s->pd, &ia)) == NULL ||
        v.modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                    IBV_QP_ACCESS_FLAGS) != 0)
        DIE("create/INIT QP failed");
}

static void qp_connect(struct side *s, const struct side *peer, int gid_index, int tc)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR, .path_mtu = s->mtu < peer->mtu ? s->mtu : peer->mtu,
        .dest_qp_num = peer->qp->qp_num, .rq_psn = 0, .max_dest_rd_atomic = 1,
        .min_rnr_timer = 12,
        .ah_attr = {.is_global = 1, .port_num = 1,
                    .grh = {.dgid = peer->gid, .flow_label = 0, .sgid_index = (uint8_t)gid_index,
                            .hop_limit = 64, .traffic_class = (uint8_t)tc}}};
    if (v.modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0)
        DIE("RTR failed");
    struct ibv_qp_attr r = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
                            .rnr_retry = 7, .sq_psn = 0, .max_rd_atomic = 1};
    if (v.modify_qp(s->qp, &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0)
        DIE("RTS failed");
}

static void post_writes(struct side *s, const struct side *peer, int writes, size_t size)
{
    for (int i = 0; i < writes; i++) {
        struct ibv_sge sge = {.addr = (uintptr_t)s->buf, .length = (uint32_t)size,
                              .lkey = s->mr->lkey};
        struct ibv_send_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1,
                                 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
                                 .wr.rdma = {.remote_addr = (uintptr_t)peer->buf,
                                             .rkey = peer->mr->rkey}};
        struct ibv_send_wr *bad = NULL;
        if (ibv_post_send(s->qp, &wr, &bad) != 0)
            DIE("post_send failed");
    }
}

static int await(struct side *s, int writes)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int done = 0; done < writes;) {
        struct ibv_wc wc;
        int n = ibv_poll_cq(s->cq, 1, &wc);
        if (n < 0 || (n == 1 && wc.status != IBV_WC_SUCCESS)) {
            fprintf(stderr, "rc_pair: completion error: %s %d\n", n < 0 ? "poll" : "status",
                    n < 0 ? n : (int)wc.status);
            return -1;
        }
        done += n;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 30) {
            fprintf(stderr, "rc_pair: %d of %d writes completed in 30 s\n", done, writes);
            return -1;
        }
    }
    return 0;
}

static void print_qp(const char *name, struct ibv_qp *qp)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    if (v.query_qp(qp, &a, IBV_QP_AV, &ia) != 0)
        DIE("query_qp failed");
    printf("\"%s\": {\"qpn\": %u, \"flow_label\": %u, \"traffic_class\": %u}", name,
           qp->qp_num, a.ah_attr.grh.flow_label, a.ah_attr.grh.traffic_class);
}

int main(int argc, char **argv)
{
    int gid = (int)arg(argc, argv, "--gid", 1), tc = (int)arg(argc, argv, "--tc", 0);
    int pairs = (int)arg(argc, argv, "--pairs", 1), writes = (int)arg(argc, argv, "--writes", 8);
    size_t size = (size_t)arg(argc, argv, "--size", 4096);
    long gap_ms = arg(argc, argv, "--gap-ms", 0);
    int keep = (int)arg(argc, argv, "--keep", 0);
    struct side a, b;
    int failed = 0;

    setvbuf(stdout, NULL, _IOLBF, 0);
#ifndef DIRECT_LINK
    if (argc > 1 && strcmp(argv[1], "--resolve") == 0)
        return resolve_only();
#endif
    load_verbs();
    side_open(&a, sarg(argc, argv, "--dev-a", "rxe0"), gid, size);
    side_open(&b, sarg(argc, argv, "--dev-b", "rxe1"), gid, size);
    for (int p = 0; p < pairs; p++) {
        qp_create(&a);
        qp_create(&b);
        qp_connect(&a, &b, gid, tc);
        qp_connect(&b, &a, gid, tc);
        post_writes(&a, &b, writes, size);
        post_writes(&b, &a, writes, size);
        int ok = await(&a, writes) == 0 && await(&b, writes) == 0;
        printf("{\"pair\": %d, \"ok\": %s, ", p, ok ? "true" : "false");
        print_qp("a", a.qp);
        printf(", ");
        print_qp("b", b.qp);
        printf("}\n");
        failed |= !ok;
        if (!keep) {
            v.destroy_qp(a.qp);
            v.destroy_qp(b.qp);
        }
        if (gap_ms > 0 && p + 1 < pairs)
            usleep((useconds_t)gap_ms * 1000);
    }
    return failed;
}
