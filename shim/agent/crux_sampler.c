/* crux_sampler.c - the agent's NIC counter loop, in C so that 100 wakeups a second cost
 * what the kernel charges for them and not what the Python interpreter adds (bench/measure.py:
 * a Python thread that only wakes 100 times a second costs ~1.5 % of a core, this loop ~0.6 %).
 *
 * The caller opens the counter files (sysfs re-reads a fresh value at offset 0) and hands the
 * descriptors over; one call samples `ticks` times on absolute CLOCK_MONOTONIC deadlines and
 * returns, so the caller wakes once per batch. ctypes releases the GIL around the call.
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

/*
 * Sample the `n` counters in `fds` `ticks` times, one tick every `period_ns`.
 * *deadline_ns: the absolute monotonic time of the next tick (0: now); advanced per tick,
 *   and moved to now when the loop fell more than a period behind (a suspended host), so
 *   the grid restarts with a gap instead of a burst of catch-up samples.
 * t[i]: the tick's monotonic time in seconds (what Python's time.monotonic() reads);
 * values[i * n + k]: counter k at tick i, or -errno.
 * *stop: checked every tick; when non-zero the call returns early.
 * Returns the number of ticks taken, or -EINVAL for bad arguments.
 */
int crux_sample_batch(const int *fds, unsigned n, int64_t period_ns, int64_t *deadline_ns,
		      unsigned ticks, const volatile int *stop, double *t, int64_t *values)
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
			values[(size_t)i * n + k] = read_counter(fds[k]);
		*deadline_ns += period_ns;
		if (now - *deadline_ns > period_ns)
			*deadline_ns = now + period_ns;
	}
	return (int)i;
}
