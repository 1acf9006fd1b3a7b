/*
 * sock_bytes.c - drives the interposer's byte counting (shim/crux_sockbytes.c); run by
 * tests/test_sock_bytes.py under LD_PRELOAD=libcrux_sock.so with CRUX_JOB_ID and CRUX_QP_DIR.
 *
 *   sock_bytes layout   prints the record's field offsets and size (the header's view), for
 *                       the test to hold against transport/sock_records.py; needs no preload
 *   sock_bytes run      a TCP connection over loopback, sends through every wrapped call on
 *                       both ends, a dup, a closed descriptor reused by a pipe, a UDP socket,
 *                       a forked child; two listeners (wildcard and loopback). Reads its own
 *                       record back through crux_sockrec.h and checks it against what it
 *                       sent (CRUX_SOCK_LOOPBACK=1: everything counted; unset: the loopback
 *                       connection is not, the wildcard listener's port is). Prints
 *                       `pid=... child=... port=... lo_port=... bytes=... calls=...`.
 * Exit 0 when every check holds, 1 with a line on stderr otherwise.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "crux_sockrec.h"

static int failures;

#define CHECK(cond, ...)                                                                      \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "sock_bytes:%d: %s: ", __LINE__, #cond);                          \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fputc('\n', stderr);                                                              \
            failures++;                                                                       \
        }                                                                                     \
    } while (0)

static int listener(const char *addr, uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, addr, &a.sin_addr);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 8) != 0
        || getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        perror("listener");
        exit(2);
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static struct crux_sockrec read_rec(int pid)
{
    char path[4200];
    struct crux_sockrec r;
    memset(&r, 0, sizeof r);
    snprintf(path, sizeof path, "%s/" CRUX_SOCKREC_PREFIX "%d", getenv("CRUX_QP_DIR"), pid);
    int fd = open(path, O_RDONLY);
    ssize_t n = fd >= 0 ? pread(fd, &r, sizeof r, 0) : -1;
    CHECK(n == (ssize_t)sizeof r, "%s: read %zd bytes", path, n);
    if (fd >= 0)
        close(fd);
    return r;
}

static void layout(void)
{
#define OFF(f) printf(#f "=%zu\n", offsetof(struct crux_sockrec, f))
    OFF(magic);
    OFF(version);
    OFF(size);
    OFF(pid);
    OFF(outcomes);
    OFF(calls);
    OFF(job_id);
    OFF(counters);
    OFF(created_ns);
    OFF(accepts);
    OFF(bytes_sent);
    OFF(send_calls);
    OFF(listen_ports);
    OFF(reserved);
#undef OFF
    printf("sizeof=%zu\nSIZE=%d\nVERSION=%d\nLISTEN_PORTS=%d\n", sizeof(struct crux_sockrec),
           CRUX_SOCKREC_SIZE, CRUX_SOCKREC_VERSION, CRUX_SOCKREC_LISTEN_PORTS);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "layout") == 0) {
        layout();
        return 0;
    }
    const char *lo = getenv("CRUX_SOCK_LOOPBACK");
    int counted = lo != NULL && strcmp(lo, "1") == 0;
    uint16_t port, lo_port;
    int l = listener("0.0.0.0", &port);
    int l_lo = listener("127.0.0.1", &lo_port);
    listen(l, 16); /* a second listen on one port: kept once */

    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port)};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c, (struct sockaddr *)&to, sizeof to) != 0) {
        perror("connect");
        return 2;
    }
    int a = accept(l, NULL, NULL);
    static char buf[4096];
    uint64_t bytes = 0, calls = 0;
#define SENT(expr, n)                                                                         \
    do {                                                                                      \
        ssize_t got_ = (expr);                                                                \
        CHECK(got_ == (n), "%s sent %zd", #expr, got_);                                       \
        bytes += (uint64_t)(n);                                                               \
        calls++;                                                                              \
    } while (0)
    SENT(send(c, buf, 100, 0), 100);
    SENT(sendto(c, buf, 200, 0, NULL, 0), 200);
    struct iovec iov[2] = {{buf, 300}, {buf, 50}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
    SENT(sendmsg(c, &msg, 0), 350);
    SENT(write(c, buf, 400), 400);
    iov[0].iov_len = 500;
    iov[1].iov_len = 5;
    SENT(writev(c, iov, 2), 505);
    SENT(send(a, buf, 1000, 0), 1000); /* the accepted end counts too */
    /* a forked child counts in a record of its own */
    pid_t child = fork();
    if (child == 0) {
        ssize_t n = send(a, buf, 17, 0);
        _exit(n == 17 ? 0 : 3);
    }
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);

    int d = dup(c);
    SENT(write(d, buf, 7), 7); /* a duplicate carries the mark */
    int e = dup2(c, 100);
    CHECK(e == 100, "dup2 gave %d", e);
    SENT(send(e, buf, 3, 0), 3);
    close(e);

    /* errno is the real call's, counted descriptor or not */
    errno = 0;
    CHECK(send(-1, buf, 1, 0) == -1 && errno == EBADF, "send(-1): errno %d", errno);
    errno = 0;
    CHECK(write(c, buf, 0) == 0 && errno == 0, "write of 0 bytes: errno %d", errno);

    /* a closed number reused by a pipe: its writes are not the connection's */
    close(d);
    int cfd = c;
    shutdown(c, SHUT_RDWR);
    close(c);
    int p[2];
    CHECK(pipe(p) == 0, "pipe");
    CHECK(p[0] == cfd || p[1] == cfd || p[0] == d || p[1] == d,
          "pipe %d,%d reuses neither %d nor %d", p[0], p[1], cfd, d);
    CHECK(write(p[1], buf, 9) == 9, "pipe write");

    /* UDP is not counted, connected or not */
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in ut = to;
    ut.sin_port = htons(lo_port);
    connect(u, (struct sockaddr *)&ut, sizeof ut);
    send(u, buf, 11, 0);
    sendto(u, buf, 13, 0, (struct sockaddr *)&ut, sizeof ut);

    uint64_t want = counted ? bytes : 0, want_calls = counted ? calls : 0;
    struct crux_sockrec r = read_rec(getpid());
    CHECK(r.magic == CRUX_SOCKREC_MAGIC && r.version == 2 && r.size == 512,
          "header %llx v%u size %u", (unsigned long long)r.magic, r.version, r.size);
    CHECK(r.bytes_sent == want, "bytes_sent %llu, want %llu",
          (unsigned long long)r.bytes_sent, (unsigned long long)want);
    CHECK(r.send_calls == want_calls, "send_calls %llu, want %llu",
          (unsigned long long)r.send_calls, (unsigned long long)want_calls);
    CHECK(r.listen_ports[0] == port, "first listening port %u, want %u", r.listen_ports[0],
          port);
    CHECK(r.listen_ports[1] == (counted ? lo_port : 0), "second slot %u (loopback %u)",
          r.listen_ports[1], lo_port);
    for (int i = 2; i < CRUX_SOCKREC_LISTEN_PORTS; i++)
        CHECK(r.listen_ports[i] == 0, "slot %d holds %u", i, r.listen_ports[i]);
    if (counted) { /* uncounted, the child has nothing to record: no file */
        struct crux_sockrec cr = read_rec(child);
        CHECK(cr.bytes_sent == 17 && cr.send_calls == 1, "child bytes_sent %llu",
              (unsigned long long)cr.bytes_sent);
        CHECK(cr.listen_ports[0] == 0, "the child listened on nothing, has %u",
              cr.listen_ports[0]);
    }
    printf("pid=%d child=%d port=%u lo_port=%u bytes=%llu calls=%llu\n", (int)getpid(),
           (int)child, port, lo_port, (unsigned long long)want,
           (unsigned long long)want_calls);
    close(a);
    close(l);
    close(l_lo);
    return failures != 0;
}
