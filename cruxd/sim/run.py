"""Trace-driven runs: epochs between arrivals and departures, one policy.

Within an epoch the running jobs, their paths and levels are fixed, so it is
simulated event by event (`engine`). Long epochs are not simulated to the end: the
first `window` seconds are (at least `window_periods` iterations of the slowest
job), each job's rates (iterations, busy GPU time, bytes per link) are measured
there and extrapolated to the epoch's end, and the job states are shifted in time
so the next epoch starts with the same relative phases. Jobs with an iteration
budget leave when it is used up (exactly inside a simulated window, else at the
extrapolated time), which ends the epoch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np

from cruxd.model.jobs import Job
from cruxd.model.paths import PathFinder, finder_for
from cruxd.model.topology import Topology
from cruxd.scheduler.selection import standalone_comm_time
from cruxd.sim.engine import Engine, JobState, initial_state
from cruxd.sim.epoch import Component, components
from cruxd.sim.flow_hash import hash_path, source_port
from cruxd.sim.metrics import JobRecord, SimResult
from cruxd.sim.policies.base import Context, Decisions, Policy, network_flows

_EPS = 1e-9


@dataclass(frozen=True)
class SimJob:
    job: Job
    arrival_s: float = 0.0
    iterations: float | None = None  # work; None: runs to the horizon
    start_phase: str = "compute"  # or "comm": the first iteration begins with its collective


@dataclass(frozen=True)
class SimConfig:
    horizon_s: float = math.inf
    levels: int = 8  # priority levels of the fabric (the seed's simulator: 8)
    seed: int = 0
    window_s: float = 20.0  # simulated part of a long epoch
    window_periods: float = 10.0  # ... at least this many iterations of its slowest job
    replan_every_s: float | None = None  # periodic re-decisions (crux-fair's window)
    max_paths: int = 64


@dataclass
class _Running:
    sim: SimJob
    state: JobState
    record: JobRecord
    period: float  # standalone iteration time
    budget_left: float = math.inf
    recent: list[tuple[float, float]] = field(default_factory=list)  # (dt, iterations)
    load: _Load | None = None  # its traffic under the current decisions
    ecmp_load: _Load | None = None  # its traffic when no flow has a decided path (fixed)


def simulate(jobs: list[SimJob], topo: Topology, policy: Policy, config: SimConfig,
             progress: Callable[[float], None] | None = None) -> SimResult:
    finder = finder_for(topo, config.max_paths)
    pending = sorted(jobs, key=lambda s: (s.arrival_s, s.job.id))
    horizon = config.horizon_s
    if not math.isfinite(horizon) and any(s.iterations is None for s in jobs):
        raise ValueError("jobs without an iteration budget need a finite horizon")
    running: dict[str, _Running] = {}
    records: list[JobRecord] = []
    series: list[tuple[float, float, float, float]] = []
    link_bytes = np.zeros(len(topo.links))
    now = pending[0].arrival_s if pending else 0.0
    decisions = Decisions()
    next_replan = math.inf
    replan_every = config.replan_every_s or getattr(policy, "replan_every_s", None)
    changed = True
    new: set[str] = set()
    cache: dict[Hashable, np.ndarray] = {}  # steady rates per component signature
    while now < horizon and (pending or running):
        while pending and pending[0].arrival_s <= now + _EPS:
            s = pending.pop(0)
            running[s.job.id] = _admit(s, now, finder)
            new.add(s.job.id)
            changed = True
        if changed or now >= next_replan - _EPS:
            ctx = Context(topo, finder, tuple(r.sim.job for r in running.values()),
                          frozenset(new), now, config.levels, _throughput(running), config.seed)
            decisions = policy.decide(ctx)
            if not getattr(policy, "ideal_levels", False):
                decisions = _fit_levels(decisions, config.levels)
            for jid in new:  # CASSINI-style start offsets apply to new jobs only
                off = decisions.offset_s.get(jid, 0.0)
                if off > 0:
                    r = running[jid]
                    r.state = initial_state(now + off, r.sim.job.compute_s, r.sim.job.overlap,
                                            r.sim.start_phase)
            for r in running.values():
                if decisions.paths.get(r.sim.job.id):
                    r.load = _job_load(topo, finder, r, decisions, config)
                else:  # all ECMP: depends on the job and the seed only
                    if r.ecmp_load is None:
                        r.ecmp_load = _job_load(topo, finder, r, decisions, config)
                    r.load = r.ecmp_load
            new.clear()
            changed = False
            if replan_every:
                next_replan = now + replan_every
        end = min(pending[0].arrival_s if pending else math.inf, horizon, next_replan)
        if end - now <= _EPS:  # nothing left of this epoch but rounding
            now = end
            continue
        if not running:
            now = end
            continue
        order = list(running)
        parts = _components(topo, running, order, decisions, config)
        stop = min([end, *(comp.plan(now, end, cache) for _, _, comp in parts)])
        finished: set[str] = set()
        busy_total = 0.0
        for ids, used, comp in parts:
            adv = comp.advance(now, stop)
            link_bytes[used] += adv.link_bytes
            busy_total += float(adv.busy.sum())
            for k, j in enumerate(ids):
                r = running[j]
                r.budget_left -= float(adv.iterations[k])
                r.record.busy_gpu_s += float(adv.busy[k])
                r.record.iterations += float(adv.iterations[k])
                r.recent.append((stop - now, float(adv.iterations[k])))
                if adv.finished[k]:
                    finished.add(j)
        alloc = sum(running[j].sim.job.gpus for j in order) * (stop - now)
        series.append((now, stop, busy_total, alloc))
        now = stop
        for j in sorted(finished):
            r = running.pop(j)
            r.record.end_s = now
            records.append(r.record)
            changed = True
        if progress is not None:
            progress(now)
    for r in running.values():
        r.record.end_s = min(now, horizon)
        records.append(r.record)
    return SimResult(policy=policy.name, horizon_s=min(now, horizon), jobs=records,
                     series=series, link_bytes=link_bytes, topology=topo)


def _admit(s: SimJob, now: float, finder: PathFinder) -> _Running:
    job = s.job
    cap = finder.topo.capacity
    flows = [(c, 1.0 / cap[c], f.bytes) for f in job.flows if f.src != f.dst
             for c in [finder.candidates(f.src, f.dst, f.src_port, f.dst_port)]]
    t = standalone_comm_time(flows, cap, np.zeros(len(cap))) if flows else 0.0
    alpha = max((finder.topo.path_latency(c[0]) for c, _, _ in flows), default=0.0)
    comm = t + alpha if flows else 0.0
    period = max(job.compute_s, (1.0 - job.overlap) * job.compute_s + comm)
    record = JobRecord(job=job.id, gpus=job.gpus, arrival_s=s.arrival_s, start_s=now,
                       standalone_period_s=period, iterations_goal=s.iterations)
    state = initial_state(now, job.compute_s, job.overlap, s.start_phase)
    budget = s.iterations if s.iterations is not None else math.inf
    return _Running(s, state, record, period, budget)


@dataclass(frozen=True)
class _Load:
    """A job's traffic under one set of decisions."""

    bytes_on: dict[int, float]  # link -> bytes per iteration
    alpha: float  # path latency of its slowest flow (s)
    mean_flow: float  # mean bytes of its flows
    key: tuple[tuple[int, float], ...]  # for cache signatures


def _job_load(topo: Topology, finder: PathFinder, r: _Running, decisions: Decisions,
              config: SimConfig) -> _Load:
    job = r.sim.job
    chosen = decisions.paths.get(job.id, ())
    loads: dict[int, float] = {}
    alpha = 0.0
    idx = network_flows(job)
    for k, fi in enumerate(idx):
        f = job.flows[fi]
        path = chosen[k] if k < len(chosen) and chosen[k] is not None else None
        if path is None:
            path = hash_path(finder, f, source_port(job.id, fi, config.seed), config.seed)
        for link in path.tolist():
            loads[link] = loads.get(link, 0.0) + f.bytes
        alpha = max(alpha, topo.path_latency(path))
    mean = float(np.mean([job.flows[i].bytes for i in idx])) if idx else 0.0
    return _Load(loads, alpha, mean, tuple(sorted(loads.items())))


def _components(topo: Topology, running: dict[str, _Running], order: list[str],
                decisions: Decisions, config: SimConfig
                ) -> list[tuple[list[str], np.ndarray, Component]]:
    """The epoch's contention components, each with its own engine."""
    loads = {j: _loaded(running[j]) for j in order}
    parts = []
    for group in components([set(loads[j].bytes_on) for j in order]):
        ids = sorted(order[i] for i in group)
        runs = [running[j] for j in ids]
        levels = [decisions.level.get(j, 0) for j in ids]
        rank = {v: i for i, v in enumerate(sorted(set(levels)))}  # only the order matters
        dense = [rank[v] for v in levels]
        used = np.array(sorted({link for j in ids for link in loads[j].bytes_on}),
                        dtype=np.int64)
        col = {int(link): c for c, link in enumerate(used)}
        m = np.zeros((len(runs), len(used)))
        for i, j in enumerate(ids):
            for link, b in loads[j].bytes_on.items():
                m[i, col[link]] = b
        engine = Engine(
            compute_s=np.array([r.sim.job.compute_s for r in runs]),
            overlap=np.array([r.sim.job.overlap for r in runs]),
            gpus=np.array([float(r.sim.job.gpus) for r in runs]),
            m_bytes=m, mean_flow=np.array([loads[j].mean_flow for j in ids]),
            capacity=topo.capacity[used] * 1e9 / 8.0, level=np.array(dense),
            alpha=np.array([loads[j].alpha for j in ids]),
            budget=np.array([math.ceil(r.budget_left - 1e-9) if math.isfinite(r.budget_left)
                             else math.inf for r in runs], dtype=np.float64))
        window = max(config.window_s, config.window_periods * max(r.period for r in runs))
        signature = tuple((j, d, loads[j].key) for j, d in zip(ids, dense, strict=True))
        parts.append((ids, used, Component(engine, [r.state for r in runs],
                                           np.array([r.budget_left for r in runs]),
                                           signature, window)))
    return parts


def _loaded(r: _Running) -> _Load:
    if r.load is None:  # pragma: no cover - loads are set at every decision
        raise AssertionError(f"job {r.sim.job.id} has no traffic computed")
    return r.load


def _throughput(running: dict[str, _Running], window: int = 3) -> dict[str, float]:
    """Recent throughput over standalone, from the last few epochs of each job."""
    out = {}
    for j, r in running.items():
        span = sum(dt for dt, _ in r.recent[-window:])
        if span > 0:
            out[j] = sum(it for _, it in r.recent[-window:]) / span * r.period
    return out


def _fit_levels(decisions: Decisions, levels: int) -> Decisions:
    """Squash a policy's priorities onto the fabric's levels the way a scheduler
    without compression would (seed §4.3, Sincronia): the top levels-1 priorities
    keep a level each, every lower one shares the lowest."""
    distinct = sorted(set(decisions.level.values()), reverse=True)
    if len(distinct) <= levels:
        return decisions
    place = {v: max(levels - 1 - i, 0) for i, v in enumerate(distinct)}
    return Decisions(level={j: place[v] for j, v in decisions.level.items()},
                     paths=decisions.paths, offset_s=decisions.offset_s)
