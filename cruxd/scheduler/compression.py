"""Priority compression (seed §4.3, Alg. 1): Max-K-Cut of the contention DAG.

Jobs with unique priorities must share K levels. An edge (hi, lo) of the
contention DAG says the two share a link and hi outranks lo; its weight is what
is lost when both land on one level (the seed: I of the higher job). We want the
K-partition that cuts the most weight without ever putting lo above hi.

For one topological order a_1..a_n, cutting it into K consecutive blocks is a
valid partition (Theorem 2), and every valid partition arises from some order
(Theorem 3). Per order, Eq. 4:  f(i, k) = max_{j<i} f(j, k-1) + C(j, i), where
C(j, i) is the weight of edges from a_1..a_j into a_{j+1}..a_i. The increment
C(j, i2) - C(j, i1) only grows with j (weights are non-negative), so the argmax
of f(., k) is monotone in i (the quadrangle inequality). We exploit it with the
divide-and-conquer scheme: evaluate the middle i of a range over its allowed j
window, split the windows at the argmax. All middles of one round are done in a
single numpy pass, so one level costs O(n log n) lookups into the O(n^2) prefix
sum matrix, which dominates: O(n^2) per order instead of O(n^2 K).

Components of the DAG are independent (they can reuse every level), so each is
solved on its own, which keeps the dense matrices small. A component's levels are a
pure function of the component alone (`component_levels`): nothing is shared between
components, so an incremental planner may keep the levels of every component whose
inputs did not change (`ComponentMemo`). Precisely, the three things that could
couple them are cut: (1) the level budget does not, as every component may use all
K levels; (2) the random orders come from a generator seeded afresh with `seed` for
each component, not from one stream consumed component after component; (3) weights
are scaled per component by a power of two (exact in floating point) so that the
largest is in [0.5, 1), which makes the result independent of a global normaliser
such as the planner's largest intensity, and the "better sample" test is relative.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from cruxd.scheduler.order_cut import cut_of_order, prefix_sums, prefix_sums_transposed

Edges = Mapping[tuple[Any, Any], float]
_FLOAT32_ABOVE = 2048  # component size from which the DP's prefix matrix is float32
# Each sampled order costs an m x m prefix matrix; a component gets at most this many
# cells' worth of orders (at least one): 10 orders up to 1,295 jobs, 3 for the 2,268-job
# component of bench/control_plane.py's stress shape, where 3 and 10 orders found the
# same cut on every arrival measured (and 3 took 140 ms less per re-plan).
_SAMPLE_CELLS = 1 << 24


def compress(edges: Edges, levels: int, *, samples: int = 10, seed: int = 0) -> dict[str, int]:
    """Levels for every job named in `edges`: 0 lowest, `levels`-1 highest.

    `edges` maps (higher_job, lower_job) to a non-negative weight. The first order
    tried is a deterministic one (Kahn's algorithm, smallest name first); the other
    `samples`-1 are random topological orders drawn with `seed` (fewer for components
    over 1,295 jobs: _SAMPLE_CELLS).
    """
    names, hi, lo, w = _index(edges)
    order = _kahn(len(names), hi, lo, names)
    lv = compress_indexed(len(names), hi, lo, w, levels, order, samples=samples, seed=seed)
    return {str(names[i]): int(lv[i]) for i in range(len(names))}


def compress_indexed(n: int, hi: np.ndarray, lo: np.ndarray, w: np.ndarray, levels: int,
                     order: np.ndarray, *, samples: int = 10, seed: int = 0,
                     memo: ComponentMemo | None = None,
                     free: np.ndarray | None = None) -> np.ndarray:
    """The planner's entry point: nodes 0..n-1, edge arrays, one known topological order.

    Returns an int array of levels. Nodes without edges get the top level. `memo`:
    levels of components solved before, reused when a component's inputs are equal.
    `free` (bool per edge): edges that weigh in the cut but do not order their ends, for
    jobs whose priorities tie (their order is the ids', which must not forbid a cut).
    """
    if levels < 1:
        raise ValueError("levels must be >= 1")
    out = np.full(n, levels - 1, dtype=np.int64)
    if n == 0 or len(hi) == 0:
        return out
    graph = coo_matrix((np.ones(len(hi)), (hi, lo)), shape=(n, n))
    ncomp, comp = connected_components(graph, directed=True, connection="weak")
    # nodes grouped by component, each group still in the known order; edges likewise
    nodes = order[np.argsort(comp[order], kind="stable")]
    node_cut = np.searchsorted(comp[nodes], np.arange(ncomp + 1))
    edges = np.argsort(comp[hi], kind="stable")
    edge_cut = np.searchsorted(comp[hi][edges], np.arange(ncomp + 1))
    local = np.empty(n, dtype=np.int64)
    for c in range(ncomp):
        members = nodes[node_cut[c]:node_cut[c + 1]]
        if len(members) < 2:
            continue
        sel = edges[edge_cut[c]:edge_cut[c + 1]]
        local[members] = np.arange(len(members))
        out[members] = component_levels(len(members), local[hi[sel]], local[lo[sel]], w[sel],
                                        levels, samples=samples, seed=seed, memo=memo,
                                        free=None if free is None else free[sel])
    return out


class ComponentMemo:
    """Levels of the components solved in the last plan (and this one), keyed by their
    exact inputs; `roll` after each plan forgets what the last plan did not use."""

    def __init__(self) -> None:
        self._last: dict[bytes, np.ndarray] = {}
        self._now: dict[bytes, np.ndarray] = {}
        self.hits = self.misses = 0

    def get(self, key: bytes) -> np.ndarray | None:
        hit = self._now.get(key)
        if hit is None:
            hit = self._last.get(key)
            if hit is not None:
                self._now[key] = hit
        return hit

    def put(self, key: bytes, levels: np.ndarray) -> None:
        self._now[key] = levels

    def roll(self) -> None:
        self._last, self._now = self._now, {}


def component_levels(m: int, hi: np.ndarray, lo: np.ndarray, w: np.ndarray, levels: int, *,
                     samples: int = 10, seed: int = 0, memo: ComponentMemo | None = None,
                     free: np.ndarray | None = None) -> np.ndarray:
    """Levels of one weakly connected component, nodes 0..m-1 in a topological order of
    its edges that are not `free`: a function of these arguments only (see the module
    docstring)."""
    free = np.zeros(len(hi), dtype=bool) if free is None else np.asarray(free, dtype=bool)
    # duplicate edges count once, at their largest weight (ordering if any copy orders)
    key = hi * m + lo
    srt = np.lexsort((free, -w, key))
    first = np.r_[True, key[srt][1:] != key[srt][:-1]]
    hi, lo, w, free = hi[srt][first], lo[srt][first], w[srt][first], free[srt][first]
    top = float(w.max())
    if top > 0:  # a power of two: exact, so only the weights' ratios matter
        w = np.ldexp(w, -math.frexp(top)[1])
    tag = None
    if memo is not None:
        tag = b"".join([np.array([m, levels, samples, seed], dtype=np.int64).tobytes(),
                        hi.astype(np.int64).tobytes(), lo.astype(np.int64).tobytes(),
                        w.astype(np.float64).tobytes(), np.packbits(free).tobytes()])
        hit = memo.get(tag)
        if hit is not None:
            memo.hits += 1
            return hit
        memo.misses += 1
    out = _component(m, hi, lo, w, free, levels, samples, np.random.default_rng(seed))
    out.setflags(write=False)
    if memo is not None and tag is not None:
        memo.put(tag, out)
    return out


def _component(m: int, hi: np.ndarray, lo: np.ndarray, w: np.ndarray, free: np.ndarray,
               levels: int, samples: int, rng: np.random.Generator) -> np.ndarray:
    """Best K-cut over `samples` orders of one component whose identity order is valid
    for its ordering edges (edges deduplicated). An order's blocks cut an edge whatever
    its direction, so every edge's weight sits at (earlier end, later end)."""
    # Large components run the DP on a float32 prefix matrix (half the memory traffic
    # of the O(m^2) prefix sums that dominate); every order's cut is then scored
    # exactly in float64 from the edges, so rounding can only cost optimality, never
    # validity.
    samples = min(samples, max(1, _SAMPLE_CELLS // (m * m)))
    big = m > _FLOAT32_ABOVE
    prefix = np.empty((m, m), dtype=np.float32 if big else np.float64)
    spare = np.empty_like(prefix) if big else None
    layers = _layers(m, hi[~free], lo[~free]) if samples > 1 else None
    best_val, best_levels = -np.inf, np.zeros(m, dtype=np.int64)
    for s in range(max(1, samples)):
        perm = np.arange(m) if s == 0 or layers is None else _random_order(m, layers, rng)
        pos = np.empty(m, dtype=np.int64)
        pos[perm] = np.arange(m)
        a, b = np.minimum(pos[hi], pos[lo]), np.maximum(pos[hi], pos[lo])
        if spare is None:
            prefix.fill(0.0)
            prefix[a, b] = w
            prefix_sums(prefix)
        else:
            prefix_sums_transposed(spare, prefix, a, b, w)
        blocks = cut_of_order(prefix, levels)[1]
        lv = np.empty(m, dtype=np.int64)
        lv[perm] = levels - 1 - blocks
        val = float(w[lv[hi] != lv[lo]].sum())
        if val > best_val * (1 + 1e-12) or s == 0:
            best_val, best_levels = val, lv
    return best_levels


def _layers(m: int, hi: np.ndarray, lo: np.ndarray) -> list[tuple[np.ndarray, np.ndarray,
                                                                    np.ndarray]]:
    """The nodes by longest-path depth (the identity order is topological), each
    depth with its nodes' predecessors concatenated and where each node's start."""
    indptr = np.searchsorted(np.sort(lo), np.arange(m + 1))
    preds = hi[np.argsort(lo, kind="stable")]
    depth = np.zeros(m, dtype=np.int64)
    for v in range(m):
        p = preds[indptr[v]:indptr[v + 1]]
        if len(p):
            depth[v] = depth[p].max() + 1
    out = []
    by_depth = np.argsort(depth, kind="stable")
    cut = np.searchsorted(depth[by_depth], np.arange(int(depth.max()) + 2))
    for d in range(int(depth.max()) + 1):
        nodes = by_depth[cut[d]:cut[d + 1]]
        counts = indptr[nodes + 1] - indptr[nodes]
        idx = np.concatenate([np.arange(indptr[v], indptr[v + 1]) for v in nodes.tolist()])
        out.append((nodes, preds[idx] if d else idx, np.cumsum(counts) - counts))
    return out


def _random_order(m: int, layers: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                  rng: np.random.Generator) -> np.ndarray:
    """A random linear extension: key(v) = max(key(predecessors)) + Exp(1).

    Any topological order has positive probability. Computed depth by depth: every
    predecessor of a node is at a smaller depth, so its key is final.
    """
    key = np.empty(m)
    inc = rng.exponential(size=m)
    for d, (nodes, preds, starts) in enumerate(layers):
        key[nodes] = (np.maximum.reduceat(key[preds], starts) + inc[nodes] if d
                      else inc[nodes])
    return np.argsort(key, kind="stable")


def _index(edges: Edges) -> tuple[list[Hashable], np.ndarray, np.ndarray, np.ndarray]:
    names = sorted({x for e in edges for x in e}, key=str)
    ix = {x: i for i, x in enumerate(names)}
    hi = np.array([ix[h] for h, _ in edges], dtype=np.int64)
    lo = np.array([ix[lo] for _, lo in edges], dtype=np.int64)
    w = np.array([float(v) for v in edges.values()], dtype=np.float64)
    if len(w) and (not np.all(np.isfinite(w)) or np.any(w < 0)):
        raise ValueError("edge weights must be finite and >= 0")
    if np.any(hi == lo):
        raise ValueError("an edge cannot join a job to itself")
    return names, hi, lo, w


def _kahn(n: int, hi: np.ndarray, lo: np.ndarray, names: Sequence[Hashable]) -> np.ndarray:
    """A deterministic topological order; raises if the edges have a cycle."""
    import heapq

    indeg = np.bincount(lo, minlength=n)
    succ: list[list[int]] = [[] for _ in range(n)]
    for h, low in zip(hi.tolist(), lo.tolist(), strict=True):
        succ[h].append(low)
    heap = [(str(names[i]), i) for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    out: list[int] = []
    while heap:
        _, v = heapq.heappop(heap)
        out.append(v)
        for u in succ[v]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, (str(names[u]), u))
    if len(out) != n:
        raise ValueError("the contention graph has a cycle: it is not a DAG")
    return np.array(out, dtype=np.int64)
