/*
 * crux_shim.h - the pure core of the verbs shim (crux_decide.c): apply a decision-table entry
 * to a connect's address vector, and write QP records. No I/O, no allocation, no locks: the
 * wrapper library (crux_ibverbs.c) does the file handling and serialises callers, and the
 * benchmark (shim/bench/bench_shim.c) drives this core without a NIC.
 */
#ifndef CRUX_SHIM_H
#define CRUX_SHIM_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#include "crux_qps.h"
#include "crux_table.h"

/* RoCEv2 derives the UDP source port from the GRH flow label:
 * sport = 0xC000 | ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14)), so a label below 0x4000 is the
 * port's low 14 bits and only ports 0xC000-0xFFFF can be expressed. */
#define CRUX_ROCE_SPORT_MIN 0xC000u
#define CRUX_FLOW_LABEL_MASK 0x3FFFu

struct crux_applied {
    uint8_t outcome;          /* enum crux_outcome */
    uint8_t level;
    uint8_t dscp;
    uint16_t sport;           /* decided port, 0 when none */
    uint64_t plan_generation; /* 0 when no decision */
};

/* Look up (job_id, ah->grh.dgid), else the job-wide entry, in the mapped table and rewrite
 * ah->grh.flow_label / traffic_class from it. Returns the outcome (also in *out); ah is left
 * untouched unless something is applied. table may be NULL (no table). */
int crux_decide(const void *table, size_t table_len, const char *job_id,
                struct ibv_ah_attr *ah, struct crux_applied *out);

/* The flow label that makes a RoCEv2 NIC send from `sport`, or -1 if none can. Label 0 means
 * "no label" (the NIC derives the port from the QP numbers), so port 0xC000 takes 0x4001, whose
 * two halves cancel in the XOR. */
static inline int32_t crux_flow_label_for(uint16_t sport)
{
    if (sport < CRUX_ROCE_SPORT_MIN)
        return -1;
    uint32_t low = sport & CRUX_FLOW_LABEL_MASK;
    return low != 0 ? (int32_t)low : (int32_t)((1u << 14) | 1u);
}

/* Initialise a mapped records file of `len` bytes for this process. */
void crux_qps_init(void *base, size_t len, uint32_t pid, const char *job_id);

/* Count an intercepted connect by outcome (atomic: any thread, no lock needed). */
void crux_qps_count(void *base, int outcome);

/* Record a connected QP and return its traffic counters (for crux_gate_qp_counters); a QP
 * connected again keeps its record and counts. NULL if every slot is live (the caller counts
 * RECORDS_FULL). Single writer: the caller serialises calls for one file. */
struct crux_qps_counters *crux_qps_add(void *base, const struct crux_qps_record *rec);

/* Free the record of `qpn` on `device` if there is one (ibv_destroy_qp), its counts moving to
 * the header's `retired`. Single writer. */
void crux_qps_remove(void *base, uint32_t qpn, const char *device);

/* The live QP `qpn` on `device` now sends from `sport` (an mlx5 re-path, crux_repath.h).
 * Single writer. */
void crux_qps_repath(void *base, uint32_t qpn, const char *device, uint16_t sport);

#endif /* CRUX_SHIM_H */
