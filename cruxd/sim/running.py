"""The jobs of a trace-driven run while they run (`run`): where each one is, what it
has done, its traffic under the policy's current decisions, and the epoch's
contention components built from them, one engine each (`epoch`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from cruxd.errors import PlanningError
from cruxd.model.jobs import FlowSpec, Job
from cruxd.model.paths import PathFinder
from cruxd.model.topology import Topology
from cruxd.sim.engine import Engine, JobState
from cruxd.sim.epoch import Component, components
from cruxd.sim.flow_hash import hash_path, source_port
from cruxd.sim.metrics import JobRecord
from cruxd.sim.policies.base import Decisions, network_flows

# per component: its job ids (sorted), the links it uses, its engine and states
EpochPart = tuple[list[str], np.ndarray, Component]


@dataclass(frozen=True)
class TrafficLoad:
    """A job's traffic under one set of decisions."""

    bytes_on: dict[int, float]  # link -> bytes per iteration
    alpha: float  # path latency of its slowest flow (s)
    mean_flow: float  # mean bytes of its flows
    key: tuple[tuple[int, float], ...]  # for cache signatures


@dataclass
class RunningJob:
    job: Job
    start_phase: str  # "compute" or "comm": how its first iteration begins
    state: JobState
    record: JobRecord
    period: float  # standalone iteration time
    budget_left: float = math.inf
    recent: list[tuple[float, float]] = field(default_factory=list)  # (dt, iterations)
    lived_s: float = 0.0  # time booked since it started (its record's active time so far)
    load: TrafficLoad | None = None  # its traffic under the current decisions
    ecmp_load: TrafficLoad | None = None  # its traffic when no flow has a decided path (fixed)
    spray_load: TrafficLoad | None = None  # ... and when the fabric sprays them (fixed too)

    def book(self, iterations: float, busy_gpu_s: float, dt: float) -> None:
        """Credit what the job did over an epoch of `dt` seconds."""
        self.budget_left -= iterations
        self.record.busy_gpu_s += busy_gpu_s
        self.record.iterations += iterations
        self.recent.append((dt, iterations))
        self.lived_s += dt

    def loaded(self) -> TrafficLoad:
        if self.load is None:  # pragma: no cover - loads are set at every decision
            raise AssertionError(f"job {self.job.id} has no traffic computed")
        return self.load


def job_load(topo: Topology, finder: PathFinder, job: Job, decisions: Decisions,
             seed: int) -> TrafficLoad:
    """The job's bytes per link: each network flow on its decided path, else on the
    path its 5-tuple hashes onto, or, on a spraying fabric (`decisions.spray`), split
    evenly over all its candidates: 1/n of its bytes on each of n paths, so a link
    that k of them share gets k/n. The engine's weights (bytes / mean flow) take the
    fractions as they come. A sprayed collective waits for its slowest packet, so its
    latency is the longest candidate's."""
    chosen = decisions.paths.get(job.id, ())
    loads: dict[int, float] = {}
    alpha = 0.0
    idx = network_flows(job)
    for k, fi in enumerate(idx):
        f = job.flows[fi]
        path = chosen[k] if k < len(chosen) and chosen[k] is not None else None
        if path is None and decisions.spray:
            alpha = max(alpha, _spray(topo, finder, f, loads))
            continue
        if path is None:
            path = hash_path(finder, f, source_port(job.id, fi, seed), seed)
        for link in path.tolist():
            loads[link] = loads.get(link, 0.0) + f.bytes
        alpha = max(alpha, topo.path_latency(path))
    mean = float(np.mean([job.flows[i].bytes for i in idx])) if idx else 0.0
    return TrafficLoad(loads, alpha, mean, tuple(sorted(loads.items())))


def _spray(topo: Topology, finder: PathFinder, f: FlowSpec, loads: dict[int, float]) -> float:
    """Add flow `f`'s bytes to `loads` spread evenly over its candidates; the longest
    candidate's latency."""
    cands = finder.candidates(f.src, f.dst, f.src_port, f.dst_port)
    if len(cands) == 0:
        raise PlanningError(f"no path from {f.src} to {f.dst}")
    links, uses = np.unique(cands, return_counts=True)
    share = f.bytes / len(cands)
    for link, n in zip(links.tolist(), uses.tolist(), strict=True):
        loads[link] = loads.get(link, 0.0) + share * n
    return max(topo.path_latency(c) for c in cands)


def recent_throughput(running: dict[str, RunningJob],
                      window: int | None = 3) -> dict[str, float]:
    """Throughput over standalone, from the last `window` epochs of each job; None: over
    its whole life so far, what `JobRecord.throughput_ratio` says when it ends."""
    out = {}
    for j, r in running.items():
        if window is None:
            if r.lived_s > 0:
                out[j] = r.record.iterations / r.lived_s * r.period
            continue
        span = sum(dt for dt, _ in r.recent[-window:])
        if span > 0:
            out[j] = sum(it for _, it in r.recent[-window:]) / span * r.period
    return out


def epoch_parts(topo: Topology, running: dict[str, RunningJob], decisions: Decisions,
                window_s: float, window_periods: float) -> list[EpochPart]:
    """The epoch's contention components, each with its own engine. A component's
    window (before extrapolating) is `window_s`, or `window_periods` iterations of
    its slowest job if longer."""
    order = list(running)
    loads = {j: running[j].loaded() for j in order}
    parts = []
    for group in components([set(loads[j].bytes_on) for j in order]):
        ids = sorted(order[i] for i in group)
        runs = [running[j] for j in ids]
        window = max(window_s, window_periods * max(r.period for r in runs))
        levels = [decisions.level.get(j, 0) for j in ids]
        parts.append(_part(topo, ids, runs, [loads[j] for j in ids], levels, window))
    return parts


def _part(topo: Topology, ids: list[str], runs: list[RunningJob], loads: list[TrafficLoad],
          levels: list[int], window: float) -> EpochPart:
    rank = {v: i for i, v in enumerate(sorted(set(levels)))}  # only the order matters
    dense = [rank[v] for v in levels]
    used = np.array(sorted({link for ld in loads for link in ld.bytes_on}), dtype=np.int64)
    engine = Engine(
        compute_s=np.array([r.job.compute_s for r in runs]),
        overlap=np.array([r.job.overlap for r in runs]),
        gpus=np.array([float(r.job.gpus) for r in runs]),
        m_bytes=_bytes_matrix(loads, used), mean_flow=np.array([ld.mean_flow for ld in loads]),
        capacity=topo.capacity[used] * 1e9 / 8.0, level=np.array(dense),
        alpha=np.array([ld.alpha for ld in loads]),
        budget=np.array([math.ceil(r.budget_left - 1e-9) if math.isfinite(r.budget_left)
                         else math.inf for r in runs], dtype=np.float64))
    # everything the engine takes from a load: the bytes per link (sprayed fractions
    # included) and the latency, which spraying changes for the same job
    signature = tuple((j, d, ld.key, ld.alpha)
                      for j, d, ld in zip(ids, dense, loads, strict=True))
    return ids, used, Component(engine, [r.state for r in runs],
                                np.array([r.budget_left for r in runs]), signature, window)


def _bytes_matrix(loads: list[TrafficLoad], used: np.ndarray) -> np.ndarray:
    """(jobs, links in `used`) bytes per iteration."""
    col = {int(link): c for c, link in enumerate(used)}
    m = np.zeros((len(loads), len(used)))
    for i, ld in enumerate(loads):
        for link, b in ld.bytes_on.items():
            m[i, col[link]] = b
    return m
