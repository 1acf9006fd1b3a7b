/*
 * crux_ncclrec.h - the record libcrux_nccl_profiler.so leaves for the crux agent: when each
 * of the process's NCCL communicators had data on the network, and how much.
 *
 * One file per process, `<dir>/nccl-<pid>`, in the QP records' directory (crux_qps.h: $CRUX_QP_DIR,
 * else the decision table's directory plus "/qps"). The plugin creates it exclusively and
 * holds its lock while it lives (crux_recfile.h: a name another uid planted, or another pid
 * namespace's live writer's, is passed by for `nccl-<pid>.1` and on; the lock tells the agent
 * who the writer is, whatever its pid namespace) and rewrites it whole with one pwrite at
 * most every CRUX_NCCLREC_FLUSH_NS, never through a mapping, so nobody can turn a truncation
 * into a SIGBUS in the job. The agent reads it with
 * pread as untrusted input (transport/nccl_records.py) and checks `checksum`, which a read
 * that raced a write fails. Host byte order; the file never leaves the host.
 *
 * Layout: a 256-byte header, then `comms` communicator slots of `comm_size` bytes: a 128-byte
 * slot header and a ring of `bursts` burst records of 48 bytes. A burst is a stretch of
 * network activity of one communicator: the union of its proxy operations' network time
 * (send: from a step's hand-off to the network to the step's completion; receive: from the
 * first arrival to the last completion), with gaps under CRUX_NCCLREC_GAP_NS merged. `busy_ns`
 * is the exact union inside it; start/end bound it. Times are CLOCK_MONOTONIC ns, the clock
 * the agent reads too.
 */
#ifndef CRUX_NCCLREC_H
#define CRUX_NCCLREC_H

#include <stddef.h>
#include <stdint.h>

#define CRUX_NCCLREC_MAGIC 0x314C434E58555243ULL /* "CRUXNCL1" read as a little-endian u64 */
#define CRUX_NCCLREC_VERSION 1
#define CRUX_NCCLREC_PREFIX "nccl-"
#define CRUX_NCCLREC_HEADER_SIZE 256
#define CRUX_NCCLREC_COMM_HEADER 128
#define CRUX_NCCLREC_BURST_SIZE 48
#define CRUX_NCCLREC_COMMS 8      /* communicator slots; more are counted in comms_dropped */
#define CRUX_NCCLREC_BURSTS 512   /* per communicator: many iterations of a few bursts each */
#define CRUX_NCCLREC_FUNCS 8      /* collectives counted by function (enum crux_nccl_func) */
#define CRUX_NCCLREC_GAP_NS 200000ull      /* 200 us: closer network activity is one burst */
#define CRUX_NCCLREC_FLUSH_NS 200000000ull /* rewrite the file at most every 200 ms */

enum crux_nccl_func {
    CRUX_NCCL_OTHER = 0, CRUX_NCCL_ALLREDUCE = 1, CRUX_NCCL_ALLGATHER = 2,
    CRUX_NCCL_REDUCESCATTER = 3, CRUX_NCCL_BROADCAST = 4, CRUX_NCCL_REDUCE = 5,
    CRUX_NCCL_SEND = 6, CRUX_NCCL_RECV = 7
};

enum crux_ncclrec_slot { CRUX_NCCLREC_FREE = 0, CRUX_NCCLREC_LIVE = 1, CRUX_NCCLREC_DONE = 2 };

struct crux_ncclrec_header {
    uint64_t magic;          /* CRUX_NCCLREC_MAGIC */
    uint32_t version;        /* CRUX_NCCLREC_VERSION */
    uint32_t header_size;    /* 256 */
    uint32_t comm_size;      /* 128 + bursts * 48 */
    uint32_t burst_size;     /* 48 */
    uint32_t comms;          /* slots after the header */
    uint32_t bursts;         /* ring records per slot */
    uint32_t pid;            /* the process that writes this file */
    uint32_t api_version;    /* the profiler API version NCCL chose (1..6) */
    uint64_t written_ns;     /* CLOCK_MONOTONIC at this write */
    uint64_t checksum;       /* crux_ncclrec_sum over the whole file with this field 0 */
    uint64_t writes;         /* rewrites so far */
    char job_id[64];         /* $CRUX_JOB_ID, NUL-padded */
    uint64_t comms_dropped;  /* communicators that found no free slot */
    uint64_t events;         /* events this plugin handled */
    uint64_t bad_events;     /* handles or descriptors refused (foreign, unknown) */
    uint32_t chain;          /* 0 none, 1 forwarding to a chained plugin, 2 chain failed */
    uint32_t mask;           /* the event mask this plugin asked NCCL for */
    char chained[64];        /* the chained plugin's name (NUL-padded) */
    uint8_t reserved[32];
};

struct crux_ncclrec_burst {
    uint64_t start_ns;
    uint64_t end_ns;
    uint64_t busy_ns;        /* union of the network time inside [start, end] */
    uint64_t bytes;          /* message bytes of the collectives first seen on the wire here */
    uint64_t sent_bytes;     /* bytes handed to the network (steps' sizes, else planned) */
    uint32_t colls;          /* collectives (and p2p operations) first seen on the wire here */
    uint32_t ops;            /* proxy operations folded in */
};

struct crux_ncclrec_comm {
    uint64_t comm_hash;      /* NCCL's commHash (v4+: init; v1-v3: the first collective's) */
    uint32_t nranks, rank, nnodes;
    uint32_t state;          /* enum crux_ncclrec_slot */
    uint64_t created_ns;     /* CLOCK_MONOTONIC when the slot was taken */
    uint64_t total;          /* bursts ever started: ring[(total - 1) % bursts] is the newest */
    uint64_t colls;          /* collectives and p2p operations started */
    uint64_t func_colls[CRUX_NCCLREC_FUNCS]; /* ... by enum crux_nccl_func */
    uint8_t reserved[16];
    struct crux_ncclrec_burst ring[CRUX_NCCLREC_BURSTS];
};

struct crux_ncclrec_file {
    struct crux_ncclrec_header h;
    struct crux_ncclrec_comm comm[CRUX_NCCLREC_COMMS];
};

_Static_assert(offsetof(struct crux_ncclrec_header, written_ns) == 40, "written_ns offset");
_Static_assert(offsetof(struct crux_ncclrec_header, job_id) == 64, "job_id offset");
_Static_assert(offsetof(struct crux_ncclrec_header, chained) == 160, "chained offset");
_Static_assert(sizeof(struct crux_ncclrec_header) == CRUX_NCCLREC_HEADER_SIZE, "header size");
_Static_assert(sizeof(struct crux_ncclrec_burst) == CRUX_NCCLREC_BURST_SIZE, "burst size");
_Static_assert(offsetof(struct crux_ncclrec_comm, ring) == CRUX_NCCLREC_COMM_HEADER, "slot hdr");
_Static_assert(sizeof(struct crux_ncclrec_file) == CRUX_NCCLREC_HEADER_SIZE
               + CRUX_NCCLREC_COMMS * (CRUX_NCCLREC_COMM_HEADER
                                       + CRUX_NCCLREC_BURSTS * CRUX_NCCLREC_BURST_SIZE),
               "file size");

/* The checksum: sum of the file's u64 words, word i weighted by 2i+1, modulo 2^64 (fast in C
 * and in numpy; a read that mixes two writes gives another sum). */
static inline uint64_t crux_ncclrec_sum(const uint64_t *w, size_t n)
{
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += w[i] * (2 * (uint64_t)i + 1);
    return s;
}

#endif /* CRUX_NCCLREC_H */
