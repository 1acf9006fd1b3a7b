/*
 * crux_gate.h - PCIe link gating inside the wrapper libibverbs: a job holds its PCIe link's
 * semaphore (crux_pcie.h) while its RDMA traffic crosses the link, so a lower-priority job on
 * the same link waits inside ibv_post_send while a higher-priority one is active.
 *
 * Seeing the traffic: ibv_post_send and ibv_poll_cq are static inline in verbs.h and call
 * ctx->ops.post_send / ctx->ops.poll_cq, so no library symbol sees them. The wrapper's
 * ibv_create_qp (crux_ibverbs.c) calls crux_gate_qp_created, which, the first time a context
 * of a gated job shows up, keeps the context's two original pointers and swaps in this file's
 * trampolines (once per context; entries are never moved, so the trampolines find them
 * without a lock).
 *
 * Policy, per process and link (several QPs and devices may share one link):
 *   - a QP is busy while it has signaled send WRs posted and not yet polled (posts count
 *     IBV_SEND_SIGNALED WRs, or all with sq_sig_all; completions count send-side and error
 *     entries of a CQ). Unsignaled WRs ride along: the link is held from a QP's first signaled
 *     post to its last signaled completion, which covers NCCL (it signals the last WR of
 *     every request);
 *   - the first busy QP takes the link at the job's level (blocking in post_send), the last
 *     QP going idle (in poll_cq, or ibv_destroy_qp) releases it;
 *   - a holder yields (release, then acquire again, queueing behind the better waiter) at its
 *     next signaled post when a higher level is queued, or when an equal level is queued and
 *     it has held the link for the quantum. Lower levels queued never make it yield. So a
 *     holder cannot keep a higher level waiting longer than its WRs already in flight, and
 *     equal levels take turns;
 *   - the uncontended fast path (link held, nobody queued) is one atomic add on the QP's count
 *     and one load of the link's waiter count in the shared file: no syscall, no lock.
 *
 * Level: the job-wide decision-table entry's plan level (0 lowest), capped at the semaphore's
 * top level 7; re-read at most once a second when the link is taken.
 *
 * Counting (crux_qps.h, struct crux_qps_counters): with `count` set (the wrapper sets it when
 * the job has an id), every context gets the trampolines, gated or not, and they add each
 * connected QP's bytes posted, WRs posted and busy time to its record. A QP's busy time is
 * the gate's notion of busy above (signaled send WRs outstanding), measured with
 * CLOCK_MONOTONIC from the post that made it busy and brought up to date at every completion
 * polled. What NCCL leaves unsignaled (a chain's WRs before its last, the receiver's credit
 * writes) rides inside the signaled spans or is not timed; its bytes are counted all the same.
 *
 * Fail open: whatever is missing or wrong leaves the context ungated (counted by reason in
 * `contexts`, looked at again at most once a second on later QP creations), and a failed or
 * too long acquire lets that post go ahead ungated (counted in `ungated`). Every wait in a post
 * is bounded (issue 37, item 2): at most max_wait_ns (CRUX_GATE_MAX_WAIT_NS, 100 ms) plus the
 * semaphore's internal-lock bound (CRUX_PCIE_LOCK_NS, 2 ms). An acquire that finds the link's
 * internal mutex stuck (-EBUSY: a member stopped inside it) makes the link's posts go ungated
 * without trying for CRUX_GATE_BUSY_BACKOFF_NS (100 ms), so a stuck mutex costs a post 2 ms
 * at most once per back-off.
 *
 * Losing the link: the semaphore may take the link from a holder that keeps it past the lease
 * while an equal or higher level waits, and the agent may revoke it (crux_pcie.h, "Trust").
 * The fast path reads the link's holder pid next to its waiter count (one cache line), so the
 * next signaled post notices, counts it in `lost` and takes the link again (queueing).
 */
#ifndef CRUX_GATE_H
#define CRUX_GATE_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#include "crux_qps.h"

/* Why a device context is (not) gated: index into crux_gate_stats.contexts. */
enum crux_gate_reason {
    CRUX_GATE_GATED = 0,
    CRUX_GATE_NO_LEVEL = 1,      /* no job id, no table, or no job-wide entry */
    CRUX_GATE_NO_SEMAPHORE = 2,  /* no semaphore file */
    CRUX_GATE_BAD_SEMAPHORE = 3, /* not a valid semaphore file, or not ours to open */
    CRUX_GATE_NO_MAP = 4,        /* no device -> link map */
    CRUX_GATE_BAD_MAP = 5,       /* invalid map, or one for another semaphore file */
    CRUX_GATE_NOT_SHARED = 6,    /* the device is on no shared link: nothing to gate */
    CRUX_GATE_FULL = 7,          /* more contexts or links than this process tracks */
    CRUX_GATE_DISABLED = 8,      /* CRUX_PCIE=off */
    CRUX_GATE_REASONS = 9
};

/* Why a signaled post went ahead without the link: index into crux_gate_stats.ungated. */
enum crux_gate_ungated {
    CRUX_UNGATED_ERROR = 0,     /* the acquire failed (ENOSPC, ENOTRECOVERABLE, ...) */
    CRUX_UNGATED_TIMEOUT = 1,   /* waited max_wait_ns */
    CRUX_UNGATED_SELF = 2,      /* this pid already holds the link outside this gate */
    CRUX_UNGATED_UNTRACKED = 3, /* the QP is not in the gate's table (created before gating) */
    CRUX_UNGATED_COUNT = 4
};

struct crux_gate_stats {
    uint64_t contexts[CRUX_GATE_REASONS]; /* context evaluations by outcome */
    uint64_t ungated[CRUX_UNGATED_COUNT];
    uint64_t acquires; /* link taken: idle -> busy, or again after a yield */
    uint64_t waits;    /* of which found it held or queued */
    uint64_t wait_ns;  /* time spent in those */
    uint64_t yields;   /* released early for a waiting level */
    uint64_t releases; /* released because the last QP went idle */
    uint64_t lost;     /* found at a post that the link had been taken from us (lease, agent) */
};

struct crux_gate_config {
    const char *pcie_path;  /* semaphore file; NULL or "off": gating disabled */
    const char *links_path; /* device -> link map (crux_links_load) */
    int (*job_level)(void); /* the job's plan level, or -1: none (the job is not gated) */
    uint64_t quantum_ns;    /* hold quantum against equal levels */
    int64_t max_wait_ns;    /* longest wait for the link before a post goes ungated; < 0 never */
    int log;                /* 1: a stderr line per context evaluated, and stats at exit */
    int count;              /* 1: trampolines on every context, counting QP traffic */
};

#define CRUX_GATE_QUANTUM_NS 1000000ull        /* 1 ms */
/* 100 ms: the longest a post waits for the link before it goes ungated (issue 37: every wait
 * on the data path is bounded and short). A lower level behind a busy higher one then posts
 * one signaled WR per 100 ms at most. */
#define CRUX_GATE_MAX_WAIT_NS 100000000LL
#define CRUX_GATE_BUSY_BACKOFF_NS 100000000ull /* 100 ms ungated after a stuck internal mutex */

/* Set the configuration (copied; the strings must outlive the process). Call once, before
 * the first QP. */
void crux_gate_configure(const struct crux_gate_config *cfg);
/* The same from the environment: CRUX_PCIE (default <table dir>/pcie), CRUX_PCIE_LINKS
 * (default <table dir>/pcie-links), CRUX_PCIE_QUANTUM_US, CRUX_PCIE_MAX_WAIT_MS (0: no limit);
 * `count` as in the config. */
void crux_gate_configure_env(const char *table_dir, int (*job_level)(void), int log,
                             int count);

/* The wrapper's hooks: after a successful ibv_create_qp, before ibv_destroy_qp, before
 * ibv_close_device. */
void crux_gate_qp_created(struct ibv_qp *qp, const struct ibv_qp_init_attr *attr);
void crux_gate_qp_destroyed(struct ibv_qp *qp);
void crux_gate_context_closed(struct ibv_context *ctx);
/* After the QP's record is written (crux_qps_add): count its traffic into `k` from now on
 * (NULL: stop counting it). No effect unless counting is on and the QP was created after. */
void crux_gate_qp_counters(struct ibv_qp *qp, struct crux_qps_counters *k);

void crux_gate_stats(struct crux_gate_stats *out);
extern const char *const crux_gate_reason_names[CRUX_GATE_REASONS];

/* Plan level -> semaphore level (0..7). */
static inline unsigned crux_gate_level(int plan_level)
{
    return plan_level < 0 ? 0u : plan_level > 7 ? 7u : (unsigned)plan_level;
}

/* ---- the device -> link map (crux_links.c), written by the agent (transport/pcie_links.py)
 * Text, at most CRUX_LINKS_MAX_BYTES, every line ending in '\n':
 *     crux-pcie-links 1 <links>          first line that is not a comment or empty
 *     <device> <link> <pci address or ->  one per RDMA device on a shared link
 * '#' lines and empty lines are ignored. <links> is 1..1024, the semaphore file's link count;
 * <device> is 1..63 of [A-Za-z0-9_.-]; <link> is 0..links-1; decimal numbers without leading
 * zeros; single spaces; a device at most once; at most CRUX_LINKS_MAX_DEVICES devices.
 * Anything else makes the whole file invalid. */
#define CRUX_LINKS_MAX_BYTES 65536
#define CRUX_LINKS_MAX_DEVICES 256
#define CRUX_LINKS_NAME 64

struct crux_links {
    unsigned links; /* the semaphore file's link count */
    unsigned n;
    struct {
        char device[CRUX_LINKS_NAME];
        unsigned link;
    } dev[CRUX_LINKS_MAX_DEVICES];
};

/* Parse `len` bytes. 0, or -EINVAL with a reason ("line 3: ...") in err. */
int crux_links_parse(const char *buf, size_t len, struct crux_links *out, char *err,
                     size_t errlen);
/* Read and parse a map file: never through a symlink, only a regular file, bounded. 0, -ENOENT
 * (no file), or another negative errno (-EINVAL: invalid) with the reason in err. */
int crux_links_load(const char *path, struct crux_links *out, char *err, size_t errlen);
/* The link of `device`, or -1. */
int crux_links_find(const struct crux_links *m, const char *device);

#endif /* CRUX_GATE_H */
