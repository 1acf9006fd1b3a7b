/*
 * crux_busguard.h - reads of a mapped decision table that survive the file shrinking under
 * them. A load from a page past the end of a truncated file raises SIGBUS, which would kill the
 * job; the data plane must fail open instead. A guarded read arms a per-thread jump buffer, and
 * a SIGBUS handler (installed on first use, chained to whatever was there before) jumps back
 * out of the read, which then reports failure. A SIGBUS with no armed read goes on to the
 * previous handler, or kills the process as before.
 *
 * Accepted limit: a job that later installs its own SIGBUS handler without chaining replaces
 * this one; the tablemap's fstat check (crux_tablemap.h) still catches a shrink that happened
 * before a lookup, leaving only a shrink during the copy itself to that handler.
 */
#ifndef CRUX_BUSGUARD_H
#define CRUX_BUSGUARD_H

/* SA_NODEFER and SA_ONSTACK need _GNU_SOURCE (or _DEFAULT_SOURCE) before the first include. */

#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>

static __thread sigjmp_buf *crux__bus_env; /* armed while this thread reads a table */
static struct sigaction crux__bus_prev;
static atomic_int crux__bus_state; /* 0 none, 1 installing, 2 installed */

static void crux__bus_handler(int sig, siginfo_t *si, void *uc)
{
    sigjmp_buf *env = crux__bus_env;
    if (env != NULL) {
        crux__bus_env = NULL;
        siglongjmp(*env, 1); /* SA_NODEFER: SIGBUS is not left blocked */
    }
    if (crux__bus_prev.sa_flags & SA_SIGINFO) {
        if (crux__bus_prev.sa_sigaction != NULL) {
            crux__bus_prev.sa_sigaction(sig, si, uc);
            return;
        }
    } else if (crux__bus_prev.sa_handler != SIG_DFL && crux__bus_prev.sa_handler != SIG_IGN) {
        crux__bus_prev.sa_handler(sig);
        return;
    }
    /* Not ours and nobody else's: the default action, as if we had never been here. */
    signal(sig, SIG_DFL);
    raise(sig);
}

static inline void crux__bus_install(void)
{
    if (atomic_load_explicit(&crux__bus_state, memory_order_acquire) == 2)
        return;
    int expect = 0;
    if (atomic_compare_exchange_strong(&crux__bus_state, &expect, 1)) {
        struct sigaction sa;
        sa.sa_sigaction = crux__bus_handler;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, &crux__bus_prev);
        atomic_store_explicit(&crux__bus_state, 2, memory_order_release);
    }
    /* A thread racing the installer reads unguarded for that moment: the fstat check covers
     * it (see the header comment). */
}

/* fn(ctx) with SIGBUS caught: 0 when it returned, -1 when a read in it faulted (whatever
 * it was writing into ctx is then incomplete). Nests: a guarded read may call another. A
 * function of its own so that nothing live across sigsetjmp can be clobbered. */
typedef void (*crux__bus_fn)(void *ctx);

static inline int crux__bus_call(crux__bus_fn fn, void *ctx)
{
    crux__bus_install();
    sigjmp_buf env;
    sigjmp_buf *volatile outer = crux__bus_env;
    if (sigsetjmp(env, 0) != 0) {
        crux__bus_env = outer;
        return -1;
    }
    crux__bus_env = &env;
    fn(ctx);
    crux__bus_env = outer;
    return 0;
}

#endif /* CRUX_BUSGUARD_H */
