/* crux_sampler.c - the agent's NIC counter loop, in C so that 100 wakeups a second cost
 * what the kernel charges for them and not what the Python interpreter adds (bench/measure.py:
 * a Python thread that only wakes 100 times a second costs ~1.5 % of a core, this loop ~0.6 %).
 *
 * The caller opens the counter files (sysfs re-reads a fresh value at offset 0) and hands the
 * descriptors over; one call samples `ticks` times on absolute CLOCK_MONOTONIC deadlines and
 * returns, so the caller wakes once per batch. ctypes releases the GIL around the call.
 *
 * crux_sample_batch_at also reads binary counters: a native-order u64 at an offset of a small
 * regular file, as the TCP interposer's per-process records hold each process's bytes sent
 * (shim/crux_sockrec.h; cruxd/measure/sampling/job_bytes.py). One pread of 8 bytes, as cheap
 * as a sysfs read; the caller opened the file without trusting it (no links, no FIFOs).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define NS 1000000000LL

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * NS + ts.tv_nsec;
}

/* One counter: its value, or -errno (-EINVAL for text that is not a number). */
static int64_t read_counter(int fd)
{
	char buf[64];
	ssize_t n;
	char *end;
	unsigned long long v;

	if (fd < 0)
		return -EBADF;
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	if (n < 0)
		return -errno;
	buf[n] = '\0';
	errno = 0;
	v = strtoull(buf, &end, 10);
	if (end == buf || errno != 0 || v > INT64_MAX)
		return -EINVAL;
	return (int64_t)v;
}

/* A binary counter: the u64 at `offset`, or -errno (-EIO for a short read: a truncated file;
 * -EINVAL for a value past INT64_MAX, which no byte count reaches). */
static int64_t read_binary(int fd, int64_t offset)
{
	uint64_t v;
	ssize_t n;

	if (fd < 0)
		return -EBADF;
	n = pread(fd, &v, sizeof(v), (off_t)offset);
	if (n < 0)
		return -errno;
	if (n != (ssize_t)sizeof(v))
		return -EIO;
	if (v > INT64_MAX)
		return -EINVAL;
	return (int64_t)v;
}

/*
 * Sample the `n` counters in `fds` `ticks` times, one tick every `period_ns`.
 * offsets: NULL, or per counter -1 for a text counter (sysfs) or the offset of a binary one.
 * *deadline_ns: the absolute monotonic time of the next tick (0: now); advanced per tick,
 *   and moved to now when the loop fell more than a period behind (a suspended host), so
 *   the grid restarts with a gap instead of a burst of catch-up samples.
 * t[i]: the tick's monotonic time in seconds (what Python's time.monotonic() reads);
 * values[i * n + k]: counter k at tick i, or -errno.
 * *stop: checked every tick; when non-zero the call returns early.
 * Returns the number of ticks taken, or -EINVAL for bad arguments.
 */
int crux_sample_batch_at(const int *fds, const int64_t *offsets, unsigned n, int64_t period_ns,
			 int64_t *deadline_ns, unsigned ticks, const volatile int *stop, double *t,
			 int64_t *values)
{
	unsigned i, k;
	int64_t now;
	struct timespec ts;

	if (period_ns <= 0 || !deadline_ns || !stop || !t || (n && (!fds || !values)))
		return -EINVAL;
	if (*deadline_ns == 0)
		*deadline_ns = now_ns();
	for (i = 0; i < ticks; i++) {
		ts.tv_sec = *deadline_ns / NS;
		ts.tv_nsec = *deadline_ns % NS;
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
		if (*stop)
			break;
		now = now_ns();
		t[i] = (double)now / NS;
		for (k = 0; k < n; k++)
			values[(size_t)i * n + k] = offsets && offsets[k] >= 0
				? read_binary(fds[k], offsets[k]) : read_counter(fds[k]);
		*deadline_ns += period_ns;
		if (now - *deadline_ns > period_ns)
			*deadline_ns = now + period_ns;
	}
	return (int)i;
}

/* Text counters only (the first interface; bench/measure.py and older callers). */
int crux_sample_batch(const int *fds, unsigned n, int64_t period_ns, int64_t *deadline_ns,
		      unsigned ticks, const volatile int *stop, double *t, int64_t *values)
{
	return crux_sample_batch_at(fds, NULL, n, period_ns, deadline_ns, ticks, stop, t, values);
}
