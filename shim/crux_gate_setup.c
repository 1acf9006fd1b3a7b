/*
 * crux_gate_setup.c - the gate's setup side: which contexts are gated (the semaphore file,
 * the device -> link map, the job's level), configuration from the environment, statistics,
 * and fork. The data path is crux_gate.c; the policy is in crux_gate.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crux_gate_state.h"

struct crux_gate_state g = {.lock = PTHREAD_MUTEX_INITIALIZER};

const char *const crux_gate_reason_names[CRUX_GATE_REASONS] = {
    "gated", "no-level", "no-semaphore", "bad-semaphore", "no-map", "bad-map", "not-shared",
    "full", "disabled",
};

/* ---- evaluation (under g.lock) ---------------------------------------------------------- */

static struct glink *link_for(unsigned link)
{
    for (unsigned i = 0; i < g.nlinks; i++)
        if (g.links[i].link == link)
            return &g.links[i];
    if (g.nlinks == MAX_LINKS)
        return NULL;
    struct glink *l = &g.links[g.nlinks++];
    l->link = link;
    pthread_mutex_init(&l->m, NULL);
    return l;
}

/* Is `dev` gated, and on which link? Fills *out for CRUX_GATE_GATED; err says why not. */
int crux_gate__evaluate(const char *dev, struct glink **out, char *err, size_t errlen)
{
    const char *sem = g.cfg.pcie_path;
    if (sem == NULL || sem[0] == '\0' || strcmp(sem, "off") == 0)
        return CRUX_GATE_DISABLED;
    int lv = g.cfg.job_level != NULL ? g.cfg.job_level() : -1;
    if (lv < 0)
        return CRUX_GATE_NO_LEVEL;
    uint64_t now = now_ns();
    if (g.sem == NULL && now >= g.sem_retry_ns) {
        g.sem = crux_pcie_open(sem);
        g.sem_reason = errno == ENOENT ? CRUX_GATE_NO_SEMAPHORE : CRUX_GATE_BAD_SEMAPHORE;
        if (g.sem == NULL)
            snprintf(err, errlen, "%s: %s", sem, strerror(errno));
        g.sem_retry_ns = now + RETRY_NS;
    }
    if (g.sem == NULL)
        return g.sem_reason;
    int rc = crux_links_load(g.cfg.links_path, &g.map, err, errlen);
    if (rc == -ENOENT)
        return CRUX_GATE_NO_MAP;
    if (rc == 0 && g.map.links != crux_pcie_links(g.sem)) {
        snprintf(err, errlen, "%u links, the semaphore file has %u", g.map.links,
                 crux_pcie_links(g.sem));
        rc = -EINVAL;
    }
    if (rc != 0)
        return CRUX_GATE_BAD_MAP;
    int link = crux_links_find(&g.map, dev);
    if (link < 0)
        return CRUX_GATE_NOT_SHARED;
    if ((*out = link_for((unsigned)link)) == NULL)
        return CRUX_GATE_FULL;
    atomic_store_explicit(&(*out)->level, crux_gate_level(lv), RELAXED);
    (*out)->level_next_ns = now + RETRY_NS;
    return CRUX_GATE_GATED;
}

void crux_gate_stats(struct crux_gate_stats *out)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < CRUX_GATE_REASONS; i++)
        out->contexts[i] = atomic_load(&g.contexts[i]);
    for (int i = 0; i < CRUX_UNGATED_COUNT; i++)
        out->ungated[i] = atomic_load(&g.ungated[i]);
    out->acquires = atomic_load(&g.acquires);
    out->waits = atomic_load(&g.waits);
    out->wait_ns = atomic_load(&g.wait_ns);
    out->yields = atomic_load(&g.yields);
    out->releases = atomic_load(&g.releases);
    out->lost = atomic_load(&g.lost);
}

/* ---- configuration, fork, exit ---------------------------------------------------------- */

/* A forked child holds nothing: the semaphore names the parent's pid. Nor does it count into
 * the parent's records, whose mapping the wrapper drops in the child (crux_ibverbs.c). */
static void forget_holds(void)
{
    for (unsigned i = 0; i < g.nlinks; i++)
        atomic_store(&g.links[i].held, 0);
    for (unsigned i = 0; i < QP_SLOTS; i++)
        if (atomic_load_explicit(&g.qps[i].rec, RELAXED) != NULL)
            atomic_store(&g.qps[i].rec, NULL);
}

static void log_stats(void)
{
    struct crux_gate_stats s;
    crux_gate_stats(&s);
    fprintf(stderr, "crux-shim: pcie gate stats: acquires=%llu waits=%llu wait_ms=%.1f "
            "yields=%llu releases=%llu lost=%llu ungated-error=%llu ungated-timeout=%llu "
            "ungated-self=%llu ungated-untracked=%llu", (unsigned long long)s.acquires,
            (unsigned long long)s.waits, (double)s.wait_ns / 1e6, (unsigned long long)s.yields,
            (unsigned long long)s.releases, (unsigned long long)s.lost,
            (unsigned long long)s.ungated[0],
            (unsigned long long)s.ungated[1], (unsigned long long)s.ungated[2],
            (unsigned long long)s.ungated[3]);
    for (int i = 0; i < CRUX_GATE_REASONS; i++)
        fprintf(stderr, " %s=%llu", crux_gate_reason_names[i],
                (unsigned long long)s.contexts[i]);
    fputc('\n', stderr);
}

static void log_at_exit(void)
{
    uint64_t seen = 0;
    for (int i = 0; i < CRUX_GATE_REASONS; i++)
        seen += atomic_load(&g.contexts[i]);
    if (seen > 0)
        log_stats();
}

static void install(void)
{
    pthread_atfork(NULL, NULL, forget_holds);
    if (g.cfg.log)
        atexit(log_at_exit);
}

void crux_gate_configure(const struct crux_gate_config *cfg)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_mutex_lock(&g.lock);
    g.cfg = *cfg;
    if (g.cfg.links_path == NULL)
        g.cfg.links_path = "";
    pthread_mutex_unlock(&g.lock);
    pthread_once(&once, install);
}

/* A positive decimal from the environment, else `dflt`; 0 is returned as 0. */
static uint64_t env_num(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    char *end;
    if (v == NULL || v[0] < '0' || v[0] > '9')
        return dflt;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    return errno == 0 && *end == '\0' && n < 1000000000ull ? (uint64_t)n : dflt;
}

/* $name, else <dir>/<file>. */
static const char *env_path(char *buf, size_t len, const char *name, const char *dir,
                            const char *file)
{
    const char *v = getenv(name);
    if (v != NULL && v[0] != '\0')
        snprintf(buf, len, "%s", v);
    else
        snprintf(buf, len, "%s/%s", dir, file);
    return buf;
}

void crux_gate_configure_env(const char *table_dir, int (*job_level)(void), int log,
                             int count)
{
    static char sem[4096], map[4096];
    uint64_t wait_ms = env_num("CRUX_PCIE_MAX_WAIT_MS", CRUX_GATE_MAX_WAIT_NS / 1000000);
    struct crux_gate_config cfg = {
        .pcie_path = env_path(sem, sizeof sem, "CRUX_PCIE", table_dir, "pcie"),
        .links_path = env_path(map, sizeof map, "CRUX_PCIE_LINKS", table_dir, "pcie-links"),
        .job_level = job_level,
        .quantum_ns = env_num("CRUX_PCIE_QUANTUM_US", CRUX_GATE_QUANTUM_NS / 1000) * 1000,
        .max_wait_ns = wait_ms == 0 ? -1 : (int64_t)wait_ms * 1000000,
        .log = log,
        .count = count,
    };
    crux_gate_configure(&cfg);
}
