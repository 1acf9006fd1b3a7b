/*
 * crux_qps.h - the QP records a job's shim leaves for the crux agent: which QPs it connected,
 * to whom, and what it applied (or why it applied nothing).
 *
 * One file per process, `<dir>/<pid>`, where <dir> is $CRUX_QP_DIR or the directory of the
 * decision table plus "/qps" (default /run/crux/qps, created by the agent mode 1777 like /tmp so
 * that jobs of any user can write their own file). The shim creates its file on the first
 * recorded QP, exclusively, and holds its lock while it lives (crux_recfile.h: a name another
 * uid planted, or another pid namespace's live writer's, is passed by for `<pid>.1` and on;
 * the lock tells the agent who the writer is, whatever its pid namespace), and maps
 * it read-write; the agent maps it read-only, reads records under each
 * record's seqlock (the same protocol as the decision table: crux_table.h) and removes files of
 * processes that are gone. Host byte order; the file never leaves the host.
 *
 * Layout: a 192-byte header, then `capacity` records of 128 bytes. See docs/shim.md.
 *
 * Traffic counters (version 2): each record ends in the QP's struct crux_qps_counters, added to
 * by the wrapper's post_send/poll_cq trampolines (crux_gate.c) with relaxed atomic adds from
 * any thread. They sit outside the record's seqlock (the seqlock writers never store them): a
 * reader takes each as an aligned 64-bit word, a post or two behind or ahead of the record's
 * other fields (the agent's pread copies aligned words whole in practice; nothing in the
 * seqlock checks them). When a QP is destroyed its counts move into the header's
 * `retired` (record freed first, then added there: a reader that copies the file front to back
 * may miss them for one read, never count them twice), so a process's total only grows.
 * Version 1 files are the same layout with the counters' bytes reserved (zero).
 */
#ifndef CRUX_QPS_H
#define CRUX_QPS_H

#include <stddef.h>
#include <stdint.h>

#define CRUX_QPS_MAGIC 0x3153505158555243ULL /* "CRUXQPS1" read as a little-endian u64 */
#define CRUX_QPS_VERSION 2
#define CRUX_QPS_HEADER_SIZE 192
#define CRUX_QPS_RECORD_SIZE 128
#define CRUX_QPS_CAPACITY 1024 /* QPs per process; NCCL uses a few per peer and channel */

/* Why a QP got what it got. Index into header.counters as well. */
enum crux_outcome {
    CRUX_OUT_APPLIED = 0,        /* the decision's source port and traffic class are set */
    CRUX_OUT_NO_JOB = 1,         /* no CRUX_JOB_ID in the environment */
    CRUX_OUT_NO_TABLE = 2,       /* the table file is missing or unreadable */
    CRUX_OUT_BAD_TABLE = 3,      /* wrong magic/version/layout, or too short */
    CRUX_OUT_NO_ENTRY = 4,       /* no decision for this job and peer, nor job-wide */
    CRUX_OUT_NOT_GLOBAL = 5,     /* the address has no GRH (InfiniBand LID routing) */
    CRUX_OUT_SPORT_RANGE = 6,    /* traffic class set; the port is outside 0xC000-0xFFFF, which
                                    a flow label cannot express, so the NIC's port is kept */
    CRUX_OUT_RECORDS_FULL = 7,   /* counted only: decision applied but no record slot left */
    CRUX_OUT_COUNT = 8
};

/* One QP's send-side traffic, as its process posted it (docs/shim.md "QP records"). */
struct crux_qps_counters {
    uint64_t bytes_posted; /* sg_list bytes of SEND(_WITH_IMM/_WITH_INV), RDMA_WRITE(_WITH_IMM)
                              and TSO WRs the provider accepted; not RDMA_READ or atomics */
    uint64_t wrs_posted;   /* every WR the provider accepted, any opcode */
    uint64_t busy_ns;      /* CLOCK_MONOTONIC ns with signaled send WRs outstanding, seen at
                              each completion polled (so up to date as of the last poll) */
};

#define CRUX_QPS_FREE 0
#define CRUX_QPS_LIVE 1

struct crux_qps_header {
    uint64_t magic;          /* CRUX_QPS_MAGIC */
    uint32_t version;        /* CRUX_QPS_VERSION */
    uint32_t header_size;    /* 192 */
    uint32_t record_size;    /* 128 */
    uint32_t capacity;       /* record slots after the header */
    uint32_t pid;            /* the process that writes this file */
    uint32_t used;           /* slots [0, used) may be live */
    uint64_t counters[CRUX_OUT_COUNT]; /* intercepted connects, by outcome */
    char job_id[64];         /* $CRUX_JOB_ID, NUL-padded; empty without one */
    uint64_t calls;          /* every intercepted ibv_modify_qp with IBV_QP_AV */
    struct crux_qps_counters retired; /* summed over this process's destroyed QPs (v2) */
};

struct crux_qps_record {
    uint32_t seq;            /* seqlock: odd while the shim changes the record */
    uint8_t state;           /* CRUX_QPS_FREE or CRUX_QPS_LIVE */
    uint8_t outcome;         /* enum crux_outcome */
    uint8_t port_num;        /* ah_attr.port_num */
    uint8_t sgid_index;      /* local GID index: the agent reads the GID from sysfs */
    uint32_t qpn;
    uint32_t dest_qpn;
    uint32_t orig_flow_label;   /* what the program asked for */
    uint32_t flow_label;        /* what the NIC was given */
    uint16_t sport;             /* the decided source port (0: none) */
    uint8_t orig_traffic_class;
    uint8_t traffic_class;      /* what the NIC was given */
    uint8_t level;              /* the decision's priority level */
    uint8_t dscp;               /* the decision's DSCP */
    uint8_t reserved0[2];
    uint8_t dgid[16];           /* remote GID: IPv4-mapped for RoCEv2 over IPv4 */
    char device[32];            /* ibv device name, NUL-padded (truncated at 31) */
    uint64_t plan_generation;   /* plan of the decision applied (0: none) */
    uint64_t table_generation;  /* table generation at connect time */
    uint64_t created_ns;        /* CLOCK_REALTIME */
    struct crux_qps_counters counters; /* v2; outside the seqlock: see the top of this file */
};

_Static_assert(offsetof(struct crux_qps_header, counters) == 32, "counters offset");
_Static_assert(offsetof(struct crux_qps_header, job_id) == 96, "job_id offset");
_Static_assert(offsetof(struct crux_qps_header, calls) == 160, "calls offset");
_Static_assert(offsetof(struct crux_qps_header, retired) == 168, "retired offset");
_Static_assert(sizeof(struct crux_qps_header) == CRUX_QPS_HEADER_SIZE, "qps header size");
_Static_assert(offsetof(struct crux_qps_record, sport) == 24, "sport offset");
_Static_assert(offsetof(struct crux_qps_record, dgid) == 32, "dgid offset");
_Static_assert(offsetof(struct crux_qps_record, device) == 48, "device offset");
_Static_assert(offsetof(struct crux_qps_record, plan_generation) == 80, "plan gen offset");
_Static_assert(offsetof(struct crux_qps_record, counters) == 104, "counters offset");
_Static_assert(offsetof(struct crux_qps_record, counters) % 64 + sizeof(struct crux_qps_counters)
               <= 64, "counters in one cache line");
_Static_assert(sizeof(struct crux_qps_record) == CRUX_QPS_RECORD_SIZE, "qps record size");

#endif /* CRUX_QPS_H */
