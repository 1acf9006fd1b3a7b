"""Step 1 of planning: every inter-host flow with its candidate paths, and, once the
paths are chosen, the flows as the plan reports them.

A pair's candidates are its probed paths when the path table knows the pair (the
source port that leads onto each comes with it), else every ECMP shortest path.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from cruxd.errors import PlanningError
from cruxd.model.jobs import FlowSpec
from cruxd.model.paths import PathFinder, finder_for
from cruxd.model.plan import FlowDecision
from cruxd.model.topology import Topology
from cruxd.model.view import ClusterView


@dataclass
class FlowPaths:
    """One flow, its candidate paths (rows of link indices) and the one chosen."""

    job: int  # index into view.jobs
    spec: FlowSpec
    cands: np.ndarray
    inv_cap: np.ndarray  # 1 / capacity of every link of `cands`, same shape
    sports: list[int | None]  # per candidate: the probed UDP source port, if any
    choice: int = 0


Candidates = tuple[np.ndarray, np.ndarray, list[int | None]]


def candidate_flows(view: ClusterView, max_paths: int
                    ) -> tuple[list[FlowPaths], list[list[FlowPaths]]]:
    """The flows in job order, and the same flows per job. Flows within a host are
    left out. Candidates are computed once per (pair, ports) and shared."""
    finder = finder_for(view.topology, max_paths)
    memo: dict[tuple[str, str, int | None, int | None], Candidates] = {}
    by_job = [job_flows(view, finder, ji, memo) for ji in range(len(view.jobs))]
    return [f for fl in by_job for f in fl], by_job


def job_flows(view: ClusterView, finder: PathFinder, ji: int,
              memo: dict[tuple[str, str, int | None, int | None], Candidates]
              ) -> list[FlowPaths]:
    """The inter-host flows of view.jobs[ji] with their candidates; `memo` shares the
    candidates of a (pair, ports) within one view."""
    job = view.jobs[ji]
    out = []
    for spec in job.flows:
        if spec.src == spec.dst:
            continue
        key = (spec.src, spec.dst, spec.src_port, spec.dst_port)
        hit = memo.get(key)
        if hit is None:
            cands, sports = _candidates(view, finder, spec)
            if len(cands) == 0:
                raise PlanningError(f"job {job.id}: no path from {spec.src} to {spec.dst}")
            hit = memo[key] = (cands, 1.0 / view.topology.capacity[cands], sports)
        out.append(FlowPaths(ji, spec, *hit))
    return out


def job_flow_decisions(link_dst: list[str], job_id: str, flows: list[FlowPaths],
                       choices: tuple[int, ...]) -> tuple[FlowDecision, ...]:
    """One job's flows on the candidates `choices` (one per flow), as the plan reports
    them (`link_dst`: `link_destinations`); a path's hop names are worked out once per
    candidate set."""
    shapes: dict[tuple[int, int], tuple[tuple[int, ...], tuple[str, ...]]] = {}
    return tuple(_decision(f, c, job_id, link_dst, shapes)
                 for f, c in zip(flows, choices, strict=True))


def link_destinations(topo: Topology) -> list[str]:
    """Each link's far end, kept on the topology (immutable) for later plans."""
    key = ("link_dst",)
    hit = topo.derived.get(key)
    if not isinstance(hit, list):
        hit = topo.derived[key] = [lk.dst for lk in topo.links]
    return hit


def _decision(f: FlowPaths, choice: int, job_id: str, link_dst: list[str],
              shapes: dict[tuple[int, int], tuple[tuple[int, ...], tuple[str, ...]]]
              ) -> FlowDecision:
    key = (id(f.cands), choice)
    shape = shapes.get(key)
    if shape is None:
        path = tuple(f.cands[choice].tolist())
        shape = shapes[key] = (path, tuple(link_dst[i] for i in path[:-1]))
    return FlowDecision(job_id, f.spec.src, f.spec.dst, f.spec.bytes, f.spec.src_port,
                        shape[0], shape[1], f.sports[choice], len(f.cands))


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
