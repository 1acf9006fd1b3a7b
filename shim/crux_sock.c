/*
 * crux_sock.c - libcrux_sock.so, the TCP socket interposer, loaded into jobs with LD_PRELOAD.
 *
 * TCP collectives (NCCL's socket transport, gloo) are steered like RoCE QPs: ECMP hashes the
 * 5-tuple, so the TCP source port picks the fabric path, and the TOS byte carries the level's
 * DSCP. On connect() of a TCP socket (AF_INET or AF_INET6, IPv4-mapped included) the decision
 * for ($CRUX_JOB_ID, peer address), else the job's job-wide entry, from the decision table
 * (crux_table.h):
 *   - sets IP_TOS / IPV6_TCLASS to the decided traffic class;
 *   - if the socket is not bound yet and the connect goes to the entry's tcp_dport, binds the
 *     next free port of the entry's probed tcp_sports (a per-process rotating start, so several
 *     sockets to one peer spread over the set; a port in use is skipped).
 * A source port only selects the probed path toward the destination port it was probed with,
 * so any other destination port gets the traffic class alone.
 * On accept() / accept4() of a TCP connection the accepted socket gets the class of the same
 * lookup for the connecting peer (its ACKs, and any data sent back, ride the job's level): at
 * DSCP 0 a high-priority job's ACKs queued behind its own top-level data on the reverse link
 * and slowed it by a fifth on the emulated testbed (docs/shim.md, "Accepted connections").
 *
 * Model: cwrap's socket_wrapper. The real connect is resolved once (dlsym RTLD_NEXT under
 * pthread_once); every internal problem falls through to it with the caller's errno intact;
 * the table state sits under one mutex that pthread_atfork keeps consistent in a child. Fail
 * open: no job id, no table, a bad table, no entry, busy ports - the connect goes ahead as the
 * program made it, and a per-process counter (crux_sockrec.h) says why. Not counted, passed
 * through: non-TCP sockets, other families, CRUX_SOCK=0, and connects on a socket that is
 * already connecting, connected or listening (the kernel answers those).
 *
 * A route (peer, destination port) whose decided ports are all held (the job's earlier
 * connections, or their TIME_WAIT: 60 s after each close) falls back to a kernel port; the first
 * such fallback of each route is said on stderr, always, once per process (a fixed table of
 * LOGGED_ROUTES routes; past it, fallbacks are counted, not said).
 * The connections it connected or accepted are also the ones whose sent bytes it counts, for
 * the agent's per-job measurement, and it records the ports the process listens on: that half
 * is crux_sockbytes.c.
 *
 * Environment: CRUX_JOB_ID, CRUX_DECISION_TABLE (default /run/crux/decisions), CRUX_QP_DIR
 * (default: the table's directory + /qps), CRUX_SOCK=0 (off), CRUX_SHIM_LOG=1 (one stderr line
 * per counted connect), CRUX_SOCK_LOOPBACK=1 (count bytes to loopback peers too).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "crux_recfile.h"
#include "crux_sock_state.h"
#include "crux_sockrec.h"
#include "crux_table.h"
#include "crux_tablemap.h"

#define EXPORT __attribute__((visibility("default")))
#define CACHE_SLOTS 16          /* lookups remembered per process, by peer */
#define LOGGED_ROUTES 64        /* routes whose busy-port fallback was said, per process */

typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*accept_fn)(int, struct sockaddr *, socklen_t *);
typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static connect_fn real_connect;
static accept_fn real_accept;
static accept4_fn real_accept4;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint rotation; /* per process: where the next socket starts in a port set */
/* connect() is async-signal-safe, so a signal handler may call it while this thread holds the
 * lock below: such a nested call passes through rather than deadlock. */
static __thread int in_steer;

/* A job opens several sockets to each of a few peers, and a lookup scans the whole table (200
 * ns at 64 entries, 1.4 us at 1024), so the answer per peer is kept until the table's
 * generation moves (docs/decision-table.md allows that) or the table is reopened. Under the
 * lock. */
static struct cached {
    int used, found;     /* found: crux_table_decision's result, -1 none */
    uint64_t generation; /* read before the lookup: a batch after it moves it again */
    uint8_t peer[16];
    struct crux_table_entry e;
} cache[CACHE_SLOTS];
static struct {
    int off, log;
    struct crux_tablemap map; /* the decision table (crux_tablemap.h) */
    struct crux_sockrec *rec; /* this process's counters, NULL until the first counted call */
    int rec_failed;
    dev_t rec_dev; /* the record file, to know its descriptor (rec_fd) by */
    ino_t rec_ino;
    char job[CRUX_JOB_ID_LEN];
    char table_path[4096];
    char rec_dir[4096];
} st;

/* Routes (peer, destination port; the job is the process's) already said to have fallen back
 * for busy ports. Fixed size: a job dialling thousands of peers must not grow it. Under the
 * lock. */
static struct {
    unsigned used;
    int full_said;
    struct {
        uint8_t peer[16];
        uint16_t dport;
    } route[LOGGED_ROUTES];
} busy_said;

/* The record's descriptor, which holds the record's lock for the agent (crux_recfile.h) and
 * so stays open; -1 without one. Read without the lock by crux_sockbytes.c's close/dup2. */
static _Atomic int rec_fd = -1;

static const char *const outcome_names[CRUX_SOCK_OUT_COUNT] = {
    "applied", "tos-only", "no-job", "no-table", "bad-table", "no-entry", "ports-busy",
};

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : dflt;
}

/* fork(): another thread may hold the lock at that instant; holding it across the fork keeps
 * the child's copy consistent. The child counts in a file of its own, made on first use. */
static void atfork_prepare(void)
{
    pthread_mutex_lock(&lock);
}

static void atfork_parent(void)
{
    pthread_mutex_unlock(&lock);
}

static void atfork_child(void)
{
    if (st.rec != NULL)
        munmap(st.rec, CRUX_SOCKREC_SIZE); /* the parent's counters, not ours */
    int fd = crux_sock_record_fd(); /* the parent's file; closing it here leaves its lock */
    atomic_store(&rec_fd, -1);
    if (fd >= 0)
        syscall(SYS_close, fd);
    st.rec = NULL;
    st.rec_failed = 0;
    memset(&busy_said, 0, sizeof busy_said); /* another process: its own lines, its own file */
    pthread_mutex_unlock(&lock);
}

static void init_once(void)
{
    real_connect = (connect_fn)dlsym(RTLD_NEXT, "connect");
    real_accept = (accept_fn)dlsym(RTLD_NEXT, "accept");
    real_accept4 = (accept4_fn)dlsym(RTLD_NEXT, "accept4");
    st.off = strcmp(env_or("CRUX_SOCK", "1"), "0") == 0;
    const char *job = env_or("CRUX_JOB_ID", "");
    if (strlen(job) < sizeof st.job) /* a longer id cannot be in the table: NO_JOB */
        strcpy(st.job, job);
    snprintf(st.table_path, sizeof st.table_path, "%s",
             env_or("CRUX_DECISION_TABLE", CRUX_TABLE_DEFAULT_PATH));
    const char *dir = getenv("CRUX_QP_DIR");
    if (dir != NULL && dir[0] != '\0') {
        snprintf(st.rec_dir, sizeof st.rec_dir, "%s", dir);
    } else { /* the same rule as the verbs shim (crux_ibverbs.c) */
        const char *slash = strrchr(st.table_path, '/');
        int n = slash == NULL ? 1 : (int)(slash - st.table_path);
        snprintf(st.rec_dir, sizeof st.rec_dir, "%.*s/qps", n,
                 slash == NULL ? "." : st.table_path);
    }
    st.log = env_or("CRUX_SHIM_LOG", "0")[0] == '1';
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

static uint64_t now_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* This process's counters (under the lock), made on first use; NULL if they cannot be (no
 * agent directory): the job runs, uncounted. */
static struct crux_sockrec *rec_file(void)
{
    if (st.rec != NULL || st.rec_failed)
        return st.rec;
    char path[4200];
    pid_t pid = getpid();
    snprintf(path, sizeof path, "%s/" CRUX_SOCKREC_PREFIX "%d", st.rec_dir, (int)pid);
    /* Created exclusively and locked (crux_recfile.h): a name another uid planted, which it
     * could truncate under our mapping (SIGBUS in the job), a link or a FIFO, is passed by. */
    int fd = crux_record_open(path, sizeof path, O_RDWR);
    void *p = MAP_FAILED;
    struct stat sb;
    if (fd >= 0 && ftruncate(fd, CRUX_SOCKREC_SIZE) == 0 && fstat(fd, &sb) == 0)
        p = mmap(NULL, CRUX_SOCKREC_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        if (fd >= 0)
            syscall(SYS_close, fd);
        st.rec_failed = 1;
        if (st.log)
            fprintf(stderr, "crux-sock: cannot count connects in %s: %s\n", path,
                    strerror(errno));
        return NULL;
    }
    struct crux_sockrec *r = p; /* a fresh file: all zero */
    r->version = CRUX_SOCKREC_VERSION;
    r->size = CRUX_SOCKREC_SIZE;
    r->pid = (uint32_t)pid;
    r->outcomes = CRUX_SOCK_OUT_COUNT;
    memcpy(r->job_id, st.job, sizeof r->job_id); /* NUL-padded: st.job is zero-filled */
    r->created_ns = now_ns(CLOCK_REALTIME_COARSE);
    /* The magic last: a reader that sees it sees a complete header. */
    atomic_store_explicit((_Atomic uint64_t *)&r->magic, CRUX_SOCKREC_MAGIC,
                          memory_order_release);
    __atomic_store_n(&st.rec, r, __ATOMIC_RELEASE); /* crux_sock_record reads it unlocked */
    st.rec_dev = sb.st_dev;
    st.rec_ino = sb.st_ino;
    atomic_store(&rec_fd, fd); /* kept open: its lock says who we are while we live */
    return r;
}

int crux_sock_record_fd(void)
{
    int fd = atomic_load(&rec_fd);
    struct stat sb; /* still the record? close_range() in a libc we do not see may have closed it */
    if (fd < 0 || (fstat(fd, &sb) == 0 && sb.st_dev == st.rec_dev && sb.st_ino == st.rec_ino))
        return fd;
    atomic_compare_exchange_strong(&rec_fd, &fd, -1); /* the number is the program's now */
    return -1;
}

int crux_sock_record_fd_is(int fd)
{
    return fd >= 0 && fd == atomic_load_explicit(&rec_fd, memory_order_relaxed)
           && crux_sock_record_fd() == fd;
}

int crux_sock_record_fd_move(void)
{
    int fd = crux_sock_record_fd();
    int moved = fd < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (moved >= 0)
        atomic_store(&rec_fd, moved);
    return moved;
}

void crux_sock_record_fd_relock(int keep, int drop)
{
    if (drop >= 0)
        syscall(SYS_close, drop);
    atomic_store(&rec_fd, keep);
    struct flock l = {.l_type = F_WRLCK};
    if (keep >= 0 && crux_record_lock(keep, F_SETLK, &l) != 0 && st.log)
        fprintf(stderr, "crux-sock: pid %d: the record's lock is lost: %s\n", (int)getpid(),
                strerror(errno));
}

int crux_sock_job_counted(void)
{
    pthread_once(&once, init_once);
    return !st.off && st.job[0] != '\0';
}

struct crux_sockrec *crux_sock_record(void)
{
    struct crux_sockrec *r = __atomic_load_n(&st.rec, __ATOMIC_ACQUIRE);
    if (r != NULL || in_steer)
        return r;
    pthread_once(&once, init_once);
    in_steer = 1;
    pthread_mutex_lock(&lock);
    r = rec_file();
    pthread_mutex_unlock(&lock);
    in_steer = 0;
    return r;
}

/* crux_table_decision through the cache (under the lock, on a validated table). */
static int decision(const uint8_t peer[16], struct crux_table_entry *e)
{
    uint32_t w[4];
    memcpy(w, peer, 16);
    struct cached *c = &cache[(w[0] ^ w[1] ^ w[2] ^ w[3] ^ (w[3] >> 16)) % CACHE_SLOTS];
    uint64_t gen = crux_table_generation(st.map.table);
    if (!c->used || c->generation != gen || memcmp(c->peer, peer, 16) != 0) {
        c->found = crux_table_decision(st.map.table, st.map.len, st.job, peer, &c->e);
        c->generation = gen;
        memcpy(c->peer, peer, 16);
        c->used = 1;
    }
    *e = c->e;
    return c->found;
}

static void count(struct crux_sockrec *r, int outcome)
{
    if (r == NULL)
        return;
    atomic_fetch_add_explicit((_Atomic uint64_t *)&r->counters[outcome], 1,
                              memory_order_relaxed);
    atomic_fetch_add_explicit((_Atomic uint64_t *)&r->calls, 1, memory_order_relaxed);
}

static uint16_t local_port(const struct sockaddr_storage *ss, int *wildcard)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        *wildcard = a->sin_addr.s_addr == htonl(INADDR_ANY);
        return ntohs(a->sin_port);
    }
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
    *wildcard = IN6_IS_ADDR_UNSPECIFIED(&a->sin6_addr);
    return ntohs(a->sin6_port);
}

/* Bind the next free port of the set, in the socket's own family on its wildcard address, as
 * the kernel's autobind would. No SO_REUSEADDR: with it a port held by another connection to
 * the same peer would bind and the connect would then fail (EADDRNOTAVAIL); without it such a
 * port fails here with EADDRINUSE and we take the next. 0 if none bound. */
static uint16_t bind_from(int fd, int family, const uint16_t *ports, unsigned n)
{
    unsigned start = atomic_fetch_add_explicit(&rotation, 1, memory_order_relaxed) % n;
    for (unsigned i = 0; i < n; i++) {
        uint16_t port = ports[(start + i) % n];
        int rc;
        if (family == AF_INET) {
            struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
            a.sin_addr.s_addr = htonl(INADDR_ANY);
            rc = bind(fd, (struct sockaddr *)&a, sizeof a);
        } else {
            struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
            a.sin6_addr = in6addr_any;
            rc = bind(fd, (struct sockaddr *)&a, sizeof a);
        }
        if (rc == 0)
            return port;
        if (errno == EINVAL)
            return 0; /* bound meanwhile (another thread): nothing more to try */
    }
    return 0;
}

static void set_class(int fd, int family, int v4mapped, int tc)
{
    /* An AF_INET6 socket talking to an IPv4-mapped peer sends IPv4: IP_TOS marks those. */
    if (family == AF_INET || v4mapped)
        setsockopt(fd, IPPROTO_IP, IP_TOS, &tc, sizeof tc);
    if (family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &tc, sizeof tc);
}

/* A table-form peer (::ffff:a.b.c.d for IPv4) as text, for the log lines. */
static void peer_text(const uint8_t peer[16], char text[INET6_ADDRSTRLEN])
{
    strcpy(text, "?");
    if (IN6_IS_ADDR_V4MAPPED((const struct in6_addr *)peer))
        inet_ntop(AF_INET, peer + 12, text, INET6_ADDRSTRLEN);
    else
        inet_ntop(AF_INET6, peer, text, INET6_ADDRSTRLEN);
}

static void log_line(int fd, const uint8_t peer[16], uint16_t dport,
                     const struct crux_sock_steered *o)
{
    char text[INET6_ADDRSTRLEN];
    peer_text(peer, text);
    fprintf(stderr, "crux-sock: pid %d fd %d -> %s port %u job '%s': %s, sport %u, tos %d\n",
            (int)getpid(), fd, text, dport, st.job, outcome_names[o->outcome], o->sport,
            o->traffic_class);
}

/* What to say of a route whose decided ports are all held (under the lock): 1 for its first
 * fallback in this process, 2 for the first one that no longer fits the table (said once,
 * so the silence after it is explained), 0 otherwise. */
static int busy_first(const uint8_t peer[16], uint16_t dport)
{
    for (unsigned i = 0; i < busy_said.used; i++)
        if (busy_said.route[i].dport == dport && memcmp(busy_said.route[i].peer, peer, 16) == 0)
            return 0;
    if (busy_said.used == LOGGED_ROUTES) {
        int first = !busy_said.full_said;
        busy_said.full_said = 1;
        return first ? 2 : 0;
    }
    memcpy(busy_said.route[busy_said.used].peer, peer, 16);
    busy_said.route[busy_said.used++].dport = dport;
    return 1;
}

/* The line busy_first asked for: which ports were held, and that the kernel picks this
 * connection's port (its path is ECMP's, not the plan's; the class still applies). */
static void say_busy(int what, const uint8_t peer[16], uint16_t dport, const uint16_t *ports,
                     unsigned n, int tc)
{
    if (what == 2) {
        fprintf(stderr, "crux-sock: pid %d job '%s': %d routes fell back to kernel ports; "
                "further ones are counted (ports-busy), not logged\n", (int)getpid(), st.job,
                LOGGED_ROUTES);
        return;
    }
    char text[INET6_ADDRSTRLEN], list[CRUX_TCP_SPORTS * 6 + 1];
    size_t at = 0;
    list[0] = '\0';
    for (unsigned i = 0; i < n && at < sizeof list; i++)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s%u", i ? "," : "", ports[i]);
    peer_text(peer, text);
    fprintf(stderr, "crux-sock: pid %d job '%s' -> %s port %u: ports busy: every decided source "
            "port (%s) is in use, the kernel picks the port (ECMP's path, tos %d); said once "
            "per route, counted as ports-busy\n", (int)getpid(), st.job, text, dport, list, tc);
}

/* The peer of an address as the table holds it (::ffff:a.b.c.d for IPv4); 0 if not IP. */
static int peer_of(const struct sockaddr *addr, socklen_t len, uint8_t peer[16], uint16_t *port)
{
    memset(peer, 0, 16);
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)addr;
        peer[10] = peer[11] = 0xff;
        memcpy(peer + 12, &a->sin_addr, 4);
        *port = ntohs(a->sin_port);
        return 1;
    }
    if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)addr;
        memcpy(peer, &a->sin6_addr, 16);
        *port = ntohs(a->sin6_port);
        return 1;
    }
    return 0;
}

/* The decision for the job and `peer` (under the lock): its index, or -1 with the outcome
 * that says why there is none in *outcome. */
static int lookup(const uint8_t peer[16], struct crux_table_entry *e, int *outcome)
{
    if (st.job[0] == '\0') {
        *outcome = CRUX_SOCK_NO_JOB;
        return -1;
    }
    if (crux_tablemap_refresh(&st.map, st.table_path)) /* another file: what we */
        memset(cache, 0, sizeof cache);                /* remember says nothing */
    if (st.map.missing) {
        *outcome = CRUX_SOCK_NO_TABLE;
        return -1;
    }
    if (crux_table_validate(st.map.table, st.map.len) != 0) {
        *outcome = CRUX_SOCK_BAD_TABLE;
        return -1;
    }
    int found = decision(peer, e);
    if (found < 0)
        *outcome = CRUX_SOCK_NO_ENTRY;
    return found;
}

/* An accepted TCP connection takes the class its peer's decision gives (after the real
 * accept, on the new socket); counted in `accepts` when it did. Never fails the accept. */
static void mark_accepted(int fd)
{
    pthread_once(&once, init_once);
    if (st.off || in_steer || fd < 0)
        return;
    struct sockaddr_storage peer_addr, self;
    socklen_t plen = sizeof peer_addr, slen = sizeof self;
    uint8_t peer[16];
    uint16_t pport = 0;
    int proto = 0;
    socklen_t olen = sizeof proto;
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &olen) != 0 || proto != IPPROTO_TCP
        || getpeername(fd, (struct sockaddr *)&peer_addr, &plen) != 0
        || !peer_of((struct sockaddr *)&peer_addr, plen, peer, &pport)
        || getsockname(fd, (struct sockaddr *)&self, &slen) != 0)
        return;
    crux_sockbytes_track(fd, peer); /* its sends count for the job, decision or none */
    struct crux_table_entry e;
    int outcome = -1;
    in_steer = 1;
    pthread_mutex_lock(&lock);
    int found = lookup(peer, &e, &outcome);
    struct crux_sockrec *rec = found >= 0 ? rec_file() : NULL;
    pthread_mutex_unlock(&lock);
    in_steer = 0;
    if (found < 0)
        return; /* no class for it: the connection stays as the program made it */
    set_class(fd, self.ss_family, IN6_IS_ADDR_V4MAPPED((const struct in6_addr *)peer),
              e.traffic_class);
    if (rec != NULL)
        atomic_fetch_add_explicit((_Atomic uint64_t *)&rec->accepts, 1, memory_order_relaxed);
    if (st.log) {
        char text[INET6_ADDRSTRLEN];
        peer_text(peer, text);
        fprintf(stderr, "crux-sock: pid %d fd %d <- %s port %u job '%s': accepted, tos %d\n",
                (int)getpid(), fd, text, pport, st.job, e.traffic_class);
    }
}

/* Everything the interposer does before the real connect (crux_sockrec.h). */
EXPORT int crux_sock_steer(int fd, const struct sockaddr *addr, socklen_t len,
                           struct crux_sock_steered *o)
{
    uint8_t peer[16];
    uint16_t dport = 0;
    o->outcome = o->traffic_class = -1;
    o->sport = 0;
    pthread_once(&once, init_once);
    if (st.off || addr == NULL || in_steer || !peer_of(addr, len, peer, &dport))
        return 0;
    int proto = 0;
    socklen_t plen = sizeof proto;
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &plen) != 0 || proto != IPPROTO_TCP)
        return 0;
    struct sockaddr_storage self;
    socklen_t slen = sizeof self;
    if (getsockname(fd, (struct sockaddr *)&self, &slen) != 0
        || (self.ss_family != AF_INET && self.ss_family != AF_INET6))
        return 0;
    int wildcard = 0;
    uint16_t bound_port = local_port(&self, &wildcard);
    int bound = bound_port != 0 || !wildcard;
    if (bound) {
        /* A second connect on a connecting or connected socket (nonblocking programs poll
         * like that), or one on a listener: not a new connection, leave it to the kernel.
         * tcpi_state is TCP_INFO's first byte, so a 1-byte read is enough. */
        uint8_t state = 0;
        socklen_t one = 1;
        if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &state, &one) != 0 || state != TCP_CLOSE)
            return 0;
    }

    struct crux_table_entry e;
    in_steer = 1;
    pthread_mutex_lock(&lock);
    int found = lookup(peer, &e, &o->outcome);
    struct crux_sockrec *rec = rec_file();
    pthread_mutex_unlock(&lock);
    in_steer = 0;

    if (found >= 0) {
        int v4mapped = IN6_IS_ADDR_V4MAPPED((const struct in6_addr *)peer);
        o->traffic_class = e.traffic_class;
        set_class(fd, self.ss_family, v4mapped, e.traffic_class);
        uint16_t ports[CRUX_TCP_SPORTS];
        unsigned n = 0, mine = 0;
        for (int i = 0; i < CRUX_TCP_SPORTS; i++) {
            if (e.tcp_sports[i] != 0) {
                ports[n++] = e.tcp_sports[i];
                mine |= e.tcp_sports[i] == bound_port;
            }
        }
        int probed = n > 0 && e.tcp_dport != 0 && e.tcp_dport == dport;
        if (!probed) {
            o->outcome = CRUX_SOCK_TOS_ONLY;
        } else if (bound) { /* e.g. a retry on a socket we bound before a refused connect */
            o->outcome = mine ? CRUX_SOCK_APPLIED : CRUX_SOCK_TOS_ONLY;
            o->sport = mine ? bound_port : 0;
        } else {
            o->sport = bind_from(fd, self.ss_family, ports, n);
            o->outcome = o->sport != 0 ? CRUX_SOCK_APPLIED : CRUX_SOCK_PORTS_BUSY;
        }
        if (o->outcome == CRUX_SOCK_PORTS_BUSY) {
            in_steer = 1;
            pthread_mutex_lock(&lock);
            int say = busy_first(peer, dport);
            pthread_mutex_unlock(&lock);
            in_steer = 0;
            if (say)
                say_busy(say, peer, dport, ports, n, e.traffic_class);
        }
    }
    count(rec, o->outcome);
    if (st.log)
        log_line(fd, peer, dport, o);
    return 0;
}

EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    int saved = errno; /* the program sees the real connect's errno, never ours */
    struct crux_sock_steered o;
    crux_sock_steer(fd, addr, len, &o);
    uint8_t peer[16];
    uint16_t dport;
    if (o.outcome >= 0 && peer_of(addr, len, peer, &dport)) /* a new TCP connection */
        crux_sockbytes_track(fd, peer);
    errno = saved;
    if (real_connect == NULL) /* no next definition: call the kernel ourselves */
        return (int)syscall(SYS_connect, fd, addr, len);
    return real_connect(fd, addr, len);
}

EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
    pthread_once(&once, init_once);
    int r = real_accept != NULL ? real_accept(fd, addr, len)
                                : (int)syscall(SYS_accept4, fd, addr, len, 0);
    if (r >= 0) {
        int saved = errno;
        mark_accepted(r);
        errno = saved;
    }
    return r;
}

EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    pthread_once(&once, init_once);
    int r = real_accept4 != NULL ? real_accept4(fd, addr, len, flags)
                                 : (int)syscall(SYS_accept4, fd, addr, len, flags);
    if (r >= 0) {
        int saved = errno;
        mark_accepted(r);
        errno = saved;
    }
    return r;
}
