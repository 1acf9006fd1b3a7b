"""plan(view, config) -> Plan: the leader's brain, pure and deterministic.

The pipeline, one step each below (`plan` reads as their list):
1. candidate paths per flow (ECMP shortest paths, or the probed path table);
2. standalone t_j (Eq. 2) with the job's flows placed alone, unless measured;
   I_j = W_j / t_j;
3. path selection from the most to the least intensive job (§4.1);
4. correction factors k_j and unique priorities P_j = k_j I_j (§4.2);
5. contention DAG and compression to `levels` (§4.3), DSCP per level.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cruxd.model.paths import DEFAULT_MAX_PATHS
from cruxd.model.plan import JobDecision, LinkLoad, Plan
from cruxd.model.view import ClusterView
from cruxd.scheduler.compression import compress_indexed
from cruxd.scheduler.dag import contention_edges
from cruxd.scheduler.dscp import DEFAULT_LEVELS, level_dscp
from cruxd.scheduler.flow_paths import FlowPaths, candidate_flows, flow_decisions
from cruxd.scheduler.priority import Priorities, assign, tie_groups
from cruxd.scheduler.selection import pick, standalone_comm_time


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

    def __post_init__(self) -> None:
        for name in ("levels", "samples", "max_paths", "busiest_links"):
            if getattr(self, name) < (0 if name == "busiest_links" else 1):
                raise ValueError(f"PlanConfig.{name} out of range: {getattr(self, name)}")
        if not self.pair_window_periods > 0:
            raise ValueError("PlanConfig.pair_window_periods must be > 0")
        if not 0.0 <= self.tie_tolerance < 1.0:
            raise ValueError("PlanConfig.tie_tolerance must be in [0, 1)")

    def dscp_values(self) -> tuple[int, ...]:
        return level_dscp(self.levels, self.dscp)


def plan(view: ClusterView, config: PlanConfig | None = None) -> Plan:
    config = config or PlanConfig()
    dscp = config.dscp_values()
    ids = [j.id for j in view.jobs]
    flows, by_job = candidate_flows(view, config.max_paths)
    jobs = _intensities(view, by_job)
    _select_paths(ids, by_job, jobs, len(view.topology.capacity), config.tie_tolerance)
    pr = assign(ids, jobs.intensity, jobs.compute, jobs.overlap, jobs.comm, jobs.traffic,
                reference=config.reference_job, window_periods=config.pair_window_periods,
                declared=jobs.declared, tie_tolerance=config.tie_tolerance)
    usage = _link_usage(flows, jobs.period, len(view.topology.capacity))
    levels = _compress(usage, pr, jobs, config)
    return Plan(
        jobs=_job_decisions(ids, jobs, pr, levels.level, dscp),
        flows=flow_decisions(view, ids, flows),
        links=_busiest(view, usage, config.busiest_links, ids),
        levels=config.levels,
        reference_job=ids[pr.reference] if pr.reference is not None else None,
        cut_weight=levels.cut,
        contention_weight=float(levels.weights.sum() * jobs.i_max),
    )


@dataclass(frozen=True)
class _Intensities:
    """Step 2, per job (arrays in view.jobs order)."""

    compute: np.ndarray
    overlap: np.ndarray
    traffic: np.ndarray  # bytes per iteration over the fabric
    comm: np.ndarray  # t_j: measured, else standalone
    period: np.ndarray  # standalone iteration time
    intensity: np.ndarray  # I_j = W_j / t_j; inf without inter-host traffic
    i_max: float  # the largest finite I_j (1 if none): intensities are weighed against it
    declared: np.ndarray  # bool: figures the job declared, not measured (Job.declared)


def _intensities(view: ClusterView, by_job: list[list[FlowPaths]]) -> _Intensities:
    jobs = view.jobs
    cap = view.topology.capacity
    compute = np.array([j.compute_s for j in jobs], dtype=np.float64)
    overlap = np.array([j.overlap for j in jobs], dtype=np.float64)
    flops = np.array([j.flops for j in jobs], dtype=np.float64)
    traffic = np.array([sum(f.spec.bytes for f in fl) for fl in by_job], dtype=np.float64)
    comm = np.zeros(len(jobs))
    scratch = np.zeros(len(cap))
    for ji, job in enumerate(jobs):
        t = standalone_comm_time([(f.cands, f.inv_cap, f.spec.bytes) for f in by_job[ji]],
                                 cap, scratch)
        measured = job.comm_s is not None and job.comm_s > 0 and by_job[ji]
        comm[ji] = job.comm_s if measured and job.comm_s is not None else t
    period = np.maximum(compute, (1.0 - overlap) * compute + comm)
    with np.errstate(divide="ignore"):
        intensity = np.where(comm > 0, flops / np.where(comm > 0, comm, 1.0), np.inf)
    declared = np.array([j.declared for j in jobs], dtype=bool)
    _cap_declared(intensity, declared)
    finite = intensity[np.isfinite(intensity)]
    i_max = float(finite.max()) if len(finite) else 1.0
    return _Intensities(compute, overlap, traffic, comm, period, intensity, i_max, declared)


def _cap_declared(intensity: np.ndarray, declared: np.ndarray) -> None:
    """No declared intensity above the lowest measured one, so a job's claim cannot
    weigh more than a measured job in path choice or compression either."""
    measured = intensity[~declared & np.isfinite(intensity)]
    if len(measured) and declared.any():
        np.minimum(intensity, np.where(declared, measured.min(), np.inf), out=intensity)


def _select_paths(ids: list[str], by_job: list[list[FlowPaths]], jobs: _Intensities,
                  n_links: int, tie_tolerance: float) -> None:
    """Step 3: sets each flow's `choice`, the most intensive job first."""
    load = np.zeros(n_links)
    tied = tie_groups(jobs.intensity, tie_tolerance)
    for ji in sorted(range(len(ids)), key=lambda i: (bool(jobs.declared[i]), tied[i], ids[i])):
        weight = jobs.intensity[ji] / jobs.i_max
        for f in by_job[ji]:
            x = weight * 8.0 * f.spec.bytes / jobs.period[ji] / 1e9
            f.choice = pick(f.cands, f.inv_cap, load, x)
            load[f.cands[f.choice]] += x


@dataclass(frozen=True)
class _LinkUsage:
    """One entry per (flow, link of its chosen path), and the demand per link."""

    link_of: np.ndarray
    job_of: np.ndarray
    demand: np.ndarray  # Gbit/s on each link of the topology


def _link_usage(flows: list[FlowPaths], period: np.ndarray, n_links: int) -> _LinkUsage:
    hops_per_flow = np.array([f.cands.shape[1] for f in flows], dtype=np.int64)
    link_of = (np.concatenate([f.cands[f.choice] for f in flows]) if flows
               else np.zeros(0, dtype=np.int64))
    job_of = np.repeat(np.array([f.job for f in flows], dtype=np.int64), hops_per_flow)
    flow_gbps = np.array([8.0 * f.spec.bytes / period[f.job] / 1e9 for f in flows])
    demand = np.bincount(link_of, weights=np.repeat(flow_gbps, hops_per_flow),
                         minlength=n_links)
    return _LinkUsage(link_of, job_of, demand)


@dataclass(frozen=True)
class _Levels:
    level: np.ndarray  # per job
    weights: np.ndarray  # per contention edge: I_hi / i_max
    cut: float  # contention weight between different levels (the Max-K-Cut objective)


def _compress(usage: _LinkUsage, pr: Priorities, jobs: _Intensities,
              config: PlanConfig) -> _Levels:
    """Step 5: the contention DAG (who shares a link with whom, by rank), compressed
    onto config.levels."""
    n = len(jobs.intensity)
    hi, lo = contention_edges(usage.link_of, usage.job_of, pr.rank)
    weights = jobs.intensity[hi] / jobs.i_max
    order = np.argsort(pr.rank)
    level = compress_indexed(n, hi, lo, weights, config.levels, order,
                             samples=config.samples, seed=config.seed)
    contending = np.zeros(n, dtype=bool)
    contending[hi] = contending[lo] = True
    # jobs that contend with nobody may sit anywhere; keep them spread by rank
    quantile = config.levels - 1 - (pr.rank * config.levels) // max(n, 1)
    level = np.where(contending, level, quantile)
    cut = float(weights[level[hi] != level[lo]].sum() * jobs.i_max)
    return _Levels(level, weights, cut)


def _job_decisions(ids: list[str], jobs: _Intensities, pr: Priorities, level: np.ndarray,
                   dscp: tuple[int, ...]) -> tuple[JobDecision, ...]:
    return tuple(sorted((
        JobDecision(job=ids[i], intensity=float(jobs.intensity[i]), comm_s=float(jobs.comm[i]),
                    period_s=float(jobs.period[i]), k=float(pr.k[i]),
                    priority=float(pr.priority[i]), rank=int(pr.rank[i]),
                    level=int(level[i]), dscp=dscp[int(level[i])],
                    network=bool(jobs.comm[i] > 0))
        for i in range(len(ids))), key=lambda d: d.rank))


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
