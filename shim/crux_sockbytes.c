/*
 * crux_sockbytes.c - the TCP interposer's per-job byte counter and listening ports (part of
 * libcrux_sock.so; the steering is crux_sock.c).
 *
 * Two jobs on one host share its NIC, so the NIC's counters mix their traffic and the agent
 * cannot tell each job's iteration period and time on the wire from them. The interposer sits
 * in every process of a job, so it counts what the process itself sends: the payload bytes
 * of every successful send, sendto, sendmsg, write and writev on a TCP connection that the
 * process connected or accepted through the interposer (crux_sock.c marks those), added to
 * `bytes_sent` in its record (crux_sockrec.h) with a relaxed atomic add, and the calls in
 * `send_calls`. The agent samples the sum over a job's processes at its sampling rate
 * (cruxd/measure/sampling/job_bytes.py, docs/measurement.md). Python's socket.sendall uses
 * send, NCCL's socket transport send, gloo sendmsg and writev.
 *
 * The hot path is one bit test: the connections are a bitmap indexed by descriptor, set when
 * a connect or accept is seen and cleared on close (close_range, closefrom); dup, dup2 and
 * dup3 carry the bit to the new descriptor. Those calls also keep off the record's own
 * descriptor, which holds the record's lock (crux_sock_state.h). Descriptors from MAX_FDS up,
 * those made by fcntl(F_DUPFD), and sends through an unseen path (a static binary, raw
 * syscalls, sendfile, io_uring) are not counted. A write on any other descriptor costs the bit
 * test and nothing else.
 *
 * It also records the TCP ports the process listen()s on (getsockname after a successful
 * listen; the first 16 distinct ones, not those bound to loopback unless CRUX_SOCK_LOOPBACK=1),
 * for the agent's per-job probing toward each job's own port.
 *
 * Fail open, as the rest of the interposer: the real call is made first and its result and
 * errno are what the program sees; counting never fails a call. A record that cannot be made
 * stops counting on that descriptor. Fork: the child inherits the descriptors and their bits
 * and counts in a record of its own (crux_sock.c makes it on first use).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "crux_sock_state.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_FDS 65536 /* descriptors counted: 8 KiB of bits */
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2) /* linux/close_range.h, for older headers */
#endif

typedef ssize_t (*send_fn)(int, const void *, size_t, int);
typedef ssize_t (*sendto_fn)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
typedef ssize_t (*sendmsg_fn)(int, const struct msghdr *, int);
typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
typedef int (*close_fn)(int);
typedef int (*dup_fn)(int);
typedef int (*dup2_fn)(int, int);
typedef int (*dup3_fn)(int, int, int);
typedef int (*listen_fn)(int, int);
typedef int (*close_range_fn)(unsigned, unsigned, int);
typedef void (*closefrom_fn)(int);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct {
    send_fn send;
    sendto_fn sendto;
    sendmsg_fn sendmsg;
    write_fn write;
    writev_fn writev;
    close_fn close;
    dup_fn dup;
    dup2_fn dup2;
    dup3_fn dup3;
    listen_fn listen;
    close_range_fn close_range; /* NULL in a libc without it (before glibc 2.34) */
    closefrom_fn closefrom;
} real;
static _Atomic int ready; /* `real` is filled in */
static int count_loopback;
static _Atomic uint64_t counted[MAX_FDS / 64]; /* the connections whose sends are counted */

static void init_once(void)
{
    real.send = (send_fn)dlsym(RTLD_NEXT, "send");
    real.sendto = (sendto_fn)dlsym(RTLD_NEXT, "sendto");
    real.sendmsg = (sendmsg_fn)dlsym(RTLD_NEXT, "sendmsg");
    real.write = (write_fn)dlsym(RTLD_NEXT, "write");
    real.writev = (writev_fn)dlsym(RTLD_NEXT, "writev");
    real.close = (close_fn)dlsym(RTLD_NEXT, "close");
    real.dup = (dup_fn)dlsym(RTLD_NEXT, "dup");
    real.dup2 = (dup2_fn)dlsym(RTLD_NEXT, "dup2");
    real.dup3 = (dup3_fn)dlsym(RTLD_NEXT, "dup3");
    real.listen = (listen_fn)dlsym(RTLD_NEXT, "listen");
    real.close_range = (close_range_fn)dlsym(RTLD_NEXT, "close_range");
    real.closefrom = (closefrom_fn)dlsym(RTLD_NEXT, "closefrom");
    const char *lo = getenv("CRUX_SOCK_LOOPBACK");
    count_loopback = lo != NULL && strcmp(lo, "1") == 0;
    atomic_store_explicit(&ready, 1, memory_order_release);
}

/* The real functions, resolved on the first call of any wrapper (a load and a branch after). */
static inline void init(void)
{
    if (__builtin_expect(!atomic_load_explicit(&ready, memory_order_acquire), 0))
        pthread_once(&once, init_once);
}

static inline int is_counted(int fd)
{
    return (unsigned)fd < MAX_FDS
           && (atomic_load_explicit(&counted[(unsigned)fd / 64], memory_order_relaxed)
               >> ((unsigned)fd % 64) & 1);
}

static void set_counted(int fd, int on)
{
    if ((unsigned)fd >= MAX_FDS)
        return;
    uint64_t bit = 1ull << ((unsigned)fd % 64);
    if (on)
        atomic_fetch_or_explicit(&counted[(unsigned)fd / 64], bit, memory_order_relaxed);
    else if (atomic_load_explicit(&counted[(unsigned)fd / 64], memory_order_relaxed) & bit)
        atomic_fetch_and_explicit(&counted[(unsigned)fd / 64], ~bit, memory_order_relaxed);
}

static int loopback(const uint8_t peer[16])
{
    static const uint8_t v6[16] = {[15] = 1};
    static const uint8_t mapped[12] = {[10] = 0xff, [11] = 0xff};
    return memcmp(peer, v6, 16) == 0 || (memcmp(peer, mapped, 12) == 0 && peer[12] == 127);
}

void crux_sockbytes_track(int fd, const uint8_t peer[16])
{
    init();
    set_counted(fd, crux_sock_job_counted() && (count_loopback || !loopback(peer)));
}

/* `n` bytes went out on a counted connection (the slow part of a counted send, apart). */
static __attribute__((noinline)) void sent(int fd, ssize_t n)
{
    int saved = errno;
    struct crux_sockrec *r = crux_sock_record();
    if (r == NULL) {
        set_counted(fd, 0); /* nowhere to count: cost nothing from here on */
    } else {
        atomic_fetch_add_explicit((_Atomic uint64_t *)&r->bytes_sent, (uint64_t)n,
                                  memory_order_relaxed);
        atomic_fetch_add_explicit((_Atomic uint64_t *)&r->send_calls, 1, memory_order_relaxed);
    }
    errno = saved;
}

#define COUNT(fd, n)                                                                          \
    do {                                                                                      \
        if ((n) > 0 && is_counted(fd))                                                        \
            sent((fd), (n));                                                                  \
    } while (0)

EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
    init();
    ssize_t n = real.send != NULL ? real.send(fd, buf, len, flags)
                                  : syscall(SYS_sendto, fd, buf, len, flags, NULL, 0);
    COUNT(fd, n);
    return n;
}

EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags,
                      const struct sockaddr *to, socklen_t tolen)
{
    init();
    ssize_t n = real.sendto != NULL ? real.sendto(fd, buf, len, flags, to, tolen)
                                    : syscall(SYS_sendto, fd, buf, len, flags, to, tolen);
    COUNT(fd, n);
    return n;
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
    init();
    ssize_t n = real.sendmsg != NULL ? real.sendmsg(fd, msg, flags)
                                     : syscall(SYS_sendmsg, fd, msg, flags);
    COUNT(fd, n);
    return n;
}

EXPORT ssize_t write(int fd, const void *buf, size_t len)
{
    init();
    ssize_t n = real.write != NULL ? real.write(fd, buf, len) : syscall(SYS_write, fd, buf, len);
    COUNT(fd, n);
    return n;
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
    init();
    ssize_t n = real.writev != NULL ? real.writev(fd, iov, cnt)
                                    : syscall(SYS_writev, fd, iov, cnt);
    COUNT(fd, n);
    return n;
}

/* The bit goes before the descriptor: a number reused at once by another thread's open
 * must not find it set. The record's own descriptor is not the program's to close
 * (crux_sock_state.h). */
EXPORT int close(int fd)
{
    init();
    if (crux_sock_record_fd_is(fd)) {
        errno = EBADF;
        return -1;
    }
    set_counted(fd, 0);
    return real.close != NULL ? real.close(fd) : (int)syscall(SYS_close, fd);
}

static int close_range_real(unsigned first, unsigned last, int flags)
{
    if (first > last)
        return 0;
    if (real.close_range != NULL)
        return real.close_range(first, last, flags);
#ifdef SYS_close_range
    return (int)syscall(SYS_close_range, first, last, flags);
#else
    errno = ENOSYS;
    return -1;
#endif
}

/* Closes [first, last] but the record's descriptor, clearing the bits first (as close). With
 * CLOSE_RANGE_CLOEXEC nothing closes now (the record's is close-on-exec already). */
EXPORT int close_range(unsigned first, unsigned last, int flags)
{
    init();
    if (flags & CLOSE_RANGE_CLOEXEC)
        return close_range_real(first, last, flags);
    for (unsigned fd = first; fd <= last && fd < MAX_FDS; fd++)
        set_counted((int)fd, 0);
    int keep = crux_sock_record_fd();
    if (keep < 0 || (unsigned)keep < first || (unsigned)keep > last)
        return close_range_real(first, last, flags);
    int r = keep > 0 ? close_range_real(first, (unsigned)keep - 1, flags) : 0;
    return r == 0 && (unsigned)keep < last ? close_range_real((unsigned)keep + 1, last, flags) : r;
}

/* glibc's closefrom, unless the record's descriptor is in its way: then close_range above,
 * and glibc's (the record's lock lost, the program's call kept) only if that fails. */
EXPORT void closefrom(int low)
{
    init();
    unsigned from = low < 0 ? 0 : (unsigned)low;
    int keep = crux_sock_record_fd();
    if ((keep < 0 || (unsigned)keep < from) && real.closefrom != NULL) {
        for (unsigned fd = from; fd < MAX_FDS; fd++)
            set_counted((int)fd, 0);
        real.closefrom(low);
    } else if (close_range(from, ~0u, 0) != 0 && real.closefrom != NULL) {
        real.closefrom(low);
    }
}

EXPORT int dup(int fd)
{
    init();
    int r = real.dup != NULL ? real.dup(fd) : (int)syscall(SYS_dup, fd);
    if (r >= 0)
        set_counted(r, is_counted(fd));
    return r;
}

/* dup2/dup3 onto the record's descriptor: the program wants that number, so the record moves
 * off it first and locks again after (crux_sock_state.h). */
EXPORT int dup3(int fd, int to, int flags)
{
    init();
    int moved = fd != to && crux_sock_record_fd_is(to) ? crux_sock_record_fd_move() : -1;
    int r = real.dup3 != NULL ? real.dup3(fd, to, flags) : (int)syscall(SYS_dup3, fd, to, flags);
    if (moved >= 0) {
        int saved = errno;
        crux_sock_record_fd_relock(r >= 0 ? moved : to, r >= 0 ? -1 : moved);
        errno = saved;
    }
    if (r >= 0)
        set_counted(r, is_counted(fd));
    return r;
}

EXPORT int dup2(int fd, int to)
{
    init();
    int moved = fd != to && crux_sock_record_fd_is(to) ? crux_sock_record_fd_move() : -1;
    int r;
    if (real.dup2 != NULL)
        r = real.dup2(fd, to);
    else if (fd == to) /* dup3 refuses this; dup2 answers whether fd is open */
        r = fcntl(fd, F_GETFD) < 0 ? -1 : to;
    else
        r = (int)syscall(SYS_dup3, fd, to, 0);
    if (moved >= 0) {
        int saved = errno;
        crux_sock_record_fd_relock(r >= 0 ? moved : to, r >= 0 ? -1 : moved);
        errno = saved;
    }
    if (r >= 0 && r != fd)
        set_counted(r, is_counted(fd));
    return r;
}

/* Keep `port` in the record's first free slot unless it is there already; lock-free, so two
 * threads listening at once keep both ports. */
static void keep_port(struct crux_sockrec *r, uint16_t port)
{
    for (int i = 0; i < CRUX_SOCKREC_LISTEN_PORTS; i++) {
        _Atomic uint16_t *slot = (_Atomic uint16_t *)&r->listen_ports[i];
        uint16_t v = atomic_load_explicit(slot, memory_order_relaxed);
        if (v == 0 && atomic_compare_exchange_strong_explicit(slot, &v, port,
                                                              memory_order_relaxed,
                                                              memory_order_relaxed))
            return;
        if (v == port)
            return;
    }
}

static void note_listen(int fd)
{
    if (!crux_sock_job_counted())
        return;
    int proto = 0;
    socklen_t plen = sizeof proto;
    struct sockaddr_storage self;
    socklen_t slen = sizeof self;
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &plen) != 0 || proto != IPPROTO_TCP
        || getsockname(fd, (struct sockaddr *)&self, &slen) != 0)
        return;
    uint16_t port;
    uint8_t addr[16] = {0};
    if (self.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&self;
        port = ntohs(a->sin_port);
        addr[10] = addr[11] = 0xff;
        memcpy(addr + 12, &a->sin_addr, 4);
    } else if (self.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&self;
        port = ntohs(a->sin6_port);
        memcpy(addr, &a->sin6_addr, 16);
    } else {
        return;
    }
    if (port == 0 || (!count_loopback && loopback(addr))) /* unreachable from elsewhere */
        return;
    struct crux_sockrec *r = crux_sock_record();
    if (r != NULL)
        keep_port(r, port);
}

EXPORT int listen(int fd, int backlog)
{
    init();
    int r = real.listen != NULL ? real.listen(fd, backlog)
                                : (int)syscall(SYS_listen, fd, backlog);
    if (r == 0) {
        int saved = errno;
        note_listen(fd);
        errno = saved;
    }
    return r;
}
