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

/* The record's descriptor (crux_sock.c), which holds the lock that tells the agent who wrote
 * the record (crux_recfile.h): closing it, or any other descriptor of the file, would drop
 * the lock, so the program's close, close_range, closefrom, dup2 and dup3 leave it alone
 * (crux_sockbytes.c). The program never opened it: to the program that number is not open. */
/* The descriptor, -1 when there is none or it is no longer the record's (checked by inode). */
CRUX_SOCK_HIDDEN int crux_sock_record_fd(void);
/* Whether `fd` is the record's descriptor (a compare, and an fstat only when it is). */
CRUX_SOCK_HIDDEN int crux_sock_record_fd_is(int fd);
/* The program dup2s onto the record's number: the record moves to a new one first (returned,
 * -1 if it cannot: the lock then goes, and the agent takes the record as gone). */
CRUX_SOCK_HIDDEN int crux_sock_record_fd_move(void);
/* After that dup2: the record's descriptor is `keep`; `drop` (or -1) is closed; the lock,
 * which any close of the file dropped, is taken again. */
CRUX_SOCK_HIDDEN void crux_sock_record_fd_relock(int keep, int drop);

#endif /* CRUX_SOCK_STATE_H */
