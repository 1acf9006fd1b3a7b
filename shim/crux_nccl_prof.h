/*
 * crux_nccl_prof.h - what the NCCL profiler plugin's files share (crux_nccl_profiler.c: the
 * events; crux_nccl_out.c: the record file, the object pools and the chained plugin).
 */
#ifndef CRUX_NCCL_PROF_H
#define CRUX_NCCL_PROF_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "nccl/err.h"
#include "nccl/profiler.h"
#include "crux_ncclrec.h"

/* The first byte of every handle this plugin gives NCCL says what it is. */
enum { NC_COLL = 0xC1, NC_OP = 0xC2, NC_STEP = 0xC3, NC_FWD = 0xC4 };

struct nc_comm;

/* A collective or p2p operation, from its start until its proxy operations are done. */
struct nc_coll {
    uint8_t kind;
    uint8_t func;           /* enum crux_nccl_func */
    _Atomic uint8_t seen;   /* counted in a burst already (by its first proxy op to finish) */
    struct nc_comm *comm;
    uint64_t bytes;         /* count x type size */
    void *next;             /* the chained plugin's handle */
};

struct nc_op;
struct nc_step {            /* every step of one op shares it (no chained plugin) */
    uint8_t kind;
    struct nc_op *op;
};

/* One proxy operation (one channel and peer of a collective): its network time. */
struct nc_op {
    uint8_t kind;
    uint8_t is_send;
    struct nc_comm *comm;
    struct nc_coll *coll;   /* NULL: its collective is unknown (not started by us) */
    uint64_t first, last;   /* network time seen so far (0: none) */
    uint64_t sent;          /* steps' sizes as NCCL reported them */
    uint64_t planned;       /* nSteps x chunkSize, for APIs that report no step sizes */
    void *next;
    struct nc_step step;
};

/* An event only the chained plugin keeps (its handle), or a step with a chained plugin. */
struct nc_fwd {
    uint8_t kind;
    struct nc_op *op;       /* set for a step of one of our ops */
    void *next;
};

/* One communicator: the context NCCL hands back with every event. */
struct nc_comm {
    int slot;                       /* in the file's image; -1: no slot left */
    void *next_ctx;                 /* the chained plugin's context; NULL: none */
    struct nc_comm *free_next;
};

/* Descriptors, decoded from any API version. */
struct nc_event {
    uint64_t type;
    void *parent;
    uint8_t func;
    uint64_t bytes;
    int is_send, n_steps, chunk;
    uint64_t comm_hash; /* v1-v3: the collective carries it */
};

/* crux_nccl_out.c */
extern int nc_api_version;
extern pid_t nc_pid; /* this process's (refreshed in a forked child) */
uint64_t nc_now(void);
struct nc_comm *nc_comm_new(uint64_t comm_hash, int nnodes, int nranks, int rank);
void nc_comm_done(struct nc_comm *c);
void nc_comm_hash(struct nc_comm *c, uint64_t comm_hash);
void nc_count(struct nc_comm *c, uint8_t func);
void nc_burst(struct nc_comm *c, uint64_t a, uint64_t b, struct nc_coll *coll, uint64_t sent);
void nc_flush(int force);
void nc_note(int events, int bad);
void *nc_pool_get(int kind);
int nc_pool_kind(const void *p);
void *nc_their(void *ours);
void *nc_chain_sym(int version);
void nc_chain_note(int state);
void nc_set_mask(uint32_t mask);
void nc_log(const char *fmt, const char *arg);

#endif /* CRUX_NCCL_PROF_H */
