/*
 * gate_drive - drive the wrapper's PCIe gate (shim/crux_gate.c) without a NIC: a fake device
 * context whose ops table's post_send accepts every WR and whose poll_cq returns the
 * completions a command queued. The gate swaps that ops table as it would a provider's, so
 * ibv_post_send/ibv_poll_cq (inline in verbs.h) reach the real trampolines, the real
 * semaphore file and the real map file. tests/test_pcie_gate.py runs several at once.
 *
 * usage: gate_drive PCIE LINKS LEVEL DEVICE [QUANTUM_US [MAX_WAIT_MS]]
 *   LEVEL -1: the job has no level. Commands on stdin, one answer line each on stdout:
 *   qp N [all]     create QP N (all: sq_sig_all)           -> ok
 *   post N K [U]   post K signaled (+U unsignaled) WRs      -> ok      (may block: the gate)
 *   fail N K       post K signaled WRs the provider refuses -> ok
 *   done N K       K send completions of QP N, polled       -> ok
 *   err N K | recv N K   K error / K receive completions    -> ok
 *   destroy N      the wrapper's ibv_destroy_qp hook         -> ok
 *   hold L         take semaphore link L outside the gate   -> ok <rc>
 *   stats          -> {json of crux_gate_stats}
 *   parse FILE     crux_links_load -> ok LINKS N | missing | bad REASON
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crux_gate.h"
#include "crux_pcie.h"

#define MAXQ 64
#define CQ_DEPTH 4096

static struct ibv_device dev;
static struct ibv_context ctx;
static struct ibv_cq cq;
static struct ibv_qp *qps[MAXQ];
static struct ibv_wc pending[CQ_DEPTH];
static int npending, refuse, level;

static int fake_post(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    (void)qp;
    if (refuse) {
        *bad = wr;
        return EINVAL;
    }
    return 0;
}

static int fake_poll(struct ibv_cq *c, int num, struct ibv_wc *wc)
{
    (void)c;
    int n = npending < num ? npending : num;
    memcpy(wc, pending, (size_t)n * sizeof *wc);
    memmove(pending, pending + n, (size_t)(npending - n) * sizeof *wc);
    npending -= n;
    return n;
}

static int job_level(void)
{
    return level;
}

static void complete(unsigned n, int k, enum ibv_wc_opcode op, enum ibv_wc_status status)
{
    for (int i = 0; i < k && npending < CQ_DEPTH; i++)
        pending[npending++] = (struct ibv_wc){.qp_num = qps[n]->qp_num, .opcode = op,
                                              .status = status};
    struct ibv_wc wc[16];
    while (ibv_poll_cq(&cq, 16, wc) > 0)
        ;
}

static void post(unsigned n, int k, int unsignaled)
{
    struct ibv_send_wr wr[128];
    int total = k + unsignaled < 128 ? k + unsignaled : 128;
    memset(wr, 0, sizeof wr);
    for (int i = 0; i < total; i++) {
        wr[i].opcode = IBV_WR_RDMA_WRITE;
        wr[i].send_flags = i < unsignaled ? 0 : IBV_SEND_SIGNALED;
        wr[i].next = i + 1 < total ? &wr[i + 1] : NULL;
    }
    struct ibv_send_wr *bad = NULL;
    ibv_post_send(qps[n], wr, &bad);
}

static void stats(void)
{
    struct crux_gate_stats s;
    crux_gate_stats(&s);
    printf("{\"acquires\": %llu, \"waits\": %llu, \"yields\": %llu, \"releases\": %llu, "
           "\"ungated\": [%llu, %llu, %llu, %llu], \"contexts\": {",
           (unsigned long long)s.acquires, (unsigned long long)s.waits,
           (unsigned long long)s.yields, (unsigned long long)s.releases,
           (unsigned long long)s.ungated[0], (unsigned long long)s.ungated[1],
           (unsigned long long)s.ungated[2], (unsigned long long)s.ungated[3]);
    for (int i = 0; i < CRUX_GATE_REASONS; i++)
        printf("%s\"%s\": %llu", i ? ", " : "", crux_gate_reason_names[i],
               (unsigned long long)s.contexts[i]);
    printf("}}\n");
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: gate_drive PCIE LINKS LEVEL DEVICE [QUANTUM_US [MAX_WAIT_MS]]\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    level = atoi(argv[3]);
    snprintf(dev.name, sizeof dev.name, "%s", argv[4]);
    ctx.device = &dev;
    ctx.ops.post_send = fake_post;
    ctx.ops.poll_cq = fake_poll;
    cq.context = &ctx;
    long wait_ms = argc > 6 ? atol(argv[6]) : 30000;
    struct crux_gate_config cfg = {
        .pcie_path = argv[1], .links_path = argv[2], .job_level = job_level,
        .quantum_ns = argc > 5 ? strtoull(argv[5], NULL, 10) * 1000 : CRUX_GATE_QUANTUM_NS,
        .max_wait_ns = wait_ms * 1000000LL, .log = 1,
    };
    crux_gate_configure(&cfg);
    crux_pcie_t *sem = crux_pcie_open(argv[1]);
    char line[4200], arg[4096], err[200];
    unsigned n;
    int k, u;
    while (fgets(line, sizeof line, stdin) != NULL) {
        if (sscanf(line, "qp %u", &n) == 1 && n < MAXQ) {
            struct ibv_qp_init_attr ia = {.send_cq = &cq, .recv_cq = &cq,
                                          .sq_sig_all = strstr(line, "all") != NULL};
            qps[n] = calloc(1, sizeof *qps[n]);
            qps[n]->context = &ctx;
            qps[n]->qp_num = 100 + n;
            crux_gate_qp_created(qps[n], &ia);
            puts("ok");
        } else if (sscanf(line, "post %u %d %d", &n, &k, &u) >= 2 && n < MAXQ && qps[n]) {
            post(n, k, sscanf(line, "post %u %d %d", &n, &k, &u) == 3 ? u : 0);
            puts("ok");
        } else if (sscanf(line, "fail %u %d", &n, &k) == 2 && n < MAXQ && qps[n]) {
            refuse = 1;
            post(n, k, 0);
            refuse = 0;
            puts("ok");
        } else if (sscanf(line, "done %u %d", &n, &k) == 2 && n < MAXQ && qps[n]) {
            complete(n, k, IBV_WC_RDMA_WRITE, IBV_WC_SUCCESS);
            puts("ok");
        } else if (sscanf(line, "err %u %d", &n, &k) == 2 && n < MAXQ && qps[n]) {
            complete(n, k, IBV_WC_RECV, IBV_WC_WR_FLUSH_ERR); /* opcode undefined on errors */
            puts("ok");
        } else if (sscanf(line, "recv %u %d", &n, &k) == 2 && n < MAXQ && qps[n]) {
            complete(n, k, IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_SUCCESS);
            puts("ok");
        } else if (sscanf(line, "destroy %u", &n) == 1 && n < MAXQ && qps[n]) {
            crux_gate_qp_destroyed(qps[n]);
            puts("ok");
        } else if (sscanf(line, "hold %u", &n) == 1) {
            printf("ok %d\n", crux_pcie_acquire(sem, n, 0));
        } else if (strncmp(line, "stats", 5) == 0) {
            stats();
        } else if (sscanf(line, "parse %4095s", arg) == 1) {
            static struct crux_links m;
            int rc = crux_links_load(arg, &m, err, sizeof err);
            if (rc == 0)
                printf("ok %u %u\n", m.links, m.n);
            else if (rc == -ENOENT)
                puts("missing");
            else
                printf("bad %s\n", err);
        } else {
            printf("? %s", line);
        }
    }
    return 0;
}
