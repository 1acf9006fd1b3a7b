"""SpinSearch (seed §4.1, Eq. 1-7) over a crux.spiderflow document, nothing else.

Steps, as §4.1.4 walks them: (1) the source cluster alone, when the task names
one; (2) the first cluster, in descending B_i, that alone fits; (3) the source's
GPUs pre-allocated plus the first cluster in that order that fits the rest;
(4) hop expansion from the anchor s* (Eq. 5): rings of growing hop distance
(Eq. 6), each sorted by (beta(s*->i), g_i, B_i) (Eq. 7), filled First-Fit with
Delta_i = min(g_i, R) (Eq. 4). Clusters of an inner ring are kept when the
radius grows ("repeats the search among the remaining clusters"), so a pod is
used up before the search leaves it. Ties keep the document's vertex order.
"""

from __future__ import annotations

import heapq
import math
from typing import Any


def _beta(doc: dict[str, Any]) -> list[list[float]]:
    return [[math.inf if x is None else float(x) for x in row] for row in doc["widest_gbps"]]


def _distances(doc: dict[str, Any], start: int) -> list[float]:
    """Fewest hops from `start` (Dijkstra over edge hops; 1 when not given)."""
    n = len(doc["vertices"])
    adj: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for e in doc["edges"]:
        h = float(e.get("hops", 1))
        adj[e["u"]].append((e["v"], h))
        adj[e["v"]].append((e["u"], h))
    dist = [math.inf] * n
    dist[start] = 0.0
    heap = [(0.0, start)]
    while heap:
        d, u = heapq.heappop(heap)
        if d > dist[u]:
            continue
        for v, h in adj[u]:
            if d + h < dist[v]:
                dist[v] = d + h
                heapq.heappush(heap, (d + h, v))
    return dist


def spin_search(doc: dict[str, Any], demand: int,
                source: str | None = None) -> dict[str, int] | None:
    """Cluster id -> GPUs taken, in allocation order; None when the free GPUs
    of the whole graph cannot meet `demand`. With `source`, B_i is Eq. 3."""
    if demand <= 0:
        raise ValueError("demand must be > 0")
    ids = [v["id"] for v in doc["vertices"]]
    free = [int(v["gpus_free"]) for v in doc["vertices"]]
    beta = _beta(doc)
    r = ids.index(source) if source is not None else None
    score = beta[r] if r is not None else [float(s) for s in doc["score_gbps"]]
    order = sorted(range(len(ids)), key=lambda i: -score[i])  # stable: ties keep doc order

    if r is not None and free[r] >= demand:  # step 1: local resources suffice
        return {ids[r]: demand}
    for i in order:  # step 2: one cluster, visited by bandwidth
        if free[i] >= demand:
            return {ids[i]: demand}
    if r is not None and free[r] > 0:  # step 3: source pre-allocated, one more cluster
        rest = demand - free[r]
        for i in order:
            if i != r and free[i] >= rest:
                return {ids[r]: free[r], ids[i]: rest}
    if sum(free) < demand:
        return None

    # step 4: anchor (Eq. 5); a cluster with nothing free cannot anchor a placement
    anchor = r if r is not None and free[r] > 0 else max(
        (i for i in order if free[i] > 0), key=lambda i: (score[i], free[i]))
    dist = _distances(doc, anchor)
    taken: dict[str, int] = {}
    left = demand
    for radius in sorted({d for d in dist if math.isfinite(d)}):
        ring = [i for i in range(len(ids)) if dist[i] == radius and free[i] > 0]
        ring.sort(key=lambda i: (beta[anchor][i], free[i], score[i]), reverse=True)
        for i in ring:
            take = min(free[i], left)  # Eq. 4
            taken[ids[i]] = take
            left -= take
            if left == 0:
                return taken
    return None  # the free GPUs lie in parts of the graph the anchor cannot reach
