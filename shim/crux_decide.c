/*
 * crux_decide.c - the shim's pure core: decision lookup for a connect, and QP records.
 * See crux_shim.h. Everything here runs inside the job's ibv_modify_qp, so it does no I/O and
 * allocates nothing; every failure is an outcome code and the connect goes ahead unchanged.
 */
/* sigaction flags for crux_busguard.h (through crux_table.h) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "crux_shim.h"

#include <stdatomic.h>
#include <string.h>

static int table_usable(const void *table, size_t len)
{
    return table != NULL && crux_table_validate(table, len) == 0;
}

int crux_decide(const void *table, size_t table_len, const char *job_id,
                struct ibv_ah_attr *ah, struct crux_applied *out)
{
    struct crux_table_entry e;
    memset(&e, 0, sizeof e);
    memset(out, 0, sizeof *out);
    if (!ah->is_global)
        return out->outcome = CRUX_OUT_NOT_GLOBAL;
    if (job_id == NULL || job_id[0] == '\0')
        return out->outcome = CRUX_OUT_NO_JOB;
    if (table == NULL)
        return out->outcome = CRUX_OUT_NO_TABLE;
    if (!table_usable(table, table_len))
        return out->outcome = CRUX_OUT_BAD_TABLE;
    /* A per-peer decision wins over the job's defaults (the job-wide entry). */
    if (crux_table_decision(table, table_len, job_id, ah->grh.dgid.raw, &e) < 0)
        return out->outcome = CRUX_OUT_NO_ENTRY;

    out->level = e.level;
    out->dscp = e.dscp;
    out->sport = e.sport;
    out->plan_generation = e.plan_generation;
    ah->grh.traffic_class = e.traffic_class;
    if (e.sport == 0)
        return out->outcome = CRUX_OUT_APPLIED; /* the decision leaves the port to the NIC */
    int32_t fl = crux_flow_label_for(e.sport);
    if (fl < 0)
        return out->outcome = CRUX_OUT_SPORT_RANGE;
    ah->grh.flow_label = (uint32_t)fl;
    return out->outcome = CRUX_OUT_APPLIED;
}

static struct crux_qps_record *records(void *base)
{
    return (struct crux_qps_record *)((char *)base + CRUX_QPS_HEADER_SIZE);
}

void crux_qps_init(void *base, size_t len, uint32_t pid, const char *job_id)
{
    struct crux_qps_header *h = base;
    memset(base, 0, len);
    h->version = CRUX_QPS_VERSION;
    h->header_size = CRUX_QPS_HEADER_SIZE;
    h->record_size = CRUX_QPS_RECORD_SIZE;
    h->capacity = (uint32_t)((len - CRUX_QPS_HEADER_SIZE) / CRUX_QPS_RECORD_SIZE);
    h->pid = pid;
    if (job_id != NULL)
        strncpy(h->job_id, job_id, sizeof h->job_id - 1);
    /* The magic last: a reader that sees it sees a complete header. */
    atomic_store_explicit((_Atomic uint64_t *)&h->magic, CRUX_QPS_MAGIC, memory_order_release);
}

void crux_qps_count(void *base, int outcome)
{
    struct crux_qps_header *h = base;
    atomic_fetch_add_explicit((_Atomic uint64_t *)&h->calls, 1, memory_order_relaxed);
    if (outcome >= 0 && outcome < CRUX_OUT_COUNT)
        atomic_fetch_add_explicit((_Atomic uint64_t *)&h->counters[outcome], 1,
                                  memory_order_relaxed);
}

/* The seqlocked part of a record: everything before its counters, which the trampolines add
 * to at any time and a record write must never store (it would undo their adds). */
#define RECORD_WORDS ((int)(offsetof(struct crux_qps_record, counters) / 4))

static void write_record(struct crux_qps_record *r, const struct crux_qps_record *val)
{
    crux_seq_write_words(r, val, RECORD_WORDS);
}

static _Atomic uint64_t *counter(uint64_t *field)
{
    return (_Atomic uint64_t *)field;
}

static void retire(uint64_t *from, uint64_t *to)
{
    uint64_t v = atomic_exchange_explicit(counter(from), 0, memory_order_relaxed);
    atomic_fetch_add_explicit(counter(to), v, memory_order_release);
}

static struct crux_qps_record *find_live(void *base, uint32_t qpn, const char *device)
{
    struct crux_qps_header *h = base;
    struct crux_qps_record *r = records(base);
    for (uint32_t i = 0; i < h->used; i++)
        if (r[i].state == CRUX_QPS_LIVE && r[i].qpn == qpn &&
            strncmp(r[i].device, device, sizeof r[i].device - 1) == 0)
            return &r[i];
    return NULL;
}

struct crux_qps_counters *crux_qps_add(void *base, const struct crux_qps_record *rec)
{
    struct crux_qps_header *h = base;
    struct crux_qps_record *r = records(base);
    struct crux_qps_record val = *rec;
    val.state = CRUX_QPS_LIVE;
    struct crux_qps_record *same = find_live(base, rec->qpn, rec->device);
    if (same != NULL) { /* connected again (after a reset): one record, its counts go on */
        write_record(same, &val);
        return &same->counters;
    }
    uint32_t used = h->used;
    for (uint32_t i = 0; i < h->capacity; i++) {
        if (i < used && r[i].state != CRUX_QPS_FREE)
            continue;
        /* a free slot's counters are zero (crux_qps_remove) unless a post raced a destroy */
        atomic_store_explicit(counter(&r[i].counters.bytes_posted), 0, memory_order_relaxed);
        atomic_store_explicit(counter(&r[i].counters.wrs_posted), 0, memory_order_relaxed);
        atomic_store_explicit(counter(&r[i].counters.busy_ns), 0, memory_order_relaxed);
        write_record(&r[i], &val);
        if (i >= used) /* the record before the count that exposes it */
            atomic_store_explicit((_Atomic uint32_t *)&h->used, i + 1, memory_order_release);
        return &r[i].counters;
    }
    return NULL;
}

void crux_qps_repath(void *base, uint32_t qpn, const char *device, uint16_t sport)
{
    struct crux_qps_record *r = find_live(base, qpn, device);
    if (r == NULL)
        return;
    struct crux_qps_record val = *r; /* the only writer of these fields: a consistent copy */
    val.sport = sport;
    int32_t fl = crux_flow_label_for(sport);
    val.flow_label = fl < 0 ? 0 : (uint32_t)fl;
    write_record(r, &val);
}

void crux_qps_remove(void *base, uint32_t qpn, const char *device)
{
    struct crux_qps_header *h = base;
    struct crux_qps_record *r = find_live(base, qpn, device);
    if (r == NULL)
        return;
    struct crux_qps_record val;
    memset(&val, 0, sizeof val);
    write_record(r, &val);
    /* Freed first, then retired: a reader copying the file front to back (header first) may
     * miss this QP's counts for one read, but never sees them both here and in the header. */
    retire(&r->counters.bytes_posted, &h->retired.bytes_posted);
    retire(&r->counters.wrs_posted, &h->retired.wrs_posted);
    retire(&r->counters.busy_ns, &h->retired.busy_ns);
}
