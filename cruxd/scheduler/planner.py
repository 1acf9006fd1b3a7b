"""plan(view, config) -> Plan: the leader's brain, pure and deterministic.

1. candidate paths per flow (ECMP shortest paths, or the probed path table);
2. standalone t_j (Eq. 2) with the job's flows placed alone, unless measured;
   I_j = W_j / t_j;
3. path selection from the most to the least intensive job (§4.1);
4. correction factors k_j and unique priorities P_j = k_j I_j (§4.2);
5. contention DAG and compression to `levels` (§4.3), DSCP per level.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from cruxd.model.jobs import FlowSpec
from cruxd.model.paths import DEFAULT_MAX_PATHS, PathFinder, finder_for
from cruxd.model.plan import FlowDecision, JobDecision, LinkLoad, Plan
from cruxd.model.view import ClusterView
from cruxd.scheduler.compression import compress_indexed
from cruxd.scheduler.dag import contention_edges
from cruxd.scheduler.dscp import DEFAULT_LEVELS, check_dscp, default_dscp
from cruxd.scheduler.priority import assign
from cruxd.scheduler.selection import pick, standalone_comm_time


@dataclass(frozen=True)
class PlanConfig:
    levels: int = DEFAULT_LEVELS
    dscp: tuple[int, ...] | None = None  # per level, lowest first; None: dscp.default_dscp
    samples: int = 10  # topological orders tried by compression
    seed: int = 0
    max_paths: int = DEFAULT_MAX_PATHS  # candidate paths kept per host pair
    reference_job: str | None = None  # None: the job with the most traffic
    pair_window_periods: float = 3.0  # window of the pairwise k_j model
    busiest_links: int = 10  # links listed in the plan

    def __post_init__(self) -> None:
        for name in ("levels", "samples", "max_paths", "busiest_links"):
            if getattr(self, name) < (0 if name == "busiest_links" else 1):
                raise ValueError(f"PlanConfig.{name} out of range: {getattr(self, name)}")
        if not self.pair_window_periods > 0:
            raise ValueError("PlanConfig.pair_window_periods must be > 0")

    def dscp_values(self) -> tuple[int, ...]:
        if self.dscp is None:
            return default_dscp(self.levels)
        return check_dscp(self.dscp, self.levels)


@dataclass
class _Flow:
    job: int
    spec: FlowSpec
    cands: np.ndarray
    inv_cap: np.ndarray
    sports: list[int | None]
    choice: int = 0


def plan(view: ClusterView, config: PlanConfig | None = None) -> Plan:
    config = config or PlanConfig()
    dscp = config.dscp_values()
    topo = view.topology
    cap = topo.capacity
    jobs = view.jobs
    n = len(jobs)
    ids = [j.id for j in jobs]
    finder = finder_for(topo, config.max_paths)

    flows: list[_Flow] = []
    by_job: list[list[_Flow]] = [[] for _ in range(n)]
    # candidates, their inverse capacities and source ports, once per (pair, ports)
    memo: dict[tuple[str, str, int | None, int | None],
               tuple[np.ndarray, np.ndarray, list[int | None]]] = {}
    for ji, job in enumerate(jobs):
        for spec in job.flows:
            if spec.src == spec.dst:
                continue
            key = (spec.src, spec.dst, spec.src_port, spec.dst_port)
            hit = memo.get(key)
            if hit is None:
                cands, sports = _candidates(view, finder, spec)
                if len(cands) == 0:
                    raise ValueError(f"job {job.id}: no path from {spec.src} to {spec.dst}")
                hit = memo[key] = (cands, 1.0 / cap[cands], sports)
            flow = _Flow(ji, spec, *hit)
            flows.append(flow)
            by_job[ji].append(flow)

    compute = np.array([j.compute_s for j in jobs], dtype=np.float64)
    overlap = np.array([j.overlap for j in jobs], dtype=np.float64)
    flops = np.array([j.flops for j in jobs], dtype=np.float64)
    traffic = np.array([sum(f.spec.bytes for f in fl) for fl in by_job], dtype=np.float64)
    comm = np.zeros(n)
    scratch = np.zeros(len(cap))
    for ji, job in enumerate(jobs):
        t = standalone_comm_time([(f.cands, f.inv_cap, f.spec.bytes) for f in by_job[ji]],
                                 cap, scratch)
        measured = job.comm_s is not None and job.comm_s > 0 and by_job[ji]
        comm[ji] = job.comm_s if measured and job.comm_s is not None else t
    period = np.maximum(compute, (1.0 - overlap) * compute + comm)
    with np.errstate(divide="ignore"):
        intensity = np.where(comm > 0, flops / np.where(comm > 0, comm, 1.0), np.inf)
    finite = intensity[np.isfinite(intensity)]
    i_max = float(finite.max()) if len(finite) else 1.0

    # 3. path selection, most intensive first
    load = np.zeros(len(cap))
    for ji in sorted(range(n), key=lambda i: (-intensity[i], ids[i])):
        weight = intensity[ji] / i_max
        for f in by_job[ji]:
            x = weight * 8.0 * f.spec.bytes / period[ji] / 1e9
            f.choice = pick(f.cands, f.inv_cap, load, x)
            load[f.cands[f.choice]] += x

    # 4. priorities
    pr = assign(ids, intensity, compute, overlap, comm, traffic,
                reference=config.reference_job, window_periods=config.pair_window_periods)

    # 5. contention DAG and compression
    # one entry per (flow, link of its chosen path)
    hops_per_flow = np.array([f.cands.shape[1] for f in flows], dtype=np.int64)
    link_of = (np.concatenate([f.cands[f.choice] for f in flows]) if flows
               else np.zeros(0, dtype=np.int64))
    job_of = np.repeat(np.array([f.job for f in flows], dtype=np.int64), hops_per_flow)
    flow_gbps = np.array([8.0 * f.spec.bytes / period[f.job] / 1e9 for f in flows])
    demand = np.bincount(link_of, weights=np.repeat(flow_gbps, hops_per_flow),
                         minlength=len(cap))
    hi, lo = contention_edges(link_of, job_of, pr.rank)
    weights = intensity[hi] / i_max
    order = np.argsort(pr.rank)
    level = compress_indexed(n, hi, lo, weights, config.levels, order,
                             samples=config.samples, seed=config.seed)
    contending = np.zeros(n, dtype=bool)
    contending[hi] = contending[lo] = True
    # jobs that contend with nobody may sit anywhere; keep them spread by rank
    quantile = config.levels - 1 - (pr.rank * config.levels) // max(n, 1)
    level = np.where(contending, level, quantile)
    cut = float(weights[level[hi] != level[lo]].sum() * i_max)

    decisions = tuple(sorted((
        JobDecision(job=ids[i], intensity=float(intensity[i]), comm_s=float(comm[i]),
                    period_s=float(period[i]), k=float(pr.k[i]),
                    priority=float(pr.priority[i]), rank=int(pr.rank[i]),
                    level=int(level[i]), dscp=dscp[int(level[i])],
                    network=bool(comm[i] > 0))
        for i in range(n)), key=lambda d: d.rank))
    return Plan(
        jobs=decisions,
        flows=_flow_decisions(view, ids, flows),
        links=_busiest(view, link_of, job_of, demand, config.busiest_links, ids),
        levels=config.levels,
        reference_job=ids[pr.reference] if pr.reference is not None else None,
        cut_weight=cut,
        contention_weight=float(weights.sum() * i_max),
    )


def _candidates(view: ClusterView, finder: PathFinder, spec: FlowSpec
                ) -> tuple[np.ndarray, list[int | None]]:
    """Probed paths when the path table knows the pair, else all ECMP candidates."""
    discovered = view.path_table.get((spec.src, spec.dst), ())
    rows: list[list[int]] = []
    sports: list[int | None] = []
    for dp in discovered:
        links = _links_along(view, spec, dp.hops)
        if links is not None:
            rows.append(links)
            sports.append(dp.sports[0] if dp.sports else None)
    if rows:
        shortest = min(len(r) for r in rows)
        keep = [i for i, r in enumerate(rows) if len(r) == shortest]
        return np.array([rows[i] for i in keep], dtype=np.int64), [sports[i] for i in keep]
    cands = finder.candidates(spec.src, spec.dst, spec.src_port, spec.dst_port)
    return cands, [None] * len(cands)


def _links_along(view: ClusterView, spec: FlowSpec, hops: tuple[str, ...]) -> list[int] | None:
    """The links through `hops` (parallel links: the first, as hop lists cannot tell
    them apart), honouring the flow's NIC ports; None if the hops are not a path."""
    topo = view.topology
    nodes = [spec.src, *hops, spec.dst]
    links = []
    for a, b in itertools.pairwise(nodes):
        options = [i for i in topo.out_links.get(a, ()) if topo.links[i].dst == b]
        if a == spec.src and spec.src_port is not None:
            options = [i for i in options if topo.links[i].port == spec.src_port]
        if b == spec.dst and spec.dst_port is not None:
            options = [i for i in options if topo.links[i].port == spec.dst_port]
        if not options:
            return None
        links.append(options[0])
    return links


def _flow_decisions(view: ClusterView, ids: list[str], flows: list[_Flow]
                    ) -> tuple[FlowDecision, ...]:
    link_dst = [lk.dst for lk in view.topology.links]
    shapes: dict[tuple[int, int], tuple[tuple[int, ...], tuple[str, ...]]] = {}
    out = []
    for f in flows:
        key = (id(f.cands), f.choice)
        shape = shapes.get(key)
        if shape is None:
            path = tuple(f.cands[f.choice].tolist())
            shape = shapes[key] = (path, tuple(link_dst[i] for i in path[:-1]))
        out.append(FlowDecision(ids[f.job], f.spec.src, f.spec.dst, f.spec.bytes,
                                f.spec.src_port, shape[0], shape[1], f.sports[f.choice],
                                len(f.cands)))
    return tuple(out)


def _busiest(view: ClusterView, link_of: np.ndarray, job_of: np.ndarray, demand: np.ndarray,
             top: int, ids: list[str]) -> tuple[LinkLoad, ...]:
    topo = view.topology
    util = demand / topo.capacity
    chosen = [int(i) for i in np.argsort(-util, kind="stable")[:top] if demand[i] > 0]
    mask = np.isin(link_of, chosen)
    users: dict[int, set[str]] = {i: set() for i in chosen}
    for link, job in zip(link_of[mask].tolist(), job_of[mask].tolist(), strict=True):
        users[link].add(ids[job])
    return tuple(LinkLoad(link=topo.links[i].name, capacity_gbps=float(topo.capacity[i]),
                          demand_gbps=float(demand[i]), jobs=tuple(sorted(users[i])))
                 for i in chosen)
