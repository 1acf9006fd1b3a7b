"""Event-driven simulation of a fixed set of iterative jobs over a time window.

A job iterates: compute for `compute_s` (its GPUs busy); its collective may start
once (1 - overlap) of the compute is done and needs its bytes on every link of its
paths; after the last byte, the path latency (alpha); the next iteration starts
when both compute and communication are done. Between events rates are constant
(`rates.allocate`), so progress is exact: no per-packet work, no time steps.
Events: a collective starts, finishes its bytes, finishes its latency; an
iteration ends; a job reaches its iteration budget; the window ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cruxd.sim.rates import allocate

_EPS = 1e-9


@dataclass
class JobState:
    """Where one job is; carried from window to window (all times absolute)."""

    start: float  # current iteration's start (compute begins)
    comm_at: float  # when its collective may start
    remaining: float = 1.0  # fraction of the collective's bytes still to send
    comm_done: float = np.inf  # when the collective (bytes + latency) completed
    begin: float = 0.0  # first moment the job runs (arrival + offset)
    iterations: float = 0.0  # completed (fractional after extrapolation)

    def shift(self, dt: float) -> None:
        self.start += dt
        self.comm_at += dt
        self.begin += dt
        if np.isfinite(self.comm_done):
            self.comm_done += dt


def initial_state(at: float, compute_s: float, overlap: float, phase: str) -> JobState:
    """A job that begins at `at`, with compute first or with its collective first
    (the seed's Fig. 11 timeline: communication at t = 0, then compute)."""
    head = (1.0 - overlap) * compute_s
    start = at if phase == "compute" else at - head
    return JobState(start=start, comm_at=start + head, begin=at)


@dataclass
class WindowResult:
    start: float
    end: float  # where the window stopped (early when a job used up its budget)
    busy: np.ndarray  # GPU-seconds of compute per job inside the window
    iterations: np.ndarray  # iterations completed per job inside the window
    finished: np.ndarray  # jobs that reached their iteration budget
    link_bytes: np.ndarray  # bytes carried per link (over `links`)
    first_end: np.ndarray  # when each job's first iteration inside the window ended
    last_end: np.ndarray  # ... and its last one (nan: none)

    def steady_rate(self) -> np.ndarray:
        """Iterations per second between the first and the last iteration end: exact
        for a periodic regime, unlike a count over a window that cuts iterations."""
        span = self.last_end - self.first_end
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = np.where(self.iterations >= 2, (self.iterations - 1) / span, np.nan)
        window = self.end - self.start
        fallback = self.iterations / window if window > 0 else np.zeros_like(rate)
        out: np.ndarray = np.where(np.isfinite(rate), rate, fallback)
        return out


class Engine:
    """One set of jobs with fixed paths and levels.

    m_bytes: (jobs, links) bytes per iteration on each link in play; mean_flow:
    mean bytes of a job's flows; capacity: bytes/s per link in play; level: larger
    = higher priority; alpha: per-job path latency (s).
    """

    def __init__(self, *, compute_s: np.ndarray, overlap: np.ndarray, gpus: np.ndarray,
                 m_bytes: np.ndarray, mean_flow: np.ndarray, capacity: np.ndarray,
                 level: np.ndarray, alpha: np.ndarray, budget: np.ndarray) -> None:
        self.compute_s, self.overlap, self.gpus = compute_s, overlap, gpus
        self.m_bytes, self.capacity, self.level, self.alpha = m_bytes, capacity, level, alpha
        self.budget = budget  # iterations still allowed per job (inf: unbounded)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.weights = np.where(mean_flow[:, None] > 0, m_bytes / mean_flow[:, None], 0.0)
        self.mean_flow = mean_flow
        self.networked = m_bytes.sum(axis=1) > 0

    def alone_rate(self) -> np.ndarray:
        """Iterations per second of each job as if it had the fabric to itself: its
        collective takes max_e M_e / B_e plus its latency (exact for a job that
        shares no link, whatever its phase)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            comm = np.where(self.networked,
                            (self.m_bytes / self.capacity).max(axis=1, initial=0.0) + self.alpha,
                            0.0)
        period = np.maximum(self.compute_s, (1.0 - self.overlap) * self.compute_s + comm)
        rate: np.ndarray = 1.0 / period
        return rate

    def run(self, states: list[JobState], t0: float, t1: float) -> WindowResult:
        n = len(states)
        start = np.array([s.start for s in states])
        comm_at = np.array([s.comm_at for s in states])
        remaining = np.array([s.remaining for s in states])
        comm_done = np.array([s.comm_done for s in states])
        begin = np.array([s.begin for s in states])
        # jobs without network traffic finish their collective at once
        remaining[~self.networked] = 0.0
        comm_done = np.where(~self.networked & ~np.isfinite(comm_done), comm_at, comm_done)
        busy = self.gpus * _overlap(start, start + self.compute_s, np.maximum(t0, begin), t1)
        iters = np.zeros(n)
        first_end = np.full(n, np.nan)
        last_end = np.full(n, np.nan)
        link_bytes = np.zeros(self.m_bytes.shape[1])
        now = t0
        sending_prev: np.ndarray | None = None
        speed = np.zeros(n)
        while now < t1 - _EPS:
            sending = (comm_at <= now + _EPS) & (remaining > _EPS)
            if sending_prev is None or not np.array_equal(sending, sending_prev):
                speed = np.zeros(n)
                idx = np.flatnonzero(sending)
                if len(idx):
                    rho = allocate(self.weights[idx], self.capacity, self.level[idx])
                    speed[idx] = rho / self.mean_flow[idx]  # collectives per second
                sending_prev = sending
            nxt = np.full(n, np.inf)
            waiting = (comm_at > now + _EPS) & (remaining > _EPS)
            nxt[waiting] = comm_at[waiting]
            moving = sending & (speed > 0)
            nxt[moving] = now + remaining[moving] / speed[moving]
            done_bytes = remaining <= _EPS
            tail = done_bytes & (comm_done > now + _EPS)
            nxt[tail] = comm_done[tail]
            ends = done_bytes & ~tail
            nxt[ends] = np.maximum(start[ends] + self.compute_s[ends], comm_done[ends])
            t = max(now, min(float(nxt.min()), t1))
            dt = t - now
            if dt <= 0:
                # a transfer whose last bytes would take less than the float spacing
                # at `now`: it is done, or the loop would not advance
                remaining[moving & (nxt <= now)] = 0.0
            if dt > 0 and moving.any():
                sent = np.minimum(speed[moving] * dt, remaining[moving])
                remaining[moving] -= sent
                link_bytes += sent @ self.m_bytes[moving]
            now = t
            # bytes finished: the latency tail starts
            fin = sending & (remaining <= _EPS) & ~np.isfinite(comm_done)
            remaining[fin] = 0.0
            comm_done[fin] = now + self.alpha[fin]
            # iterations that end now
            over = (remaining <= _EPS) & (comm_done <= now + _EPS) & (
                start + self.compute_s <= now + _EPS)
            if over.any():
                iters[over] += 1
                first_end[over & np.isnan(first_end)] = now
                last_end[over] = now
                start[over] = now
                comm_at[over] = now + (1.0 - self.overlap[over]) * self.compute_s[over]
                remaining[over] = np.where(self.networked[over], 1.0, 0.0)
                comm_done[over] = np.where(self.networked[over], np.inf, comm_at[over])
                busy[over] += self.gpus[over] * _overlap(
                    start[over], start[over] + self.compute_s[over], now, t1)
                if (over & (iters >= self.budget)).any():
                    # a job used up its work: the window stops here (the caller
                    # re-plans); compute booked past `now` belongs to later windows
                    busy -= self.gpus * _overlap(start, start + self.compute_s,
                                                 np.maximum(now, begin), t1)
                    t1 = now
                    break
        for i, s in enumerate(states):
            s.start, s.comm_at, s.remaining = float(start[i]), float(comm_at[i]), float(
                remaining[i])
            s.comm_done = float(comm_done[i])
            s.iterations += float(iters[i])
        finished = iters >= self.budget
        # within _EPS of the window's end counts as its end: reporting the instant
        # just before would leave the caller a sliver of window that never advances
        end = t1 if now >= t1 - _EPS else now
        return WindowResult(start=t0, end=end, busy=busy, iterations=iters,
                            finished=finished, link_bytes=link_bytes, first_end=first_end,
                            last_end=last_end)


def _overlap(a0: np.ndarray, a1: np.ndarray, b0: np.ndarray | float, b1: float) -> np.ndarray:
    out: np.ndarray = np.maximum(0.0, np.minimum(a1, b1) - np.maximum(a0, b0))
    return out
