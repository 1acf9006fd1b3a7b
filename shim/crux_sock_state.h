/*
 * crux_sock_state.h - what the TCP interposer's two halves share, inside libcrux_sock.so:
 * crux_sock.c (connect/accept steering and the per-process record) and crux_sockbytes.c (the
 * bytes the process sends and the ports it listens on, for the agent's per-job measurement).
 * Hidden: none of this is exported to the program.
 */
#ifndef CRUX_SOCK_STATE_H
#define CRUX_SOCK_STATE_H

#include <stdint.h>

#include "crux_sockrec.h"

#define CRUX_SOCK_HIDDEN __attribute__((visibility("hidden")))

/* Whether this process counts for a job: CRUX_JOB_ID set (and short enough), CRUX_SOCK not 0.
 * Initialises crux_sock.c's state on first use. */
CRUX_SOCK_HIDDEN int crux_sock_job_counted(void);

/* This process's record, made on first use (crux_sock.c's rec_file); NULL when it cannot be
 * (no agent directory, a planted file), or when called from a signal handler that interrupted
 * this thread inside the interposer (it would wait on a lock this thread holds). */
CRUX_SOCK_HIDDEN struct crux_sockrec *crux_sock_record(void);

/* Count what `fd` sends from now on, a TCP connection this process connected or accepted to
 * `peer` (table form: ::ffff:a.b.c.d for IPv4). Loopback peers are left out (they never reach
 * a NIC) unless CRUX_SOCK_LOOPBACK=1. Called by crux_sock.c; a no-op without a job. */
CRUX_SOCK_HIDDEN void crux_sockbytes_track(int fd, const uint8_t peer[16]);

#endif /* CRUX_SOCK_STATE_H */
