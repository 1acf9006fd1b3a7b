/*
 * gate_drive - drive the wrapper's PCIe gate (shim/crux_gate.c) without a NIC: a fake device
 * context whose ops table's post_send accepts every WR and whose poll_cq returns the
 * completions a command queued. The gate swaps that ops table as it would a provider's, so
 * ibv_post_send/ibv_poll_cq (inline in verbs.h) reach the real trampolines, the real
 * semaphore file and the real map file. tests/test_pcie_gate.py runs several at once.
 *
 * usage: gate_drive PCIE LINKS LEVEL DEVICE [QUANTUM_US [MAX_WAIT_MS [RECORDS]]]
 *   LEVEL -1: the job has no level. RECORDS: count traffic (the wrapper with a job id) into a
 *   QP records file created at that path, as the wrapper's does at its first connect.
 *   Commands on stdin, one answer line each on stdout:
 *   qp N [all]     create QP N (all: sq_sig_all); with RECORDS, also connect it: its record
 *                  is written and counted into, as the wrapper does at connect -> ok
 *   post N K [U [B [OP]]]  post K signaled (+U unsignaled) WRs in one chain, each of B bytes
 *                  in two SGEs, opcode OP (write, write-imm, send, send-imm, read, atomic;
 *                  default write) -> ok (may block: the gate)
 *   fail N K [B]   post K signaled WRs of B bytes; the provider refuses them all -> ok
 *   partial N K B  the same, but the provider accepts the first WR and refuses the rest -> ok
 *   threads T K B  T threads each post K WRs of B bytes, one at a time, on QP 0 and on QP
 *                  1+t (create them first) -> ok
 *   done N K       K send completions of QP N, polled       -> ok
 *   err N K | recv N K   K error / K receive completions    -> ok
 *   destroy N      the wrapper's ibv_destroy_qp hooks (with RECORDS: its record freed) -> ok
 *   ops            -> ok swapped | ok provider (whose post_send the context has)
 *   hold L         take semaphore link L outside the gate   -> ok <rc>
 *   stats          -> {json of crux_gate_stats}
 *   parse FILE     crux_links_load -> ok LINKS N | missing | bad REASON
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "crux_gate.h"
#include "crux_pcie.h"
#include "crux_shim.h"

#define MAXQ 64
#define CQ_DEPTH 4096

static struct ibv_device dev;
static struct ibv_context ctx;
static struct ibv_cq cq;
static struct ibv_qp *qps[MAXQ];
static struct ibv_wc pending[CQ_DEPTH];
static int npending, refuse, level;
static void *records; /* the QP records file, mapped; NULL: not counting */
static char *buffer;  /* what the SGEs point at: never read (the fake provider sends nothing) */

static int fake_post(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    (void)qp;
    if (refuse) { /* 1: every WR refused; 2: the first accepted, the rest refused (a queue
                     that fills up) */
        *bad = refuse == 2 && wr->next != NULL ? wr->next : wr;
        return ENOMEM;
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

static enum ibv_wr_opcode opcode(const char *name)
{
    static const struct {
        const char *name;
        enum ibv_wr_opcode op;
    } ops[] = {{"write", IBV_WR_RDMA_WRITE}, {"write-imm", IBV_WR_RDMA_WRITE_WITH_IMM},
               {"send", IBV_WR_SEND}, {"send-imm", IBV_WR_SEND_WITH_IMM},
               {"read", IBV_WR_RDMA_READ}, {"atomic", IBV_WR_ATOMIC_FETCH_AND_ADD}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strcmp(name, ops[i].name) == 0)
            return ops[i].op;
    return IBV_WR_RDMA_WRITE;
}

static void post(struct ibv_qp *qp, int k, int unsignaled, unsigned bytes, enum ibv_wr_opcode op)
{
    struct ibv_send_wr wr[128];
    struct ibv_sge sge[128][2];
    int total = k + unsignaled < 128 ? k + unsignaled : 128;
    memset(wr, 0, sizeof wr);
    for (int i = 0; i < total; i++) {
        sge[i][0] = (struct ibv_sge){.addr = (uintptr_t)buffer, .length = bytes / 2};
        sge[i][1] = (struct ibv_sge){.addr = (uintptr_t)buffer, .length = bytes - bytes / 2};
        wr[i].opcode = op;
        wr[i].sg_list = sge[i];
        wr[i].num_sge = bytes > 0 ? 2 : 0;
        wr[i].send_flags = i < unsignaled ? 0 : IBV_SEND_SIGNALED;
        wr[i].next = i + 1 < total ? &wr[i + 1] : NULL;
    }
    struct ibv_send_wr *bad = NULL;
    ibv_post_send(qp, wr, &bad);
}

static struct {
    int k;
    unsigned bytes;
    struct ibv_qp *own;
} work[MAXQ];

static void *poster(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (int i = 0; i < work[t].k; i++) {
        post(qps[0], 1, 0, work[t].bytes, IBV_WR_RDMA_WRITE);
        post(work[t].own, 1, 0, work[t].bytes, IBV_WR_SEND);
    }
    return NULL;
}

static void threads(int n, int k, unsigned bytes)
{
    pthread_t th[MAXQ];
    for (int t = 0; t < n; t++) {
        work[t].k = k;
        work[t].bytes = bytes;
        work[t].own = qps[1 + t];
        pthread_create(&th[t], NULL, poster, (void *)(intptr_t)t);
    }
    for (int t = 0; t < n; t++)
        pthread_join(th[t], NULL);
}

/* The wrapper's connect: the QP's record, and its counters handed to the gate. */
static void connect_qp(struct ibv_qp *qp)
{
    struct crux_qps_record r = {.qpn = qp->qp_num, .dest_qpn = qp->qp_num + 1000,
                                .outcome = CRUX_OUT_NO_ENTRY, .port_num = 1};
    memcpy(r.device, dev.name, strnlen(dev.name, sizeof r.device - 1)); /* as the wrapper */
    crux_qps_count(records, r.outcome);
    crux_gate_qp_counters(qp, crux_qps_add(records, &r));
}

static void *map_records(const char *path)
{
    size_t len = CRUX_QPS_HEADER_SIZE + CRUX_QPS_CAPACITY * CRUX_QPS_RECORD_SIZE;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    void *p = fd < 0 || ftruncate(fd, (off_t)len) != 0
                  ? MAP_FAILED
                  : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        perror(path);
        exit(2);
    }
    close(fd);
    crux_qps_init(p, len, (uint32_t)getpid(), "drive");
    return p;
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
        fprintf(stderr, "usage: gate_drive PCIE LINKS LEVEL DEVICE [QUANTUM_US [MAX_WAIT_MS "
                        "[RECORDS]]]\n");
        return 2;
    }
    buffer = calloc(1, 1 << 20);
    if (argc > 7)
        records = map_records(argv[7]);
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
        .max_wait_ns = wait_ms * 1000000LL, .log = 1, .count = records != NULL,
    };
    crux_gate_configure(&cfg);
    crux_pcie_t *sem = crux_pcie_open(argv[1]);
    char line[4200], arg[4096], err[200], op[16];
    unsigned n, b;
    int k, u;
    while (fgets(line, sizeof line, stdin) != NULL) {
        if (sscanf(line, "qp %u", &n) == 1 && n < MAXQ) {
            struct ibv_qp_init_attr ia = {.send_cq = &cq, .recv_cq = &cq,
                                          .sq_sig_all = strstr(line, "all") != NULL};
            qps[n] = calloc(1, sizeof *qps[n]);
            qps[n]->context = &ctx;
            qps[n]->qp_num = 100 + n;
            crux_gate_qp_created(qps[n], &ia);
            if (records != NULL)
                connect_qp(qps[n]);
            puts("ok");
        } else if (sscanf(line, "post %u %d", &n, &k) == 2 && n < MAXQ && qps[n]) {
            u = 0, b = 0;
            strcpy(op, "write");
            sscanf(line, "post %u %d %d %u %15s", &n, &k, &u, &b, op);
            post(qps[n], k, u, b, opcode(op));
            puts("ok");
        } else if (sscanf(line, "%15s %u %d", op, &n, &k) == 3 && n < MAXQ && qps[n] &&
                   (strcmp(op, "fail") == 0 || strcmp(op, "partial") == 0)) {
            b = 0;
            sscanf(line, "%*s %u %d %u", &n, &k, &b);
            refuse = op[0] == 'f' ? 1 : 2;
            post(qps[n], k, 0, b, IBV_WR_RDMA_WRITE);
            refuse = 0;
            puts("ok");
        } else if (sscanf(line, "threads %d %d %u", &u, &k, &b) == 3 && u > 0 && u < MAXQ - 1) {
            threads(u, k, b);
            puts("ok");
        } else if (strncmp(line, "ops", 3) == 0) {
            puts(ctx.ops.post_send == fake_post ? "ok provider" : "ok swapped");
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
            if (records != NULL)
                crux_qps_remove(records, qps[n]->qp_num, dev.name);
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
