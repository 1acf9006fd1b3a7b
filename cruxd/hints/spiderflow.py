"""SpiderFlow export: the state information table as a graph (pure).

SpiderFlow's SpinSearch (seed §4.1) schedules over an undirected graph whose
vertices are clusters with g_i free GPUs and whose edges carry a bandwidth b_ij.
Inside one fabric the schedulable unit that shares a network position is the
*leaf group*: the hosts cabled to the same set of ToRs (one ToR, or the pair of a
dual-homed pod). So one vertex per leaf group, g_i = the free GPUs of its hosts.

An edge joins two groups that reach each other through the fabric; b_ij is the
aggregate residual bandwidth the fabric can carry between them (ECMP spreads a
job's flows over every equal-cost path, so the aggregate, not one cable, is the
capacity a placement gets):
  same pod:   sum over aggregation switches x of min(up(U->x), down(x->V)),
              exact max-flow of the two-hop leaf-agg-leaf paths (disjoint per x);
  cross pod:  min(up(U), core(P->Q), down(V)), the smallest of the three cuts
              on the leaf-agg-core-agg-leaf paths (an upper bound of that flow).
residual = (measured when known, else nominal) - planned load, floored at 0, and
b_ij = min of the two directions, as the seed's graph is undirected. `hops` is the
switch-to-switch link count between the groups' ToRs (2 in a pod, 4 across), the
distance SpinSearch's hop expansion widens over. See docs/hints/spiderflow.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from cruxd.hints.fabric_view import FabricView, HostHint, LinkHint, natural

FORMAT = "crux.spiderflow"
VERSION = 1
HOPS_IN_POD = 2  # leaf -> agg -> leaf
HOPS_CROSS_POD = 4  # leaf -> agg -> core -> agg -> leaf

Matrix = npt.NDArray[np.float64]


def residual_gbps(link: LinkHint) -> float:
    """What is left on one direction of a link for a new job."""
    capacity = link.nominal_gbps if link.measured_gbps is None else link.measured_gbps
    return max(0.0, capacity - link.load_total_gbps)


def widest_paths(matrix: Matrix) -> Matrix:
    """Eq. 1, beta(u->v) = max over paths of the min edge bandwidth, by the
    max-min Floyd-Warshall. `matrix[u, v]` is b_uv (0 = no edge). The diagonal of
    the result is +inf: a placement inside one vertex has no fabric bottleneck."""
    w = np.array(matrix, dtype=np.float64, copy=True)
    n = w.shape[0]
    np.fill_diagonal(w, np.inf)
    for k in range(n):
        # a path through k is as wide as its narrower half
        w = np.maximum(w, np.minimum(w[:, k, None], w[None, k, :]))
    return w


def bandwidth_scores(matrix: Matrix, source: int | None = None) -> Matrix:
    """B_i: Eq. 2, the sum of incident link bandwidths; or, when the task talks
    to a designated source cluster r, Eq. 3, beta(r -> i)."""
    if source is not None:
        return np.asarray(widest_paths(matrix)[source], dtype=np.float64)
    off = np.array(matrix, dtype=np.float64, copy=True)
    np.fill_diagonal(off, 0.0)
    return np.asarray(off.sum(axis=1), dtype=np.float64)


def leaf_groups(view: FabricView) -> dict[tuple[str, ...], tuple[HostHint, ...]]:
    """Leaf set -> its hosts, in natural order of the first leaf; hosts with no
    ToR (unreachable in the fabric) cannot be placed on and are left out."""
    out: dict[tuple[str, ...], list[HostHint]] = {}
    for name in sorted(view.hosts, key=natural):
        host = view.hosts[name]
        if host.leaves:
            out.setdefault(host.leaves, []).append(host)
    keys = sorted(out, key=lambda ls: [natural(x) for x in ls])
    return {k: tuple(out[k]) for k in keys}


def edge_matrices(view: FabricView, groups: list[tuple[str, ...]]) -> tuple[Matrix, Matrix]:
    """(b, hops) over the groups, b symmetric with a zero diagonal."""
    res = {(lk.src, lk.dst): residual_gbps(lk) for lk in view.links}
    aggs = sorted({a for pa in view.pod_aggs.values() for a in pa}, key=natural)
    pods = list(view.pod_aggs)
    gpod = np.array([pods.index(view.leaf_pod[g[0]]) for g in groups])
    up = np.array([[sum(res.get((leaf, x), 0.0) for leaf in g) for x in aggs] for g in groups])
    down = np.array([[sum(res.get((x, leaf), 0.0) for leaf in g) for x in aggs] for g in groups])
    up = up.reshape(len(groups), len(aggs))
    down = down.reshape(len(groups), len(aggs))
    # same pod: aggregation switches of other pods carry nothing to V, so the
    # plain sum over all switches is the per-pod sum
    fwd = np.minimum(up[:, None, :], down[None, :, :]).sum(axis=2)
    agg_core = np.array([[sum(res.get((x, c), 0.0) for x in view.pod_aggs[p]) for c in view.cores]
                         for p in pods]).reshape(len(pods), len(view.cores))
    core_agg = np.array([[sum(res.get((c, x), 0.0) for x in view.pod_aggs[p]) for c in view.cores]
                         for p in pods]).reshape(len(pods), len(view.cores))
    core = np.minimum(agg_core[:, None, :], core_agg[None, :, :]).sum(axis=2)
    cross = np.minimum(np.minimum(up.sum(axis=1)[:, None], core[gpod][:, gpod]),
                       down.sum(axis=1)[None, :])
    same = gpod[:, None] == gpod[None, :]
    fwd = np.where(same, fwd, cross)
    bw = np.minimum(fwd, fwd.T)
    np.fill_diagonal(bw, 0.0)
    hops = np.where(same, float(HOPS_IN_POD), float(HOPS_CROSS_POD))
    np.fill_diagonal(hops, 0.0)
    return bw, hops


def _num(x: float) -> float | None:
    """JSON has no infinity: the widest path from a vertex to itself is null."""
    return None if not np.isfinite(x) else round(float(x), 3)


def export(view: FabricView) -> dict[str, Any]:
    """The versioned SpiderFlow document (schema: docs/hints/spiderflow.schema.json)."""
    grouped = leaf_groups(view)
    groups = list(grouped)
    bw, hops = edge_matrices(view, groups) if groups else (np.zeros((0, 0)), np.zeros((0, 0)))
    beta = widest_paths(bw)
    scores = bandwidth_scores(bw)
    vertices = [{
        "id": "+".join(g),
        "leaves": list(g),
        "pod": view.leaf_pod[g[0]],
        "gpus": sum(h.gpus for h in hosts),
        "gpus_free": sum(h.gpus_free for h in hosts),
        "hosts": [{"host": h.host, "gpus": h.gpus, "gpus_free": h.gpus_free} for h in hosts],
    } for g, hosts in grouped.items()]
    edges = [{"u": i, "v": j, "gbps": round(float(bw[i, j]), 3), "hops": int(hops[i, j])}
             for i in range(len(groups)) for j in range(i + 1, len(groups)) if bw[i, j] > 0]
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": view.name,
        "generated_unix_ms": view.generated_unix_ms,
        "vertices": vertices,
        "edges": edges,
        "widest_gbps": [[_num(x) for x in row] for row in beta],
        "score": "incident",
        "score_gbps": [round(float(s), 3) for s in scores],
    }
