/*
 * crux_repath.h - moving live RoCE QPs to a newly decided UDP source port, where the NIC can.
 *
 * A QP's source port is fixed at connect (INIT->RTR) on most NICs: a later decision leaves it
 * "pending" until the job reconnects. mlx5 can change the port of a live RTS QP with
 * mlx5dv_modify_qp_udp_sport. The wrapper tracks its connected QPs here; a thread in the job
 * re-checks their decisions once a second and re-paths those on mlx5 devices whose decided port
 * moved. libmlx5 is found with dlopen(RTLD_NOLOAD) only: it is used when libibverbs already
 * loaded it for an mlx5 device, so nothing else ever depends on it. Elsewhere nothing is
 * tracked and QPs stay pending, as before. The traffic class cannot change on a live QP.
 */
#ifndef CRUX_REPATH_H
#define CRUX_REPATH_H

#include <infiniband/verbs.h>
#include <stdint.h>

struct crux_repath_hooks {
    /* The decided source port toward `dgid` now: > 0 a port, 0 none (leave the QP), -1 the
     * table cannot be read (leave it). Called from the re-path thread, no lock of ours held
     * but the registry's. */
    int (*decided_sport)(const uint8_t dgid[16]);
    /* A QP now sends from `sport` (the wrapper updates its record). */
    void (*repathed)(struct ibv_qp *qp, uint16_t sport);
};

/* Once, before any other call. `period_ms` 0 starts no thread (tests call crux_repath_pass). */
void crux_repath_configure(const struct crux_repath_hooks *hooks, unsigned period_ms, int log);

/* A connected QP and the port it got (0: the NIC's). Tracked only where re-path works (an
 * mlx5 device with libmlx5 loaded); returns 1 if tracked, 0 if not. */
int crux_repath_track(struct ibv_qp *qp, const uint8_t dgid[16], uint16_t sport);

/* Before ibv_destroy_qp: the thread is never inside a call on this QP afterwards. */
void crux_repath_forget(struct ibv_qp *qp);

/* One pass over the tracked QPs; returns how many were moved. */
int crux_repath_pass(void);

#endif /* CRUX_REPATH_H */
