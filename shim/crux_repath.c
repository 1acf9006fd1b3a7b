/*
 * crux_repath.c - live re-path of mlx5 QPs; see crux_repath.h.
 */
#define _GNU_SOURCE
#include "crux_repath.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "crux_qps.h"

typedef bool (*supported_fn)(struct ibv_device *);
typedef int (*sport_fn)(struct ibv_qp *, uint16_t);

struct tracked {
    struct ibv_qp *qp; /* NULL: free slot */
    uint8_t dgid[16];
    uint16_t sport;    /* what the QP sends from now */
    uint16_t tried;    /* a port the NIC refused: not retried until the decision moves again */
};

/* The registry, and every call into libmlx5, under `rlock`: forget() takes it, so the thread
 * never calls into a QP being destroyed. Lock order: rlock, then the wrapper's own lock (in the
 * hooks); the wrapper never calls in here holding its lock. */
static pthread_mutex_t rlock = PTHREAD_MUTEX_INITIALIZER;
static struct tracked qps[CRUX_QPS_CAPACITY];
static struct crux_repath_hooks hooks;
static unsigned period_ms;
static int logging, thread_started;

static void child_after_fork(void)
{
    /* the parent's QPs are not the child's to touch, and the thread did not come along */
    memset(qps, 0, sizeof qps);
    thread_started = 0;
    pthread_mutex_init(&rlock, NULL);
}

void crux_repath_configure(const struct crux_repath_hooks *h, unsigned ms, int log)
{
    hooks = *h;
    period_ms = ms;
    logging = log;
    pthread_atfork(NULL, NULL, child_after_fork);
}

/* libmlx5's two calls, once libibverbs has loaded it (RTLD_NOLOAD: never load it ourselves).
 * Looked up until found, then kept: libibverbs never unloads a provider it loaded. Under
 * `rlock`. */
static supported_fn mlx5_supported;
static sport_fn mlx5_set_sport;

static int resolve(void)
{
    if (mlx5_set_sport != NULL)
        return 0;
    void *h = dlopen("libmlx5.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (h == NULL)
        return -1;
    supported_fn supported = (supported_fn)dlsym(h, "mlx5dv_is_supported");
    sport_fn set_sport = (sport_fn)dlsym(h, "mlx5dv_modify_qp_udp_sport");
    dlclose(h); /* drops our reference only: libibverbs keeps the provider loaded */
    if (supported == NULL || set_sport == NULL)
        return -1;
    mlx5_supported = supported;
    mlx5_set_sport = set_sport;
    return 0;
}

static void *loop(void *arg)
{
    (void)arg;
    struct timespec ts = {.tv_sec = period_ms / 1000, .tv_nsec = (period_ms % 1000) * 1000000L};
    for (;;) {
        nanosleep(&ts, NULL);
        crux_repath_pass();
    }
    return NULL;
}

int crux_repath_track(struct ibv_qp *qp, const uint8_t dgid[16], uint16_t sport)
{
    if (qp == NULL || hooks.decided_sport == NULL)
        return 0;
    pthread_mutex_lock(&rlock);
    if (resolve() != 0 || !mlx5_supported(qp->context->device)) {
        pthread_mutex_unlock(&rlock);
        return 0;
    }
    int tracked = 0;
    for (int i = 0; i < CRUX_QPS_CAPACITY && !tracked; i++) {
        if (qps[i].qp == NULL || qps[i].qp == qp) {
            qps[i] = (struct tracked){.qp = qp, .sport = sport};
            memcpy(qps[i].dgid, dgid, 16);
            tracked = 1;
        }
    }
    if (tracked && period_ms > 0 && !thread_started) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        thread_started = pthread_create(&t, &a, loop, NULL) == 0;
        pthread_attr_destroy(&a);
    }
    pthread_mutex_unlock(&rlock);
    return tracked;
}

void crux_repath_forget(struct ibv_qp *qp)
{
    pthread_mutex_lock(&rlock);
    for (int i = 0; i < CRUX_QPS_CAPACITY; i++)
        if (qps[i].qp == qp)
            qps[i].qp = NULL;
    pthread_mutex_unlock(&rlock);
}

int crux_repath_pass(void)
{
    int moved = 0;
    pthread_mutex_lock(&rlock);
    if (resolve() != 0) {
        pthread_mutex_unlock(&rlock);
        return 0;
    }
    for (int i = 0; i < CRUX_QPS_CAPACITY; i++) {
        struct tracked *t = &qps[i];
        if (t->qp == NULL)
            continue;
        int want = hooks.decided_sport(t->dgid);
        if (want <= 0 || want > 0xFFFF || want == t->sport || want == t->tried)
            continue;
        int rc = mlx5_set_sport(t->qp, (uint16_t)want);
        if (rc != 0) {
            t->tried = (uint16_t)want;
            if (logging)
                fprintf(stderr, "crux-shim: qpn %u: re-path to %d refused (%s); it stays "
                        "pending\n", t->qp->qp_num, want, strerror(rc > 0 ? rc : -rc));
            continue;
        }
        t->sport = (uint16_t)want;
        t->tried = 0;
        moved++;
        if (hooks.repathed != NULL)
            hooks.repathed(t->qp, t->sport);
        if (logging)
            fprintf(stderr, "crux-shim: qpn %u re-pathed to source port %d\n", t->qp->qp_num,
                    want);
    }
    pthread_mutex_unlock(&rlock);
    return moved;
}
