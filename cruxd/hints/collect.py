"""The leader's state as a `FabricView`: the fabric it plans on, GPUs, load by level (pure).

Per-link load is the plan's demand split by priority level: each flow offers its bytes once
per iteration of its job (the job's standalone period), on every link from its source host
through its hops to its destination. Links are keyed by node names, so a flow and the
topology agree whether the fabric was configured or discovered from probes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence

from cruxd.control.cluster import MergedJob
from cruxd.control.records import JobAssignment
from cruxd.hints.fabric_view import FabricView, JobHint, build_view
from cruxd.model.plan import Plan
from cruxd.model.topology import Topology


def level_loads(plan: Plan | None, levels: int) -> dict[tuple[str, str], tuple[float, ...]]:
    """(src node, dst node) -> planned Gbit/s per level, level 0 first."""
    if plan is None:
        return {}
    decided = {d.job: d for d in plan.jobs}
    out: dict[tuple[str, str], list[float]] = {}
    for f in plan.flows:
        d = decided.get(f.job)
        if d is None or d.period_s <= 0 or not f.bytes:
            continue
        gbps = f.bytes * 8 / d.period_s / 1e9
        level = min(max(d.level, 0), levels - 1)
        for a, z in itertools.pairwise((f.src, *f.hops, f.dst)):
            out.setdefault((a, z), [0.0] * levels)[level] += gbps
    return {k: tuple(v) for k, v in out.items()}


def used_gpus(placements: Iterable[tuple[tuple[str, int], ...]]) -> dict[str, int]:
    """GPUs in use per host, from each job's (host, GPUs) pairs."""
    used: dict[str, int] = {}
    for hosts in placements:
        for host, n in hosts:
            used[host] = used.get(host, 0) + n
    return used


def leader_view(topo: Topology, *, gpus: Mapping[str, int], jobs: Sequence[MergedJob],
                assignments: Sequence[JobAssignment], plan: Plan | None, levels: int,
                measured: Mapping[tuple[str, str], float] | None = None,
                now_ms: int = 0) -> FabricView:
    """`gpus`: each live agent's GPU count (its inventory); hosts no agent reports keep the
    topology's count. `jobs` give the GPUs in use per host."""
    hints = tuple(JobHint(a.job_id, a.hosts, a.gpus, a.intensity, a.level) for a in assignments)
    return build_view(topo, gpus={h: n for h, n in gpus.items() if h in topo.nodes},
                      used=used_gpus(j.hosts for j in jobs), load=level_loads(plan, levels),
                      measured=measured,
                      jobs=hints, levels=levels, generated_unix_ms=now_ms)
