"""CASSINI (Rajasekaran et al., NSDI'24) as an inter-job baseline (seed §6.3).

CASSINI interleaves jobs in time instead of ranking them: no priorities (every job
on level 0), ECMP paths, and a start offset per newly arrived job so that the
communication phases of jobs that share links do not overlap.

Model: job j repeats with period P_j = max(c_j, (1 - o_j) c_j + t_j) and is busy on
the network in [(1 - o_j) c_j, (1 - o_j) c_j + t_j) of each period (relative to its
start), t_j = max_e M_{j,e} / B_e on its ECMP-hashed paths plus the longest path
latency (what the run uses for the standalone period). New jobs are placed one at a
time in id order: each tries `grid` offsets x = P_j i / grid, i < grid, and keeps the
one (the smallest on ties) whose busy windows overlap least, in total over a
horizon of `horizon_periods` x the longest period involved, with the busy windows of
the jobs it shares at least one link with. Jobs placed earlier in the same decision
count with their chosen offset; jobs already running are assumed to start an
iteration at ctx.now (phase 0): the simulator does not tell a policy where they are,
and CASSINI itself only re-aligns at arrivals. See docs/baselines.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cruxd.model.jobs import Job
from cruxd.sim.flow_hash import hash_path, source_port
from cruxd.sim.policies.base import Context, Decisions, network_flows

_REL = 1e-9  # ties between offsets: overlaps within _REL x horizon


@dataclass(frozen=True)
class Profile:
    links: frozenset[int]  # links its ECMP paths use
    period: float  # P_j
    head: float  # (1 - o) c: where the busy window starts in a period
    comm: float  # t_j: length of the busy window


def profile(ctx: Context, job: Job) -> Profile:
    loads: dict[int, float] = {}
    alpha = 0.0
    for fi in network_flows(job):
        f = job.flows[fi]
        path = hash_path(ctx.finder, f, source_port(job.id, fi, ctx.seed), ctx.seed)
        for link in path.tolist():
            loads[link] = loads.get(link, 0.0) + f.bytes
        latency = ctx.topology.path_latency(path)
        alpha = max(alpha, latency)
    cap = ctx.topology.capacity
    t = max((b * 8.0 / (cap[e] * 1e9) for e, b in loads.items()), default=0.0)
    comm = t + alpha if loads else 0.0
    head = (1.0 - job.overlap) * job.compute_s
    return Profile(frozenset(loads), max(job.compute_s, head + comm), head, comm)


def windows(p: Profile, phase: float, horizon: float, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """Busy windows (starts, ends) of a job starting an iteration at `phase`, cut to
    [0, horizon); at most `cap` of them."""
    first = phase + p.head
    count = 0 if first >= horizon else min(cap, math.ceil((horizon - first) / p.period))
    starts = first + p.period * np.arange(count)
    return starts, np.minimum(starts + p.comm, horizon)


def busy_integral(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Breakpoints and values of B(t) = integral over [0, t] of the number of busy
    windows covering the time: piecewise linear, so np.interp evaluates it exactly."""
    pts = np.concatenate([starts, ends])
    step = np.concatenate([np.ones(len(starts)), -np.ones(len(ends))])
    order = np.argsort(pts, kind="stable")
    pts, step = pts[order], step[order]
    count = np.cumsum(step)  # windows covering the time just after each point
    values = np.concatenate([[0.0], np.cumsum(count[:-1] * np.diff(pts))])
    return pts, values


class Cassini:
    name = "cassini"

    def __init__(self, grid: int = 32, horizon_periods: float = 4.0,
                 max_windows: int = 1024) -> None:
        self.grid, self.horizon_periods, self.max_windows = grid, horizon_periods, max_windows

    def decide(self, ctx: Context) -> Decisions:
        if not ctx.new:
            return Decisions()
        jobs = sorted(ctx.jobs, key=lambda j: j.id)
        prof = {j.id: profile(ctx, j) for j in jobs}
        phase = {j.id: 0.0 for j in jobs if j.id not in ctx.new}
        offsets: dict[str, float] = {}
        for job in jobs:
            if job.id not in ctx.new:
                continue
            offsets[job.id] = phase[job.id] = self._place(prof[job.id], [
                (prof[o], ph) for o, ph in phase.items()
                if o != job.id and prof[o].comm > 0 and prof[o].links & prof[job.id].links])
        return Decisions(offset_s=offsets)

    def _place(self, me: Profile, others: list[tuple[Profile, float]]) -> float:
        if not others or me.comm <= 0:
            return 0.0
        horizon = self.horizon_periods * max(me.period, *(p.period for p, _ in others))
        spans = [windows(p, ph, horizon, self.max_windows) for p, ph in others]
        pts, values = busy_integral(np.concatenate([s for s, _ in spans]),
                                    np.concatenate([e for _, e in spans]))
        if len(pts) == 0:
            return 0.0
        offset = me.period * np.arange(self.grid) / self.grid
        count = min(self.max_windows, math.ceil(horizon / me.period) + 1)
        starts = offset[:, None] + me.head + me.period * np.arange(count)[None, :]
        starts = np.minimum(starts, horizon)
        ends = np.minimum(starts + me.comm, horizon)
        overlap = (np.interp(ends, pts, values) - np.interp(starts, pts, values)).sum(axis=1)
        best = int(np.flatnonzero(overlap <= overlap.min() + _REL * horizon)[0])
        return float(offset[best])
