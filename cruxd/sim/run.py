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
from dataclasses import dataclass, replace

import numpy as np

from cruxd.errors import PlanningError
from cruxd.model.jobs import Job
from cruxd.model.paths import PathFinder, finder_for
from cruxd.model.topology import Topology
from cruxd.scheduler.selection import standalone_comm_time
from cruxd.sim.engine import initial_state
from cruxd.sim.metrics import JobRecord, SimResult
from cruxd.sim.policies.base import Context, Decisions, Policy
from cruxd.sim.running import RunningJob, epoch_parts, job_load, recent_throughput

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


def simulate(jobs: list[SimJob], topo: Topology, policy: Policy, config: SimConfig,
             progress: Callable[[float], None] | None = None) -> SimResult:
    """Run `jobs` on `topo` under `policy`, epoch by epoch, until the horizon or
    until every job has left; `progress` is told the time at each epoch's end.

    Each epoch:
    1. admit the jobs that arrive now (`_Simulation.admit_arrivals`);
    2. after an arrival or a departure, and when a periodic re-plan is due, ask the
       policy again (`decide`): levels fitted to the fabric's, start offsets of
       the new jobs, each job's traffic under the new paths;
    3. end the epoch at the next arrival, re-plan or the horizon (`epoch_end`);
    4. simulate it component by component, stopping at the first departure, and
       book iterations, busy GPU time and link bytes (`simulate_epoch`);
    5. retire the jobs that used up their work (`retire`).
    Finally close the records of the jobs still running (`result`).
    """
    sim = _Simulation(jobs, topo, policy, config)
    while sim.now < config.horizon_s and (sim.pending or sim.running):
        sim.admit_arrivals()
        if sim.decision_due():
            sim.decide()
        end = sim.epoch_end()
        if end - sim.now <= _EPS or not sim.running:  # only rounding left, or nobody runs
            sim.now = end
            continue
        sim.retire(sim.simulate_epoch(end))
        if progress is not None:
            progress(sim.now)
    return sim.result()


class _Simulation:
    """One run's state from epoch to epoch."""

    def __init__(self, jobs: list[SimJob], topo: Topology, policy: Policy,
                 config: SimConfig) -> None:
        self.topo, self.policy, self.config = topo, policy, config
        self.finder = finder_for(topo, config.max_paths)
        self.pending = sorted(jobs, key=lambda s: (s.arrival_s, s.job.id))
        if not math.isfinite(config.horizon_s) and any(s.iterations is None for s in jobs):
            raise ValueError("jobs without an iteration budget need a finite horizon")
        self.running: dict[str, RunningJob] = {}
        self.records: list[JobRecord] = []
        self.series: list[tuple[float, float, float, float]] = []
        self.link_bytes = np.zeros(len(topo.links))
        self.now = self.pending[0].arrival_s if self.pending else 0.0
        self.decisions = Decisions()
        self.next_replan = math.inf
        self.replan_every = config.replan_every_s or getattr(policy, "replan_every_s", None)
        # epochs the policy's throughput looks back over (None: each job's whole life)
        self.throughput_window: int | None = getattr(policy, "throughput_window", 3)
        self.changed = True  # the set of running jobs changed since the last decision
        self.new: set[str] = set()  # arrived since the last decision
        self.cache: dict[Hashable, np.ndarray] = {}  # steady rates per component signature

    def admit_arrivals(self) -> None:
        while self.pending and self.pending[0].arrival_s <= self.now + _EPS:
            s = self.pending.pop(0)
            self.running[s.job.id] = _admit(s, self.now, self.finder)
            self.new.add(s.job.id)
            self.changed = True

    def decision_due(self) -> bool:
        return self.changed or self.now >= self.next_replan - _EPS

    def decide(self) -> None:
        cfg = self.config
        ctx = Context(self.topo, self.finder, tuple(r.job for r in self.running.values()),
                      frozenset(self.new), self.now, cfg.levels,
                      recent_throughput(self.running, self.throughput_window), cfg.seed)
        self.decisions = self.policy.decide(ctx)
        if not getattr(self.policy, "ideal_levels", False):
            self.decisions = _fit_levels(self.decisions, cfg.levels)
        self._delay_new_jobs()
        self._update_loads()
        self.new.clear()
        self.changed = False
        if self.replan_every:
            self.next_replan = self.now + self.replan_every

    def _delay_new_jobs(self) -> None:
        """CASSINI-style start offsets apply to new jobs only."""
        for jid in self.new:
            off = self.decisions.offset_s.get(jid, 0.0)
            if off > 0:
                r = self.running[jid]
                r.state = initial_state(self.now + off, r.job.compute_s, r.job.overlap,
                                        r.start_phase)

    def _update_loads(self) -> None:
        for r in self.running.values():
            if self.decisions.paths.get(r.job.id):
                r.load = job_load(self.topo, self.finder, r.job, self.decisions,
                                  self.config.seed)
            elif self.decisions.spray:  # all sprayed: depends on the job only
                if r.spray_load is None:
                    r.spray_load = job_load(self.topo, self.finder, r.job, self.decisions,
                                            self.config.seed)
                r.load = r.spray_load
            else:  # all ECMP: depends on the job and the seed only
                if r.ecmp_load is None:
                    r.ecmp_load = job_load(self.topo, self.finder, r.job, self.decisions,
                                           self.config.seed)
                r.load = r.ecmp_load

    def epoch_end(self) -> float:
        return min(self.pending[0].arrival_s if self.pending else math.inf,
                   self.config.horizon_s, self.next_replan)

    def simulate_epoch(self, end: float) -> set[str]:
        """Advance every component to `end` or the first departure; the jobs that
        used up their work."""
        now, cfg = self.now, self.config
        parts = epoch_parts(self.topo, self.running, self.decisions, cfg.window_s,
                            cfg.window_periods)
        stop = min([end, *(comp.plan(now, end, self.cache) for _, _, comp in parts)])
        finished: set[str] = set()
        busy_total = 0.0
        for ids, used, comp in parts:
            adv = comp.advance(now, stop)
            self.link_bytes[used] += adv.link_bytes
            busy_total += float(adv.busy.sum())
            for k, j in enumerate(ids):
                self.running[j].book(float(adv.iterations[k]), float(adv.busy[k]), stop - now)
                if adv.finished[k]:
                    finished.add(j)
        alloc = sum(r.job.gpus for r in self.running.values()) * (stop - now)
        self.series.append((now, stop, busy_total, alloc))
        self.now = stop
        return finished

    def retire(self, finished: set[str]) -> None:
        for j in sorted(finished):
            r = self.running.pop(j)
            r.record.end_s = self.now
            self.records.append(r.record)
            self.changed = True

    def result(self) -> SimResult:
        horizon = self.config.horizon_s
        for r in self.running.values():
            r.record.end_s = min(self.now, horizon)
            self.records.append(r.record)
        return SimResult(policy=self.policy.name, horizon_s=min(self.now, horizon),
                         jobs=self.records, series=self.series, link_bytes=self.link_bytes,
                         topology=self.topo)


def _admit(s: SimJob, now: float, finder: PathFinder) -> RunningJob:
    job = s.job
    cap = finder.topo.capacity
    flows = [(c, 1.0 / cap[c], f.bytes) for f in job.flows if f.src != f.dst
             for c in [finder.candidates(f.src, f.dst, f.src_port, f.dst_port)]]
    if any(len(c) == 0 for c, _, _ in flows):
        raise PlanningError(f"job {job.id}: no path between two of its hosts")
    t = standalone_comm_time(flows, cap, np.zeros(len(cap))) if flows else 0.0
    alpha = max((finder.topo.path_latency(c[0]) for c, _, _ in flows), default=0.0)
    comm = t + alpha if flows else 0.0
    period = max(job.compute_s, (1.0 - job.overlap) * job.compute_s + comm)
    record = JobRecord(job=job.id, gpus=job.gpus, arrival_s=s.arrival_s, start_s=now,
                       standalone_period_s=period, iterations_goal=s.iterations)
    state = initial_state(now, job.compute_s, job.overlap, s.start_phase)
    budget = s.iterations if s.iterations is not None else math.inf
    return RunningJob(job, s.start_phase, state, record, period, budget)


def _fit_levels(decisions: Decisions, levels: int) -> Decisions:
    """Squash a policy's priorities onto the fabric's levels the way a scheduler
    without compression would (seed §4.3, Sincronia): the top levels-1 priorities
    keep a level each, every lower one shares the lowest."""
    distinct = sorted(set(decisions.level.values()), reverse=True)
    if len(distinct) <= levels:
        return decisions
    place = {v: max(levels - 1 - i, 0) for i, v in enumerate(distinct)}
    return replace(decisions, level={j: place[v] for j, v in decisions.level.items()})
