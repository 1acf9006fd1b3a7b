/*
 * bench_sock.c - what the TCP interposer (libcrux_sock.so) adds to a connect (bench/sock.py).
 *
 *   bench_sock steer ITERS PORT LIB   alternates socket()+close() with socket() +
 *                                     crux_sock_steer(127.0.0.1:PORT) + close(): the
 *                                     interposer's whole decision path (lookup, class, bind,
 *                                     count) without the connect; LIB is dlopen()ed
 *   bench_sock connect ITERS PORT     alternates libc's own connect (found through libc's
 *                                     handle) with the `connect` this program binds to (the
 *                                     interposer under LD_PRELOAD), socket() + connect() +
 *                                     close() to a listener on 127.0.0.1:PORT it runs itself
 *   bench_sock send ITERS BYTES       alternates libc's send with the bound one (the
 *                                     interposer's byte count under LD_PRELOAD), BATCH calls
 *                                     of BYTES at a time, on a TCP connection over loopback
 *                                     that a thread drains; times per call
 *   bench_sock write ITERS BYTES      the same for write() to /dev/null: what the wrapper
 *                                     costs a descriptor it does not count
 *
 * Alternating the two variants in one process cancels the drift between runs, which on a VM
 * is larger than what is measured. Prints `base_ns=... with_ns=...` (medians per iteration)
 * and the last outcome. Connections are closed with SO_LINGER 0 (RST, no TIME_WAIT), so a
 * bound source port is free again for the next iteration.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "crux_sockrec.h"

typedef int (*steer_fn)(int, const struct sockaddr *, socklen_t, struct crux_sock_steered *);

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void *acceptor(void *arg)
{
    int lfd = *(int *)arg;
    for (;;) {
        int c = accept(lfd, NULL, NULL);
        if (c >= 0)
            close(c);
    }
    return NULL;
}

static void drop(int fd)
{
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}

typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);
typedef ssize_t (*send_fn)(int, const void *, size_t, int);
typedef ssize_t (*write_fn)(int, const void *, size_t);

#define BATCH 32

static void *drain(void *arg)
{
    static char sink[1 << 16];
    int fd = *(int *)arg;
    while (read(fd, sink, sizeof sink) > 0)
        ;
    return NULL;
}

/* send|write: per-call medians over batches, libc's call against the bound one. */
static int bench_io(const char *mode, long iters, size_t bytes)
{
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    send_fn plain_send = libc != NULL ? (send_fn)dlsym(libc, "send") : NULL;
    write_fn plain_write = libc != NULL ? (write_fn)dlsym(libc, "write") : NULL;
    static char buf[1 << 16];
    int fd, is_send = strcmp(mode, "send") == 0;
    if (bytes > sizeof buf || plain_send == NULL || plain_write == NULL)
        return 2;
    if (is_send) {
        struct sockaddr_in a = {.sin_family = AF_INET};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof a;
        int lfd = socket(AF_INET, SOCK_STREAM, 0);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 1) != 0
            || getsockname(lfd, (struct sockaddr *)&a, &len) != 0
            || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            perror("loopback connection");
            return 2;
        }
        static int peer;
        peer = accept(lfd, NULL, NULL);
        pthread_t t;
        pthread_create(&t, NULL, drain, &peer);
    } else {
        fd = open("/dev/null", O_WRONLY);
    }
    long batches = iters / BATCH > 0 ? iters / BATCH : 1;
    uint64_t *ns[2] = {calloc((size_t)batches, sizeof(uint64_t)),
                       calloc((size_t)batches, sizeof(uint64_t))};
    for (long i = 0; i < 2 * batches; i++) {
        int with = (int)(i & 1);
        uint64_t t0 = now_ns();
        for (int k = 0; k < BATCH; k++) {
            ssize_t n = is_send ? (with ? send : plain_send)(fd, buf, bytes, 0)
                                : (with ? write : plain_write)(fd, buf, bytes);
            if (n != (ssize_t)bytes) {
                perror(mode);
                return 1;
            }
        }
        ns[with][i / 2] = (now_ns() - t0) / BATCH;
    }
    qsort(ns[0], (size_t)batches, sizeof(uint64_t), cmp_u64);
    qsort(ns[1], (size_t)batches, sizeof(uint64_t), cmp_u64);
    printf("base_ns=%llu with_ns=%llu outcome=-1\n", (unsigned long long)ns[0][batches / 2],
           (unsigned long long)ns[1][batches / 2]);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s steer|connect ITERS PORT [LIB]\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    long iters = atol(argv[2]);
    if (strcmp(mode, "send") == 0 || strcmp(mode, "write") == 0)
        return bench_io(mode, iters, (size_t)atol(argv[3]));
    struct sockaddr_in to = {.sin_family = AF_INET};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons((uint16_t)atoi(argv[3]));
    steer_fn steer = NULL;
    connect_fn plain = NULL;
    if (strcmp(mode, "steer") == 0) {
        void *h = argc > 4 ? dlopen(argv[4], RTLD_NOW) : NULL;
        steer = h != NULL ? (steer_fn)dlsym(h, "crux_sock_steer") : NULL;
        if (steer == NULL) {
            fprintf(stderr, "cannot load crux_sock_steer: %s\n", dlerror());
            return 2;
        }
    } else if (strcmp(mode, "connect") == 0) {
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        plain = libc != NULL ? (connect_fn)dlsym(libc, "connect") : NULL;
        int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        pthread_t t;
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (plain == NULL || bind(lfd, (struct sockaddr *)&to, sizeof to) != 0
            || listen(lfd, 4096) != 0) {
            perror("listener");
            return 2;
        }
        pthread_create(&t, NULL, acceptor, &lfd);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    uint64_t *ns[2] = {calloc((size_t)iters, sizeof(uint64_t)),
                       calloc((size_t)iters, sizeof(uint64_t))};
    int last = -2;
    for (long i = 0; i < 2 * iters; i++) {
        int with = (int)(i & 1);
        struct crux_sock_steered o;
        uint64_t t0 = now_ns();
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (steer != NULL) {
            if (with) {
                steer(fd, (struct sockaddr *)&to, sizeof to, &o);
                last = o.outcome;
            }
        } else if ((with ? connect : plain)(fd, (struct sockaddr *)&to, sizeof to) != 0) {
            perror("connect");
            return 1;
        }
        drop(fd);
        ns[with][i / 2] = now_ns() - t0;
    }
    qsort(ns[0], (size_t)iters, sizeof(uint64_t), cmp_u64);
    qsort(ns[1], (size_t)iters, sizeof(uint64_t), cmp_u64);
    printf("base_ns=%llu with_ns=%llu outcome=%d\n", (unsigned long long)ns[0][iters / 2],
           (unsigned long long)ns[1][iters / 2], last);
    return 0;
}
