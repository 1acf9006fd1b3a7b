/*
 * crux_sockrec.h - the record the TCP socket interposer (crux_sock.c, libcrux_sock.so) keeps
 * for the crux agent: how many TCP connects of one process it steered, and why the others were
 * left alone.
 *
 * One file per process, `<dir>/sock-<pid>`, beside the verbs shim's QP records (crux_qps.h):
 * <dir> is $CRUX_QP_DIR or the decision table's directory plus "/qps" (default /run/crux/qps,
 * mode 1777, created by the agent). The interposer creates its file on the first counted
 * connect, exclusively, and holds its lock while it lives (crux_recfile.h: a name another uid
 * planted, or another pid namespace's live writer's, is passed by for `sock-<pid>.1` and on;
 * the lock tells the agent who the writer is, whatever its pid namespace), mode 0444, maps it
 * read-write and bumps counters with atomic adds from any thread; a forked child makes its own
 * file. The agent reads it with read(2), never mmap (a
 * job may truncate its file under a mapping: SIGBUS), checks every size against the constants
 * here, and removes files of processes that are gone (transport/sock_records.py). Host byte
 * order; the file never leaves the host.
 *
 * Layout: one 256-byte header, nothing after it. See docs/shim.md, "TCP interposer".
 */
#ifndef CRUX_SOCKREC_H
#define CRUX_SOCKREC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define CRUX_SOCKREC_MAGIC 0x314B4F5358555243ULL /* "CRUXSOK1" read as a little-endian u64 */
#define CRUX_SOCKREC_VERSION 2
#define CRUX_SOCKREC_SIZE 512
#define CRUX_SOCKREC_LISTEN_PORTS 16 /* distinct listening ports kept, the first ones */
#define CRUX_SOCKREC_COUNTERS 16 /* counter slots; outcomes past CRUX_SOCK_OUT_COUNT stay 0 */
#define CRUX_SOCKREC_PREFIX "sock-"

/* What an intercepted TCP connect() got. Index into crux_sockrec.counters. A connect that is
 * not counted (not TCP, not IPv4/IPv6, CRUX_SOCK=0, a connect on a socket that is already
 * connecting, connected or listening) is passed through untouched. */
enum crux_sock_outcome {
    CRUX_SOCK_APPLIED = 0,    /* bound a probed source port and set the traffic class */
    CRUX_SOCK_TOS_ONLY = 1,   /* traffic class set; the kernel's or the program's port: the
                                 destination port was not probed, or the socket was bound */
    CRUX_SOCK_NO_JOB = 2,     /* no CRUX_JOB_ID (or one longer than 63 bytes) */
    CRUX_SOCK_NO_TABLE = 3,   /* no decision table file */
    CRUX_SOCK_BAD_TABLE = 4,  /* wrong magic/version/layout, truncated or empty */
    CRUX_SOCK_NO_ENTRY = 5,   /* no decision for this job and peer, nor a job-wide one */
    CRUX_SOCK_PORTS_BUSY = 6, /* traffic class set; every probed port was in use, so the
                                 kernel picked the port (said on stderr once per route) */
    CRUX_SOCK_OUT_COUNT = 7
};

struct crux_sockrec {
    uint64_t magic;        /* CRUX_SOCKREC_MAGIC, stored last (release): the header is whole */
    uint32_t version;      /* CRUX_SOCKREC_VERSION */
    uint32_t size;         /* CRUX_SOCKREC_SIZE */
    uint32_t pid;          /* the process counting here: the file is named after it */
    uint32_t outcomes;     /* CRUX_SOCK_OUT_COUNT: how many counters this writer knows */
    uint64_t calls;        /* every counted connect (the sum of the counters) */
    char job_id[64];       /* $CRUX_JOB_ID, NUL-padded; empty without one */
    uint64_t counters[CRUX_SOCKREC_COUNTERS]; /* counted connects by enum crux_sock_outcome */
    uint64_t created_ns;   /* CLOCK_REALTIME when the file was made */
    uint64_t accepts;      /* accepted TCP connections given the class of their peer's
                              decision (0 from a writer that predates it: it was reserved) */
    /* version 2 (crux_sockbytes.c) */
    uint64_t bytes_sent;   /* payload bytes sent on the TCP connections this process connected
                              or accepted (loopback peers left out), monotonic */
    uint64_t send_calls;   /* the send/sendto/sendmsg/write/writev calls that sent them */
    uint16_t listen_ports[CRUX_SOCKREC_LISTEN_PORTS]; /* distinct TCP ports this process
                              listen()ed on, not on loopback; 0: an empty slot */
    uint8_t reserved[224];
};

_Static_assert(offsetof(struct crux_sockrec, version) == 8, "sockrec version offset");
_Static_assert(offsetof(struct crux_sockrec, pid) == 16, "sockrec pid offset");
_Static_assert(offsetof(struct crux_sockrec, outcomes) == 20, "sockrec outcomes offset");
_Static_assert(offsetof(struct crux_sockrec, calls) == 24, "sockrec calls offset");
_Static_assert(offsetof(struct crux_sockrec, job_id) == 32, "sockrec job_id offset");
_Static_assert(offsetof(struct crux_sockrec, counters) == 96, "sockrec counters offset");
_Static_assert(offsetof(struct crux_sockrec, created_ns) == 224, "sockrec created offset");
_Static_assert(offsetof(struct crux_sockrec, accepts) == 232, "sockrec accepts offset");
_Static_assert(offsetof(struct crux_sockrec, bytes_sent) == 240, "sockrec bytes_sent offset");
_Static_assert(offsetof(struct crux_sockrec, send_calls) == 248, "sockrec send_calls offset");
_Static_assert(offsetof(struct crux_sockrec, listen_ports) == 256, "sockrec listen_ports offset");
_Static_assert(offsetof(struct crux_sockrec, reserved) == 288, "sockrec reserved offset");
_Static_assert(sizeof(struct crux_sockrec) == CRUX_SOCKREC_SIZE, "sockrec size");
_Static_assert(CRUX_SOCK_OUT_COUNT <= CRUX_SOCKREC_COUNTERS, "outcomes fit the counters");

/* The interposer's work before the real connect, exported by libcrux_sock.so so that the
 * benchmark (shim/bench/bench_sock.c, bench/sock.py) can time the decision path apart from the
 * connect itself: look up the decision for the socket's peer, set the class, bind a port,
 * count the outcome. Always 0; *o says what happened. */
struct crux_sock_steered {
    int outcome;       /* enum crux_sock_outcome, or -1: passed through, not counted */
    uint16_t sport;    /* the bound source port, 0 when none was bound */
    int traffic_class; /* what IP_TOS / IPV6_TCLASS was set to, -1 when untouched */
};

int crux_sock_steer(int fd, const struct sockaddr *addr, socklen_t len,
                    struct crux_sock_steered *o);

#endif /* CRUX_SOCKREC_H */
