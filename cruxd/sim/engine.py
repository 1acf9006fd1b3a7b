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


@dataclass
class _Window:
    """What one `Engine.run` advances: per-job arrays (the `JobState` fields, and
    what the window has measured so far) and how far it has got."""

    start: np.ndarray
    comm_at: np.ndarray
    remaining: np.ndarray
    comm_done: np.ndarray
    begin: np.ndarray
    busy: np.ndarray  # GPU-seconds of compute booked inside the window
    iters: np.ndarray
    first_end: np.ndarray
    last_end: np.ndarray
    link_bytes: np.ndarray
    now: float
    t1: float  # the window's end (pulled in when a job reaches its budget)
    speed: np.ndarray  # collectives per second of each job sending
    sending: np.ndarray | None = None  # who was sending when `speed` was set


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
        self._solver: tuple[np.ndarray, np.ndarray] | None = None

    def _distinct_links(self) -> tuple[np.ndarray, np.ndarray]:
        """The weights and capacities of the links that differ in either, once each.
        Links alike (same capacity, same weight from every job: a ring's host links,
        mostly) fill at the same instant, so the rates are the same over one of them:
        exactly, as every share is computed from the same numbers. On an ECMP Clos run
        a component's ~1,600 links come down to ~50, and the solve's time scales with
        them. Built at the first `run`: most engines are planned from cached rates and
        never run."""
        if self._solver is None:
            links = np.ascontiguousarray(np.vstack([self.capacity[None, :], self.weights]).T)
            first: dict[bytes, int] = {}
            for e, link in enumerate(links):  # 10x np.unique(axis=0), which sorts
                first.setdefault(link.tobytes(), e)
            keep = np.fromiter(first.values(), dtype=np.intp, count=len(first))
            self._solver = (np.ascontiguousarray(self.weights[:, keep]),
                            np.ascontiguousarray(self.capacity[keep]))
        return self._solver

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
        """Advance `states` from t0 to t1, or to the end of the iteration in which a
        job reaches its budget, and report what the jobs did.

        Steps: load the states into per-job arrays (`_open`); then, event by event,
        1. share the bandwidth among the collectives sending now (`_share_bandwidth`),
        2. find the next event and move time to it, sending bytes (`_step`),
        3. start the latency tail of collectives whose last byte is out
           (`_start_latency`),
        4. end the iterations that are complete, stopping at a budget (`_end_iterations`);
        finally write the arrays back into `states` (`_save`) and report (`_report`).
        """
        w = self._open(states, t0, t1)
        while w.now < w.t1 - _EPS:
            sending = (w.comm_at <= w.now + _EPS) & (w.remaining > _EPS)
            self._share_bandwidth(w, sending)
            self._step(w, sending)
            self._start_latency(w, sending)
            if self._end_iterations(w):
                break
        _save(w, states)
        return _report(w, t0, self.budget)

    def _open(self, states: list[JobState], t0: float, t1: float) -> _Window:
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
        return _Window(start=start, comm_at=comm_at, remaining=remaining, comm_done=comm_done,
                       begin=begin, busy=busy, iters=np.zeros(n),
                       first_end=np.full(n, np.nan), last_end=np.full(n, np.nan),
                       link_bytes=np.zeros(self.m_bytes.shape[1]), now=t0, t1=t1,
                       speed=np.zeros(n))

    def _share_bandwidth(self, w: _Window, sending: np.ndarray) -> None:
        """Rates change only when the set of collectives sending does."""
        if w.sending is not None and np.array_equal(sending, w.sending):
            return
        w.speed = np.zeros(len(sending))
        idx = np.flatnonzero(sending)
        if len(idx):
            weights, capacity = self._distinct_links()
            rho = allocate(weights[idx], capacity, self.level[idx])
            w.speed[idx] = rho / self.mean_flow[idx]  # collectives per second
        w.sending = sending

    def _step(self, w: _Window, sending: np.ndarray) -> None:
        """Move `now` to the next event (or the window's end), sending bytes meanwhile."""
        nxt = np.full(len(sending), np.inf)
        waiting = (w.comm_at > w.now + _EPS) & (w.remaining > _EPS)
        nxt[waiting] = w.comm_at[waiting]
        moving = sending & (w.speed > 0)
        nxt[moving] = w.now + w.remaining[moving] / w.speed[moving]
        done_bytes = w.remaining <= _EPS
        tail = done_bytes & (w.comm_done > w.now + _EPS)
        nxt[tail] = w.comm_done[tail]
        ends = done_bytes & ~tail
        nxt[ends] = np.maximum(w.start[ends] + self.compute_s[ends], w.comm_done[ends])
        t = max(w.now, min(float(nxt.min()), w.t1))
        dt = t - w.now
        if dt <= 0:
            # a transfer whose last bytes would take less than the float spacing
            # at `now`: it is done, or the loop would not advance
            w.remaining[moving & (nxt <= w.now)] = 0.0
        if dt > 0 and moving.any():
            sent = np.minimum(w.speed[moving] * dt, w.remaining[moving])
            w.remaining[moving] -= sent
            w.link_bytes += sent @ self.m_bytes[moving]
        w.now = t

    def _start_latency(self, w: _Window, sending: np.ndarray) -> None:
        """Bytes finished: the collective completes after its path latency."""
        fin = sending & (w.remaining <= _EPS) & ~np.isfinite(w.comm_done)
        w.remaining[fin] = 0.0
        w.comm_done[fin] = w.now + self.alpha[fin]

    def _end_iterations(self, w: _Window) -> bool:
        """Book the iterations that end now and start the next ones; True when a job
        used up its work, which stops the window here (the caller re-plans)."""
        over = (w.remaining <= _EPS) & (w.comm_done <= w.now + _EPS) & (
            w.start + self.compute_s <= w.now + _EPS)
        if not over.any():
            return False
        w.iters[over] += 1
        w.first_end[over & np.isnan(w.first_end)] = w.now
        w.last_end[over] = w.now
        w.start[over] = w.now
        w.comm_at[over] = w.now + (1.0 - self.overlap[over]) * self.compute_s[over]
        w.remaining[over] = np.where(self.networked[over], 1.0, 0.0)
        w.comm_done[over] = np.where(self.networked[over], np.inf, w.comm_at[over])
        w.busy[over] += self.gpus[over] * _overlap(
            w.start[over], w.start[over] + self.compute_s[over], w.now, w.t1)
        if not (over & (w.iters >= self.budget)).any():
            return False
        # compute booked past `now` belongs to later windows
        w.busy -= self.gpus * _overlap(w.start, w.start + self.compute_s,
                                       np.maximum(w.now, w.begin), w.t1)
        w.t1 = w.now
        return True


def _save(w: _Window, states: list[JobState]) -> None:
    for i, s in enumerate(states):
        s.start, s.comm_at, s.remaining = float(w.start[i]), float(w.comm_at[i]), float(
            w.remaining[i])
        s.comm_done = float(w.comm_done[i])
        s.iterations += float(w.iters[i])


def _report(w: _Window, t0: float, budget: np.ndarray) -> WindowResult:
    finished = w.iters >= budget
    # within _EPS of the window's end counts as its end: reporting the instant
    # just before would leave the caller a sliver of window that never advances
    end = w.t1 if w.now >= w.t1 - _EPS else w.now
    return WindowResult(start=t0, end=end, busy=w.busy, iterations=w.iters,
                        finished=finished, link_bytes=w.link_bytes, first_end=w.first_end,
                        last_end=w.last_end)


def _overlap(a0: np.ndarray, a1: np.ndarray, b0: np.ndarray | float, b1: float) -> np.ndarray:
    out: np.ndarray = np.maximum(0.0, np.minimum(a1, b1) - np.maximum(a0, b0))
    return out
