/*
 * crux_nccl_out.c - the NCCL profiler plugin's state: its record file (crux_ncclrec.h), the
 * pools its event handles come from, and the plugin it chains to.
 *
 * Handles come from fixed process-wide pools, reused round-robin, never freed: NCCL may stop a
 * handle twice (its API-event handles are thread-local and never reset), and a proxy op's
 * parent collective has long been stopped when the op starts, so a freed handle would be a
 * use-after-free in the job. A slot is reused only after POOL_* later events of its kind, far
 * more than NCCL keeps in flight; were one reused early, a burst would be misattributed, not
 * the job harmed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crux_nccl_prof.h"
#include "crux_recfile.h"
#include "crux_table.h"

#define POOL_COLLS 16384u
#define POOL_OPS 16384u
#define POOL_FWDS 65536u

int nc_api_version;
pid_t nc_pid;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t setup_lock = PTHREAD_MUTEX_INITIALIZER;
static struct crux_ncclrec_file *img, *out; /* the live image; the copy written */
static atomic_flag slot_lock[CRUX_NCCLREC_COMMS];
static atomic_flag flushing = ATOMIC_FLAG_INIT;
static _Atomic uint64_t last_flush, events, bad_events, dropped;
static int fd = -1, log_on;
static pid_t file_pid;
static char dir[4096], job[64];
static struct nc_coll *colls;
static struct nc_op *ops;
static struct nc_fwd *fwds;
static _Atomic uint32_t coll_i, op_i, fwd_i;
static struct nc_comm *free_comms;
static void *chain_lib;
static int chain_state, chain_warned; /* header.chain: 0 none asked, 1 forwarding, 2 failed */
static char chain_name[64];

uint64_t nc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void nc_log(const char *fmt, const char *arg)
{
    fprintf(stderr, "crux-nccl-profiler: pid %d: ", (int)getpid());
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
}

/* A forked child starts with no record and no communicators: the parent's are the parent's
 * (NCCL's communicators do not survive a fork). */
static void child(void)
{
    nc_pid = getpid();
    if (fd >= 0)
        close(fd);
    fd = -1;
    if (img != NULL)
        memset(img, 0, sizeof *img);
    free_comms = NULL;
    atomic_flag_clear(&flushing);
    for (int i = 0; i < CRUX_NCCLREC_COMMS; i++)
        atomic_flag_clear(&slot_lock[i]);
}

static void setup(void)
{
    nc_pid = getpid();
    pthread_atfork(NULL, NULL, child);
    log_on = getenv("CRUX_SHIM_LOG") != NULL && getenv("CRUX_SHIM_LOG")[0] == '1';
    const char *j = getenv("CRUX_JOB_ID");
    if (j != NULL && strlen(j) < sizeof job)
        strcpy(job, j);
    const char *d = getenv("CRUX_QP_DIR");
    const char *table = getenv("CRUX_DECISION_TABLE");
    if (table == NULL || table[0] == '\0')
        table = CRUX_TABLE_DEFAULT_PATH;
    if (d != NULL && d[0] != '\0') {
        snprintf(dir, sizeof dir, "%s", d);
    } else { /* the same rule as the verbs shim and the socket interposer */
        const char *slash = strrchr(table, '/');
        snprintf(dir, sizeof dir, "%.*s/qps", slash == NULL ? 1 : (int)(slash - table),
                 slash == NULL ? "." : table);
    }
    img = calloc(1, sizeof *img);
    out = malloc(sizeof *out);
    colls = calloc(POOL_COLLS, sizeof *colls);
    ops = calloc(POOL_OPS, sizeof *ops);
    const char *next = getenv("CRUX_NCCL_PROFILER_NEXT");
    if (next != NULL && next[0] != '\0') {
        fwds = calloc(POOL_FWDS, sizeof *fwds);
        snprintf(chain_name, sizeof chain_name, "%s", next);
        chain_state = 2;
    }
    for (int i = 0; i < CRUX_NCCLREC_COMMS; i++)
        atomic_flag_clear(&slot_lock[i]);
}

/* The record file, created exclusively and locked (crux_recfile.h): `fd` stays open, as its
 * lock tells the agent who writes it. */
static int open_record(void)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/" CRUX_NCCLREC_PREFIX "%d", dir, (int)nc_pid);
    int f = crux_record_open(path, sizeof path, O_WRONLY);
    if (f < 0 && log_on)
        nc_log("no record (%s): t_j comes from the NIC counters", path);
    return f;
}

/* Takes a slot, creates the file on first use; NULL only when memory is short. */
struct nc_comm *nc_comm_new(uint64_t comm_hash, int nnodes, int nranks, int rank)
{
    pthread_once(&once, setup);
    if (img == NULL || out == NULL || colls == NULL || ops == NULL)
        return NULL;
    pthread_mutex_lock(&setup_lock);
    struct nc_comm *c = free_comms;
    if (c != NULL)
        free_comms = c->free_next;
    else
        c = calloc(1, sizeof *c);
    if (c == NULL) {
        pthread_mutex_unlock(&setup_lock);
        return NULL;
    }
    c->next_ctx = NULL;
    c->slot = -1;
    int pick = -1;
    for (int i = 0; i < CRUX_NCCLREC_COMMS && pick < 0; i++)
        if (img->comm[i].state == CRUX_NCCLREC_FREE)
            pick = i;
    for (int i = 0; i < CRUX_NCCLREC_COMMS; i++) /* else the slot finished longest ago */
        if (img->comm[i].state == CRUX_NCCLREC_DONE
            && (pick < 0 || img->comm[i].created_ns < img->comm[pick].created_ns))
            pick = i;
    if (pick >= 0) {
        while (atomic_flag_test_and_set_explicit(&slot_lock[pick], memory_order_acquire)) {}
        struct crux_ncclrec_comm *s = &img->comm[pick];
        memset(s, 0, sizeof *s);
        s->comm_hash = comm_hash;
        s->nnodes = (uint32_t)nnodes, s->nranks = (uint32_t)nranks, s->rank = (uint32_t)rank;
        s->state = CRUX_NCCLREC_LIVE;
        s->created_ns = nc_now();
        atomic_flag_clear_explicit(&slot_lock[pick], memory_order_release);
        c->slot = pick;
    } else {
        dropped++;
    }
    if (file_pid != nc_pid) { /* once per process */
        file_pid = nc_pid;
        fd = open_record();
    }
    pthread_mutex_unlock(&setup_lock);
    nc_flush(1);
    return c;
}

void nc_comm_done(struct nc_comm *c)
{
    if (c->slot >= 0)
        img->comm[c->slot].state = CRUX_NCCLREC_DONE;
    nc_flush(1);
    pthread_mutex_lock(&setup_lock);
    c->free_next = free_comms;
    free_comms = c;
    pthread_mutex_unlock(&setup_lock);
}

void nc_comm_hash(struct nc_comm *c, uint64_t comm_hash)
{
    if (c->slot >= 0 && img->comm[c->slot].comm_hash == 0)
        img->comm[c->slot].comm_hash = comm_hash;
}

void nc_count(struct nc_comm *c, uint8_t func)
{
    if (c->slot < 0)
        return;
    struct crux_ncclrec_comm *s = &img->comm[c->slot];
    __atomic_fetch_add(&s->colls, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->func_colls[func % CRUX_NCCLREC_FUNCS], 1, __ATOMIC_RELAXED);
}

/* Folds one proxy op's network time [a, b] into the communicator's newest burst, or starts
 * the next one (see crux_ncclrec.h). */
void nc_burst(struct nc_comm *c, uint64_t a, uint64_t b, struct nc_coll *coll, uint64_t sent)
{
    if (c->slot < 0 || b < a)
        return;
    int first = coll != NULL && !atomic_exchange_explicit(&coll->seen, 1, memory_order_relaxed);
    while (atomic_flag_test_and_set_explicit(&slot_lock[c->slot], memory_order_acquire)) {}
    struct crux_ncclrec_comm *s = &img->comm[c->slot];
    struct crux_ncclrec_burst *u = s->total ? &s->ring[(s->total - 1) % CRUX_NCCLREC_BURSTS]
                                            : NULL;
    if (u != NULL && a <= u->end_ns + CRUX_NCCLREC_GAP_NS && b + CRUX_NCCLREC_GAP_NS >= u->start_ns) {
        if (a < u->start_ns) {
            u->busy_ns += (b < u->start_ns ? b : u->start_ns) - a;
            u->start_ns = a;
        }
        if (b > u->end_ns) {
            u->busy_ns += b - (a > u->end_ns ? a : u->end_ns);
            u->end_ns = b;
        }
    } else {
        u = &s->ring[s->total++ % CRUX_NCCLREC_BURSTS];
        memset(u, 0, sizeof *u);
        u->start_ns = a, u->end_ns = b, u->busy_ns = b - a;
    }
    u->ops++;
    u->sent_bytes += sent;
    if (first) {
        u->colls++;
        u->bytes += coll->bytes;
    }
    atomic_flag_clear_explicit(&slot_lock[c->slot], memory_order_release);
    nc_flush(0);
}

void nc_note(int ev, int bad)
{
    atomic_fetch_add_explicit(&events, (uint64_t)ev, memory_order_relaxed);
    atomic_fetch_add_explicit(&bad_events, (uint64_t)bad, memory_order_relaxed);
}

static uint32_t mask_asked;
void nc_set_mask(uint32_t mask) { mask_asked = mask; }

/* Rewrites the file from the image, at most every CRUX_NCCLREC_FLUSH_NS unless forced; one
 * writer at a time, the others go on. */
void nc_flush(int force)
{
    uint64_t now = nc_now();
    if (fd < 0 || file_pid != nc_pid
        || (!force && now - atomic_load_explicit(&last_flush, memory_order_relaxed)
                          < CRUX_NCCLREC_FLUSH_NS))
        return;
    if (atomic_flag_test_and_set_explicit(&flushing, memory_order_acquire))
        return;
    atomic_store_explicit(&last_flush, now, memory_order_relaxed);
    for (int i = 0; i < CRUX_NCCLREC_COMMS; i++) {
        while (atomic_flag_test_and_set_explicit(&slot_lock[i], memory_order_acquire)) {}
        out->comm[i] = img->comm[i];
        atomic_flag_clear_explicit(&slot_lock[i], memory_order_release);
    }
    struct crux_ncclrec_header *h = &out->h;
    memset(h, 0, sizeof *h);
    h->version = CRUX_NCCLREC_VERSION;
    h->header_size = CRUX_NCCLREC_HEADER_SIZE;
    h->comm_size = sizeof(struct crux_ncclrec_comm);
    h->burst_size = CRUX_NCCLREC_BURST_SIZE;
    h->comms = CRUX_NCCLREC_COMMS;
    h->bursts = CRUX_NCCLREC_BURSTS;
    h->pid = (uint32_t)nc_pid;
    h->api_version = (uint32_t)nc_api_version;
    h->written_ns = now;
    h->writes = ++img->h.writes;
    memcpy(h->job_id, job, sizeof h->job_id);
    h->comms_dropped = atomic_load(&dropped);
    h->events = atomic_load(&events);
    h->bad_events = atomic_load(&bad_events);
    h->chain = (uint32_t)chain_state;
    h->mask = mask_asked;
    memcpy(h->chained, chain_name, sizeof h->chained);
    h->magic = CRUX_NCCLREC_MAGIC;
    h->checksum = crux_ncclrec_sum((const uint64_t *)out, sizeof *out / 8);
    ssize_t n = pwrite(fd, out, sizeof *out, 0);
    (void)n; /* a full disk costs the record, never the job */
    atomic_flag_clear_explicit(&flushing, memory_order_release);
}

void *nc_pool_get(int kind)
{
    if (kind == NC_COLL) {
        struct nc_coll *x = &colls[atomic_fetch_add_explicit(&coll_i, 1, memory_order_relaxed)
                                   % POOL_COLLS];
        memset(x, 0, sizeof *x);
        x->kind = NC_COLL;
        return x;
    }
    if (kind == NC_OP) {
        struct nc_op *x = &ops[atomic_fetch_add_explicit(&op_i, 1, memory_order_relaxed)
                               % POOL_OPS];
        memset(x, 0, sizeof *x);
        x->kind = NC_OP;
        x->step.kind = NC_STEP;
        x->step.op = x;
        return x;
    }
    if (fwds == NULL)
        return NULL;
    struct nc_fwd *x = &fwds[atomic_fetch_add_explicit(&fwd_i, 1, memory_order_relaxed)
                             % POOL_FWDS];
    memset(x, 0, sizeof *x);
    x->kind = NC_FWD;
    return x;
}

/* What `p` is, if it is one of ours: checked by address, never by reading it first, so a
 * parent pointer NCCL got from another process (PXN) or from nobody is never followed. */
int nc_pool_kind(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    if (colls != NULL && a >= (uintptr_t)colls && a < (uintptr_t)(colls + POOL_COLLS))
        return (a - (uintptr_t)colls) % sizeof *colls == 0 ? NC_COLL : 0;
    if (ops != NULL && a >= (uintptr_t)ops && a < (uintptr_t)(ops + POOL_OPS)) {
        size_t off = (a - (uintptr_t)ops) % sizeof *ops;
        return off == 0 ? NC_OP : off == offsetof(struct nc_op, step) ? NC_STEP : 0;
    }
    if (fwds != NULL && a >= (uintptr_t)fwds && a < (uintptr_t)(fwds + POOL_FWDS))
        return (a - (uintptr_t)fwds) % sizeof *fwds == 0 ? NC_FWD : 0;
    return 0;
}

/* The chained plugin's handle behind one of ours (for its events' parentObj); a pointer that
 * is not ours goes through as NCCL gave it. */
void *nc_their(void *p)
{
    switch (nc_pool_kind(p)) {
    case NC_COLL: return ((struct nc_coll *)p)->next;
    case NC_OP: return ((struct nc_op *)p)->next;
    case NC_FWD: return ((struct nc_fwd *)p)->next;
    case NC_STEP: return NULL;
    default: return p;
    }
}

/* The chained plugin's `ncclProfiler_v<version>`, found the way NCCL finds a plugin: the
 * name as given, then libnccl-profiler-<name>.so. NULL (and a warning) if there is none. */
void *nc_chain_sym(int version)
{
    pthread_once(&once, setup);
    if (chain_name[0] == '\0')
        return NULL;
    pthread_mutex_lock(&setup_lock);
    if (chain_lib == NULL) {
        chain_lib = dlopen(chain_name, RTLD_NOW | RTLD_LOCAL);
        size_t n = strlen(chain_name);
        if (chain_lib == NULL && strchr(chain_name, '/') == NULL
            && !(strncmp(chain_name, "lib", 3) == 0 && n > 3 && strcmp(chain_name + n - 3, ".so") == 0)) {
            char alt[128];
            snprintf(alt, sizeof alt, "libnccl-profiler-%s.so", chain_name);
            chain_lib = dlopen(alt, RTLD_NOW | RTLD_LOCAL);
        }
        if (chain_lib != NULL && dlsym(chain_lib, "crux_nccl_profiler_marker") != NULL) {
            dlclose(chain_lib); /* itself: forwarding to ourselves would loop */
            chain_lib = NULL;
        }
    }
    void *sym = NULL;
    if (chain_lib != NULL) {
        char name[32];
        snprintf(name, sizeof name, "ncclProfiler_v%d", version);
        sym = dlsym(chain_lib, name);
    }
    if (sym == NULL && !chain_warned) {
        chain_warned = 1;
        nc_log("cannot chain to profiler plugin %s (it does not load, or lacks the API "
               "version NCCL chose): it gets no events", chain_name);
    }
    chain_state = sym != NULL ? 1 : 2;
    pthread_mutex_unlock(&setup_lock);
    return sym;
}
