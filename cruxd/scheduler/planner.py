"""plan(view, config) -> Plan: the leader's brain, pure and deterministic.

The pipeline, one step each below (`plan` reads as their list):
1. candidate paths per flow (ECMP shortest paths, or the probed path table);
2. standalone t_j (Eq. 2) with the job's flows placed alone, unless measured;
   I_j = W_j / t_j;
3. path selection from the most to the least intensive job (§4.1);
4. correction factors k_j and unique priorities P_j = k_j I_j (§4.2);
5. contention DAG and compression to `levels` (§4.3), DSCP per level.

Nothing here is normalised by a cluster-wide figure (such as the largest intensity):
path selection weighs loads by I_j itself and compression rescales each component
by a power of two (compression.py), so one job's arrival cannot shift the numbers
of jobs it does not contend with. `IncrementalPlanner` (incremental.py) relies on
it to reuse what an event cannot change; it must give exactly what `plan` gives,
so both build on the helpers below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cruxd.model.paths import DEFAULT_MAX_PATHS
from cruxd.model.plan import FlowDecision, JobDecision, LinkLoad, Plan
from cruxd.model.view import ClusterView
from cruxd.scheduler.compression import ComponentMemo, compress_indexed
from cruxd.scheduler.dag import contention_edges
from cruxd.scheduler.dscp import DEFAULT_LEVELS, level_dscp
from cruxd.scheduler.flow_paths import (
    FlowPaths,
    candidate_flows,
    job_flow_decisions,
    link_destinations,
)
from cruxd.scheduler.level_aware import REFINE_ROUNDS, Choices, by_level, reselect_by_level
from cruxd.scheduler.priority import Priorities, assign, tie_groups
from cruxd.scheduler.selection import flow_loads, pick, standalone_comm_time


@dataclass(frozen=True)
class PlanConfig:
    levels: int = DEFAULT_LEVELS
    dscp: tuple[int, ...] | None = None  # per level, lowest first; None: the default map
    samples: int = 10  # topological orders tried by compression
    seed: int = 0
    max_paths: int = DEFAULT_MAX_PATHS  # candidate paths kept per host pair
    reference_job: str | None = None  # None: the job with the most traffic
    pair_window_periods: float = 3.0  # window of the pairwise k_j model
    busiest_links: int = 10  # links listed in the plan
    # relative difference of I_j or P_j below which jobs tie (ordered by id): a live
    # leader sets its measurement resolution here, so noise does not order equal jobs
    tie_tolerance: float = 0.0
    # plan for a fabric with a level per job (the simulator's uncompressed ablations):
    # paths are chosen knowing that every job before has strict priority
    ideal_levels: bool = False
    # level-aware rounds only up to this many jobs with fabric traffic: they re-run path
    # selection over every job, which at the stress benchmark's 5,000 jobs multiplied
    # an incremental re-plan's time by 4.7 (docs/scheduler.md#level-aware-planning)
    level_aware_max_jobs: int = 1000

    def __post_init__(self) -> None:
        for name in ("levels", "samples", "max_paths", "busiest_links", "level_aware_max_jobs"):
            if getattr(self, name) < (0 if name in ("busiest_links", "level_aware_max_jobs")
                                      else 1):
                raise ValueError(f"PlanConfig.{name} out of range: {getattr(self, name)}")
        if not self.pair_window_periods > 0:
            raise ValueError("PlanConfig.pair_window_periods must be > 0")
        if not 0.0 <= self.tie_tolerance < 1.0:
            raise ValueError("PlanConfig.tie_tolerance must be in [0, 1)")

    def dscp_values(self) -> tuple[int, ...]:
        return level_dscp(self.levels, self.dscp)


def plan(view: ClusterView, config: PlanConfig | None = None) -> Plan:
    config = config or PlanConfig()
    config.dscp_values()  # a bad DSCP map fails before any work
    ids = [j.id for j in view.jobs]
    _, by_job = candidate_flows(view, config.max_paths)
    cap = view.topology.capacity
    scratch = np.zeros(len(cap))
    traffic = np.array([sum(f.spec.bytes for f in fl) for fl in by_job], dtype=np.float64)
    alone = np.array([standalone_comm_time([(f.cands, f.inv_cap, f.spec.bytes) for f in fl],
                                           cap, scratch) for fl in by_job], dtype=np.float64)
    jobs = intensities(view, traffic, alone, np.array([len(fl) > 0 for fl in by_job]))
    order = selection_order(ids, jobs, config.tie_tolerance)
    _select_paths(order, by_job, jobs, len(cap))
    link_dst = link_destinations(view.topology)
    return finish(view, config, jobs, order, by_job,
                  [[f.spec.bytes for f in fl] for fl in by_job],
                  [[f.cands.shape[1] for f in fl] for fl in by_job],
                  lambda choices: [job_flow_decisions(link_dst, ids[ji], fl, choices[ji])
                                   for ji, fl in enumerate(by_job)])


def finish(view: ClusterView, config: PlanConfig, jobs: Intensities, order: list[int],
           flows: list[list[FlowPaths]], nbytes: list[list[float]], hops: list[list[int]],
           decide: Callable[[Choices], list[tuple[FlowDecision, ...]]],
           memo: ComponentMemo | None = None, chosen: list[np.ndarray] | None = None) -> Plan:
    """Steps 4-5 and the plan, from the first path selection (each flow's `choice`, made
    in `order`): priorities, then compression and level-aware selection in turn
    (level_aware.py), at most REFINE_ROUNDS times. `nbytes`/`hops` per flow; `decide`
    gives the jobs' flows as the plan reports them for the final choices; `chosen`, if
    known, the links of the first selection per job (what `_links` would give)."""
    ids = [j.id for j in view.jobs]
    n_links = len(view.topology.capacity)
    pr = assign(ids, jobs.intensity, jobs.compute, jobs.overlap, jobs.comm, jobs.traffic,
                reference=config.reference_job, window_periods=config.pair_window_periods,
                declared=jobs.declared, tie_tolerance=config.tie_tolerance)
    choices: Choices = [tuple(f.choice for f in fl) for fl in flows]
    usage = _link_usage(chosen if chosen is not None else _links(flows, choices), nbytes, hops,
                        jobs.period, n_links)
    levels = _compress(usage, pr, jobs, config, memo)
    networked = int(np.count_nonzero(jobs.comm > 0))
    if (config.levels > 1 or config.ideal_levels) and networked <= config.level_aware_max_jobs:
        # (with one level, the first selection is the level-aware one)
        for _ in range(REFINE_ROUNDS):
            level = None if config.ideal_levels else levels.level
            again = reselect_by_level(by_level(order, pr.rank, level), flows, nbytes,
                                      jobs.intensity, jobs.period, jobs.comm, level, n_links)
            if again == choices:
                break
            choices = again
            usage = _link_usage(_links(flows, choices), nbytes, hops, jobs.period, n_links)
            levels = _compress(usage, pr, jobs, config, memo)
    decided = decide(choices)
    return Plan(
        jobs=_job_decisions(ids, jobs, pr, levels.level, config.dscp_values()),
        flows=tuple(d for per_job in decided for d in per_job),
        links=_busiest(view, usage, config.busiest_links, ids),
        levels=config.levels,
        reference_job=ids[pr.reference] if pr.reference is not None else None,
        cut_weight=levels.cut,
        contention_weight=float(levels.weights.sum()),
        job_flows=dict(zip(ids, decided, strict=True)),
    )


def _links(flows: list[list[FlowPaths]], choices: Choices) -> list[np.ndarray]:
    """Per job, the links of its chosen paths in flow order."""
    return [np.concatenate([f.cands[c] for f, c in zip(fl, ch, strict=True)]) if fl
            else np.zeros(0, dtype=np.int64) for fl, ch in zip(flows, choices, strict=True)]


@dataclass(frozen=True)
class Intensities:
    """Step 2, per job (arrays in view.jobs order)."""

    compute: np.ndarray
    overlap: np.ndarray
    traffic: np.ndarray  # bytes per iteration over the fabric
    comm: np.ndarray  # t_j: measured, else standalone
    period: np.ndarray  # standalone iteration time
    intensity: np.ndarray  # I_j = W_j / t_j; inf without inter-host traffic
    declared: np.ndarray  # bool: figures the job declared, not measured (Job.declared)


def intensities(view: ClusterView, traffic: np.ndarray, alone: np.ndarray,
                networked: np.ndarray) -> Intensities:
    """Step 2 from each job's bytes per iteration, standalone t_j (`standalone_comm_time`)
    and whether it has inter-host flows; measured t_j override the standalone one."""
    jobs = view.jobs
    compute = np.array([j.compute_s for j in jobs], dtype=np.float64)
    overlap = np.array([j.overlap for j in jobs], dtype=np.float64)
    flops = np.array([j.flops for j in jobs], dtype=np.float64)
    comm = np.array([j.comm_s if j.comm_s is not None and j.comm_s > 0 and networked[ji]
                     else alone[ji] for ji, j in enumerate(jobs)], dtype=np.float64)
    period = np.maximum(compute, (1.0 - overlap) * compute + comm)
    with np.errstate(divide="ignore"):
        intensity = np.where(comm > 0, flops / np.where(comm > 0, comm, 1.0), np.inf)
    declared = np.array([j.declared for j in jobs], dtype=bool)
    _cap_declared(intensity, declared)
    return Intensities(compute, overlap, traffic, comm, period, intensity, declared)


def _cap_declared(intensity: np.ndarray, declared: np.ndarray) -> None:
    """No declared intensity above the lowest measured one, so a job's claim cannot
    weigh more than a measured job in path choice or compression either."""
    measured = intensity[~declared & np.isfinite(intensity)]
    if len(measured) and declared.any():
        np.minimum(intensity, np.where(declared, measured.min(), np.inf), out=intensity)


def selection_order(ids: list[str], jobs: Intensities, tie_tolerance: float) -> list[int]:
    """Step 3's order: measured jobs first, then by intensity (ties by id)."""
    keys = list(zip(jobs.declared.tolist(), tie_groups(jobs.intensity, tie_tolerance).tolist(),
                    ids, strict=True))
    return sorted(range(len(ids)), key=keys.__getitem__)


def _select_paths(order: list[int], by_job: list[list[FlowPaths]], jobs: Intensities,
                  n_links: int) -> None:
    """Step 3: sets each flow's `choice`, in `order` (the most intensive job first)."""
    load = np.zeros(n_links)
    for ji in order:
        x = flow_loads(float(jobs.intensity[ji]), float(jobs.period[ji]),
                       np.array([f.spec.bytes for f in by_job[ji]])).tolist()
        for f, xf in zip(by_job[ji], x, strict=True):
            f.choice = pick(f.cands, f.inv_cap, load, xf)
            load[f.cands[f.choice]] += xf


@dataclass(frozen=True)
class _LinkUsage:
    """One entry per (flow, link of its chosen path), and the demand per link."""

    link_of: np.ndarray
    job_of: np.ndarray
    demand: np.ndarray  # Gbit/s on each link of the topology


def _link_usage(chosen: list[np.ndarray], nbytes: list[list[float]], hops: list[list[int]],
                period: np.ndarray, n_links: int) -> _LinkUsage:
    sizes = [len(c) for c in chosen]
    link_of = np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)
    job_of = np.repeat(np.arange(len(chosen), dtype=np.int64), sizes)
    flow_job = np.repeat(np.arange(len(chosen), dtype=np.int64), [len(b) for b in nbytes])
    flat_bytes = np.array([b for per_job in nbytes for b in per_job], dtype=np.float64)
    flow_gbps = 8.0 * flat_bytes / period[flow_job] / 1e9
    per_hop = np.repeat(flow_gbps, [h for per_job in hops for h in per_job])
    demand = np.bincount(link_of.astype(np.int64), weights=per_hop, minlength=n_links)
    return _LinkUsage(link_of.astype(np.int64), job_of, demand)


@dataclass(frozen=True)
class _Levels:
    level: np.ndarray  # per job
    weights: np.ndarray  # per contention edge: I_hi
    cut: float  # contention weight between different levels (the Max-K-Cut objective)


def _compress(usage: _LinkUsage, pr: Priorities, jobs: Intensities,
              config: PlanConfig, memo: ComponentMemo | None = None) -> _Levels:
    """Step 5: the contention DAG (who shares a link with whom, by rank), compressed
    onto config.levels."""
    n = len(jobs.intensity)
    hi, lo = contention_edges(usage.link_of, usage.job_of, pr.rank)
    weights = jobs.intensity[hi]
    order = np.argsort(pr.rank)
    free = None if pr.tie is None else pr.tie[hi] == pr.tie[lo]
    level = compress_indexed(n, hi, lo, weights, config.levels, order,
                             samples=config.samples, seed=config.seed, memo=memo, free=free)
    contending = np.zeros(n, dtype=bool)
    contending[hi] = contending[lo] = True
    # jobs that contend with nobody may sit anywhere; keep the networked ones spread by
    # rank among themselves, which is what level-aware selection then reads as who may
    # take whose leftovers (jobs without fabric traffic sit on top, where they cost none)
    networked = jobs.comm > 0
    net_rank = np.cumsum(networked[order]) - 1
    rank_among = np.empty(n, dtype=np.int64)
    rank_among[order] = net_rank
    quantile = config.levels - 1 - (rank_among * config.levels) // max(int(networked.sum()), 1)
    quantile = np.where(networked, quantile, config.levels - 1)
    level = np.where(contending, level, quantile)
    cut = float(weights[level[hi] != level[lo]].sum())
    return _Levels(level, weights, cut)


def _job_decisions(ids: list[str], jobs: Intensities, pr: Priorities, level: np.ndarray,
                   dscp: tuple[int, ...]) -> tuple[JobDecision, ...]:
    cols = zip(ids, jobs.intensity.tolist(), jobs.comm.tolist(), jobs.period.tolist(),
               pr.k.tolist(), pr.priority.tolist(), pr.rank.tolist(), level.tolist(), strict=True)
    return tuple(sorted((
        JobDecision(job=i, intensity=intensity, comm_s=comm, period_s=period, k=k,
                    priority=prio, rank=rank, level=lv, dscp=dscp[lv], network=comm > 0)
        for i, intensity, comm, period, k, prio, rank, lv in cols), key=lambda d: d.rank))


def _busiest(view: ClusterView, usage: _LinkUsage, top: int, ids: list[str]
             ) -> tuple[LinkLoad, ...]:
    """The `top` most utilised links with demand, and the jobs on each."""
    topo = view.topology
    demand = usage.demand
    util = demand / topo.capacity
    chosen = [int(i) for i in np.argsort(-util, kind="stable")[:top] if demand[i] > 0]
    mask = np.isin(usage.link_of, chosen)
    users: dict[int, set[str]] = {i: set() for i in chosen}
    for link, job in zip(usage.link_of[mask].tolist(), usage.job_of[mask].tolist(), strict=True):
        users[link].add(ids[job])
    return tuple(LinkLoad(link=topo.links[i].name, capacity_gbps=float(topo.capacity[i]),
                          demand_gbps=float(demand[i]), jobs=tuple(sorted(users[i])))
                 for i in chosen)
