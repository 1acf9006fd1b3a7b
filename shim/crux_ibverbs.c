/*
 * crux_ibverbs.c - libcrux_ibverbs.so, a wrapper libibverbs for training jobs.
 *
 * It defines ibv_modify_qp, ibv_destroy_qp, ibv_create_qp and ibv_close_device at version
 * IBVERBS_1.1 and links against the real libibverbs.so.1, so:
 *   - NCCL_IBVERBS_LIB=/path/libcrux_ibverbs.so: NCCL dlopen()s this library and resolves every
 *     verb with dlvsym(handle, name, "IBVERBS_1.1"). A handle lookup searches the library and
 *     then its dependencies, so those four come from here and every other verb straight from
 *     the real libibverbs: the calls we do not change cost nothing extra.
 *   - LD_PRELOAD=/path/libcrux_ibverbs.so: a program linked against libibverbs binds its
 *     ibv_modify_qp@IBVERBS_1.1 reference to the first definition in load order, ours.
 * We reach the real functions through the real library's own handle, whose lookup scope (the
 * library and its dependencies) cannot contain us.
 *
 * On a connect (ibv_modify_qp with IBV_QP_AV, i.e. INIT->RTR) the decision for ($CRUX_JOB_ID,
 * remote GID) from the decision table sets the GRH flow label (-> RoCEv2 UDP source port) and
 * traffic class (-> DSCP) of a copy of the caller's attributes; the caller's struct is never
 * written. The QP is recorded for the agent (crux_qps.h). Fail open: anything missing or wrong
 * leaves the call exactly as the program made it, and a counter says why.
 *
 * Live re-path (crux_repath.h): on mlx5, a QP whose decided port moves after connect is moved
 * with mlx5dv_modify_qp_udp_sport by a thread of the job; elsewhere it stays pending.
 *
 * PCIe gating (crux_gate.h): ibv_create_qp hands each QP to the gate, which swaps the context's
 * post_send/poll_cq for trampolines holding the job's PCIe link semaphore while it has RDMA
 * work outstanding. With a job id the trampolines go in on every context, gated or not, and
 * count each recorded QP's bytes, WRs and busy time into its record (per-job attribution).
 *
 * Environment: CRUX_JOB_ID, CRUX_DECISION_TABLE (default /run/crux/decisions), CRUX_QP_DIR
 * (default: the table's directory + /qps), CRUX_SHIM_LOG=1 (one stderr line per connect),
 * CRUX_PCIE and CRUX_PCIE_LINKS (default: the table's directory + /pcie, /pcie-links),
 * CRUX_QP_COUNTERS=off (no trampolines for counting: a job that is not gated is then left with
 * the provider's post_send/poll_cq).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crux_recfile.h"
#include "crux_gate.h"
#include "crux_repath.h"
#include "crux_shim.h"
#include "crux_tablemap.h"

#define VERBS_VERSION "IBVERBS_1.1"
#define QPS_LEN (CRUX_QPS_HEADER_SIZE + CRUX_QPS_CAPACITY * CRUX_QPS_RECORD_SIZE)

typedef int (*modify_fn)(struct ibv_qp *, struct ibv_qp_attr *, int);
typedef int (*destroy_fn)(struct ibv_qp *);
typedef struct ibv_qp *(*create_fn)(struct ibv_pd *, struct ibv_qp_init_attr *);
typedef int (*close_fn)(struct ibv_context *);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static modify_fn real_modify;
static destroy_fn real_destroy;
static create_fn real_create;
static close_fn real_close;

/* Everything below is guarded by `lock`: connects are rare (setup time), so one uncontended
 * mutex is cheaper than being clever. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    struct crux_tablemap map; /* the decision table (crux_tablemap.h) */
    void *qps;             /* this process's records, NULL until the first connect */
    pid_t qps_pid;         /* who created them: a forked child makes its own */
    int qps_fd;            /* their file, kept open: it holds the lock (crux_recfile.h) */
    dev_t qps_dev;         /* and what it is, to know it in a child by */
    ino_t qps_ino;
    int qps_failed;
    int log;
    char job[CRUX_JOB_ID_LEN];
    char table_path[4096];
    char qps_dir[4096];
} st;

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : dflt;
}

static int job_level(void);
static int decided_sport(const uint8_t dgid[16]);
static void repathed(struct ibv_qp *qp, uint16_t sport);

static void init_once(void)
{
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (h == NULL)
        h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h != NULL) {
        real_modify = (modify_fn)dlvsym(h, "ibv_modify_qp", VERBS_VERSION);
        real_destroy = (destroy_fn)dlvsym(h, "ibv_destroy_qp", VERBS_VERSION);
        real_create = (create_fn)dlvsym(h, "ibv_create_qp", VERBS_VERSION);
        real_close = (close_fn)dlvsym(h, "ibv_close_device", VERBS_VERSION);
    }
    const char *job = env_or("CRUX_JOB_ID", "");
    if (strlen(job) < sizeof st.job) /* a longer id cannot be in the table: NO_JOB */
        strcpy(st.job, job);
    snprintf(st.table_path, sizeof st.table_path, "%s",
             env_or("CRUX_DECISION_TABLE", CRUX_TABLE_DEFAULT_PATH));
    static char table_dir[4096];
    const char *slash = strrchr(st.table_path, '/');
    snprintf(table_dir, sizeof table_dir, "%.*s", slash == NULL ? 1 : (int)(slash - st.table_path),
             slash == NULL ? "." : st.table_path);
    snprintf(st.qps_dir, sizeof st.qps_dir, "%s", env_or("CRUX_QP_DIR", ""));
    if (st.qps_dir[0] == '\0')
        snprintf(st.qps_dir, sizeof st.qps_dir, "%.4000s/qps", table_dir);
    st.log = env_or("CRUX_SHIM_LOG", "0")[0] == '1';
    int count = st.job[0] != '\0' && strcmp(env_or("CRUX_QP_COUNTERS", "on"), "off") != 0;
    crux_gate_configure_env(table_dir, job_level, st.log, count);
    static const struct crux_repath_hooks hooks = {decided_sport, repathed};
    crux_repath_configure(&hooks, 1000, st.log);
}

static uint64_t now_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The gate's level: the job-wide entry's, -1 without one (the job is then not gated). */
static int job_level(void)
{
    struct crux_table_entry e;
    pthread_mutex_lock(&lock);
    crux_tablemap_refresh(&st.map, st.table_path);
    int lv = st.map.missing ? -1 : crux_table_lookup(st.map.table, st.map.len, st.job, NULL, &e);
    pthread_mutex_unlock(&lock);
    return lv == 0 ? e.level : -1;
}

/* For the re-path thread: the decided port toward dgid now (-1: no table or no decision). */
static int decided_sport(const uint8_t dgid[16])
{
    struct crux_table_entry e;
    pthread_mutex_lock(&lock);
    crux_tablemap_refresh(&st.map, st.table_path);
    int rc = st.map.missing ? -1
                              : crux_table_decision(st.map.table, st.map.len, st.job, dgid, &e);
    pthread_mutex_unlock(&lock);
    return rc < 0 ? -1 : e.sport;
}

static void repathed(struct ibv_qp *qp, uint16_t sport)
{
    pthread_mutex_lock(&lock);
    if (st.qps != NULL && st.qps_pid == getpid())
        crux_qps_repath(st.qps, qp->qp_num, qp->context->device->name, sport);
    pthread_mutex_unlock(&lock);
}

static void *qps_file(void)
{
    pid_t pid = getpid();
    if (st.qps != NULL && st.qps_pid == pid)
        return st.qps;
    if (st.qps != NULL) { /* inherited across fork(): the parent's file, not ours */
        munmap(st.qps, QPS_LEN);
        struct stat sb; /* its descriptor too, unless the program closed it and reused the
                           number; closing it here leaves the parent's lock alone */
        if (fstat(st.qps_fd, &sb) == 0 && sb.st_dev == st.qps_dev && sb.st_ino == st.qps_ino)
            close(st.qps_fd);
        st.qps = NULL;
        st.qps_failed = 0;
    }
    if (st.qps_failed)
        return NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/%d", st.qps_dir, (int)pid);
    /* locked, and a planted name passed by: crux_recfile.h */
    int fd = crux_record_open(path, sizeof path, O_RDWR);
    void *p = MAP_FAILED;
    struct stat sb;
    if (fd >= 0 && ftruncate(fd, QPS_LEN) == 0 && fstat(fd, &sb) == 0)
        p = mmap(NULL, QPS_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED && fd >= 0)
        close(fd);
    if (p == MAP_FAILED) {
        st.qps_failed = 1; /* no agent directory: the job runs, unrecorded */
        if (st.log)
            fprintf(stderr, "crux-shim: cannot record QPs in %s: %s\n", path, strerror(errno));
        return NULL;
    }
    crux_qps_init(p, QPS_LEN, (uint32_t)pid, st.job);
    st.qps = p;
    st.qps_pid = pid;
    st.qps_fd = fd; /* never closed by us while we live: that would drop the lock */
    st.qps_dev = sb.st_dev;
    st.qps_ino = sb.st_ino;
    return p;
}

static const char *const outcome_names[CRUX_OUT_COUNT] = {
    "applied", "no-job", "no-table", "bad-table", "no-entry", "not-global", "sport-range",
    "records-full",
};

static void record(struct ibv_qp *qp, const struct ibv_qp_attr *orig,
                   const struct ibv_qp_attr *sent, const struct crux_applied *d)
{
    void *f = qps_file();
    struct crux_qps_record r;
    memset(&r, 0, sizeof r);
    r.outcome = d->outcome;
    r.port_num = sent->ah_attr.port_num;
    r.sgid_index = sent->ah_attr.grh.sgid_index;
    r.qpn = qp->qp_num;
    r.dest_qpn = sent->dest_qp_num;
    r.orig_flow_label = orig->ah_attr.grh.flow_label;
    r.flow_label = sent->ah_attr.grh.flow_label;
    r.sport = d->sport;
    r.orig_traffic_class = orig->ah_attr.grh.traffic_class;
    r.traffic_class = sent->ah_attr.grh.traffic_class;
    r.level = d->level;
    r.dscp = d->dscp;
    memcpy(r.dgid, sent->ah_attr.grh.dgid.raw, sizeof r.dgid);
    const char *dev = qp->context->device->name;
    memcpy(r.device, dev, strnlen(dev, sizeof r.device - 1)); /* truncated, NUL-padded */
    r.plan_generation = d->plan_generation;
    if (st.map.table != NULL && crux_table_validate(st.map.table, st.map.len) == 0)
        r.table_generation = crux_table_generation(st.map.table);
    r.created_ns = now_ns(CLOCK_REALTIME_COARSE); /* a timestamp for people: ms will do */
    if (f != NULL) {
        crux_qps_count(f, d->outcome);
        struct crux_qps_counters *k = crux_qps_add(f, &r);
        if (k == NULL)
            crux_qps_count(f, CRUX_OUT_RECORDS_FULL);
        crux_gate_qp_counters(qp, k); /* counted from here on: the QP is not RTS yet */
    }
    if (st.log) {
        char peer[INET6_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET6, r.dgid, peer, sizeof peer);
        fprintf(stderr, "crux-shim: %s qpn %u -> %s job '%s': %s, flow label %u, tc %u\n",
                r.device, r.qpn, peer, st.job, outcome_names[d->outcome], r.flow_label,
                r.traffic_class);
    }
}

__attribute__((visibility("default"))) int ibv_modify_qp(struct ibv_qp *qp,
                                                         struct ibv_qp_attr *attr, int mask)
{
    pthread_once(&once, init_once);
    if (real_modify == NULL)
        return ENOSYS; /* no real libibverbs: nothing we could forward to */
    if (qp == NULL || attr == NULL || !(mask & IBV_QP_AV))
        return real_modify(qp, attr, mask);

    struct ibv_qp_attr sent = *attr;
    struct crux_applied d;
    pthread_mutex_lock(&lock);
    crux_tablemap_refresh(&st.map, st.table_path);
    crux_decide(st.map.missing ? NULL : st.map.table, st.map.len, st.job, &sent.ah_attr, &d);
    pthread_mutex_unlock(&lock);

    int rc = real_modify(qp, &sent, mask);
    if (rc == 0) {
        pthread_mutex_lock(&lock);
        record(qp, attr, &sent, &d);
        pthread_mutex_unlock(&lock);
        if (sent.ah_attr.is_global && st.job[0] != '\0') /* outside `lock`: see crux_repath.c */
            crux_repath_track(qp, sent.ah_attr.grh.dgid.raw, d.sport);
    }
    return rc;
}

__attribute__((visibility("default"))) int ibv_destroy_qp(struct ibv_qp *qp)
{
    pthread_once(&once, init_once);
    if (real_destroy == NULL)
        return ENOSYS;
    if (qp != NULL) {
        crux_repath_forget(qp);
        crux_gate_qp_destroyed(qp);
        pthread_mutex_lock(&lock);
        if (st.qps != NULL && st.qps_pid == getpid())
            crux_qps_remove(st.qps, qp->qp_num, qp->context->device->name);
        pthread_mutex_unlock(&lock);
    }
    return real_destroy(qp);
}

__attribute__((visibility("default"))) struct ibv_qp *ibv_create_qp(struct ibv_pd *pd,
                                                                   struct ibv_qp_init_attr *attr)
{
    pthread_once(&once, init_once);
    struct ibv_qp *qp = real_create != NULL ? real_create(pd, attr) : NULL;
    crux_gate_qp_created(qp, attr); /* gates the QP's context once, if it can be */
    return qp;
}

__attribute__((visibility("default"))) int ibv_close_device(struct ibv_context *ctx)
{
    pthread_once(&once, init_once);
    crux_gate_context_closed(ctx);
    return real_close != NULL ? real_close(ctx) : -1;
}
