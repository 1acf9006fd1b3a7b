"""Equal-cost candidate paths between hosts.

A path is a tuple of link indices from the source host's NIC link to the
destination host's NIC link. Candidates are all *shortest* paths, which in a Clos
are exactly the up-down (valley-free) paths, and hosts are never transit nodes.

Enumeration goes through the switch graph: BFS distances toward the destination
switch, then a memoised count of shortest paths from each switch on the way (only
switches on some shortest path are visited). The count lets us *unrank* the r-th
path in a canonical order (links of a node taken in index order) without listing
the others. A finder caches everything per destination, so keep one per topology
(`finder_for`).

Cap rule: when a pair has N > `max_paths` shortest paths (parallel links multiply
quickly, e.g. 4 NIC links x 8 spines x 4 NIC links = 128), we keep the paths at
ranks floor(i * N / max_paths) for i = 0..max_paths-1 of a canonical order whose
most significant choice is the first hop (the source NIC link), then the switch
path (each node's links in index order), and the last hop least. An even stride
therefore keeps every first hop and every spine represented whenever max_paths is
at least their product. Same input, same paths.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from cruxd.model.topology import NodeKind, Topology

DEFAULT_MAX_PATHS = 64


class PathFinder:
    """Shortest-path enumeration with per-destination caches."""

    def __init__(self, topo: Topology, max_paths: int = DEFAULT_MAX_PATHS) -> None:
        if max_paths < 1:
            raise ValueError("max_paths must be >= 1")
        self.topo = topo
        self.max_paths = max_paths
        self._switch_out: dict[str, tuple[int, ...]] = {
            n: tuple(i for i in topo.out_links.get(n, ())
                     if topo.nodes[topo.links[i].dst].kind is NodeKind.SWITCH)
            for n in topo.switches
        }
        self._dist: dict[str, dict[str, int]] = {}
        self._nexts: dict[tuple[str, str], tuple[tuple[int, str, int], ...]] = {}
        self._cache: dict[tuple[str, str, int | None, int | None], np.ndarray] = {}
        self._rev: dict[str, list[str]] = {}
        for node, outs in self._switch_out.items():
            for i in outs:
                self._rev.setdefault(topo.links[i].dst, []).append(node)

    # --- switch graph -------------------------------------------------------
    def _distances(self, dst: str) -> dict[str, int]:
        dist = self._dist.get(dst)
        if dist is None:
            dist = {dst: 0}
            # BFS over reversed switch links: who can reach dst, and in how many hops.
            into = self._rev
            queue = deque([dst])
            while queue:
                node = queue.popleft()
                for prev in into.get(node, ()):
                    if prev not in dist:
                        dist[prev] = dist[node] + 1
                        queue.append(prev)
            self._dist[dst] = dist
        return dist

    def _next(self, node: str, dst: str) -> tuple[tuple[int, str, int], ...]:
        """(link, child, paths from child) for every link from `node` one hop closer to
        `dst`, memoised per (node, dst): only nodes on some shortest path get visited."""
        key = (node, dst)
        hit = self._nexts.get(key)
        if hit is None:
            dist = self._distances(dst)
            d = dist[node]
            hops = []
            for i in self._switch_out[node]:
                child = self.topo.links[i].dst
                if dist.get(child) == d - 1:
                    hops.append((i, child, 1 if child == dst else self._count(child, dst)))
            hit = self._nexts[key] = tuple(hops)
        return hit

    def _count(self, node: str, dst: str) -> int:
        """Shortest switch paths from `node` to `dst`."""
        return 1 if node == dst else sum(c for _, _, c in self._next(node, dst))

    def _unrank(self, src: str, dst: str, rank: int) -> list[int]:
        path: list[int] = []
        node = src
        while node != dst:
            for i, child, c in self._next(node, dst):
                if rank < c:
                    path.append(i)
                    node = child
                    break
                rank -= c
            else:  # pragma: no cover - counts and _next agree by construction
                raise AssertionError("rank out of range")
        return path

    # --- host pairs ---------------------------------------------------------
    def count(self, src: str, dst: str, src_port: int | None = None,
              dst_port: int | None = None) -> int:
        """Number of shortest paths before the cap."""
        return sum(n * len(downs) for _, downs, n in self._groups(src, dst, src_port, dst_port))

    def _groups(self, src: str, dst: str, src_port: int | None,
                dst_port: int | None) -> list[tuple[int, tuple[int, ...], int]]:
        """Shortest (first hop, last hops into one switch, switch-path count) groups, in
        canonical order: first hop, then last-hop switch, then switch path, then last hop."""
        ups = self.topo.uplinks(src)
        downs = self.topo.downlinks(dst)
        if src_port is not None:
            ups = tuple(i for i in ups if self.topo.links[i].port == src_port)
        if dst_port is not None:
            downs = tuple(i for i in downs if self.topo.links[i].port == dst_port)
        into: dict[str, list[int]] = {}
        for d in downs:
            into.setdefault(self.topo.links[d].src, []).append(d)
        best = None
        groups: list[tuple[int, tuple[int, ...], int]] = []
        for u in ups:
            s1 = self.topo.links[u].dst
            for s2 in sorted(into):
                hops = self._distances(s2).get(s1)
                if hops is None:
                    continue
                if best is None or hops < best:
                    best, groups = hops, []
                if hops == best:
                    groups.append((u, tuple(into[s2]), self._count(s1, s2)))
        return groups

    def candidates(self, src: str, dst: str, src_port: int | None = None,
                   dst_port: int | None = None) -> np.ndarray:
        """Candidate paths as an int array of shape (paths, links), canonical order.

        Empty (0, 0) when the hosts are the same or not connected.
        """
        key = (src, dst, src_port, dst_port)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        groups = [] if src == dst else self._groups(src, dst, src_port, dst_port)
        total = sum(n * len(downs) for _, downs, n in groups)
        if total == 0:
            out = np.zeros((0, 0), dtype=np.int64)
        else:
            ranks = range(total) if total <= self.max_paths else (
                (i * total) // self.max_paths for i in range(self.max_paths))
            rows = [self._path_at(groups, r) for r in ranks]
            out = np.array(rows, dtype=np.int64)
        out.setflags(write=False)
        self._cache[key] = out
        return out

    def _path_at(self, groups: list[tuple[int, tuple[int, ...], int]], rank: int) -> list[int]:
        for u, downs, n in groups:
            if rank < n * len(downs):
                d = downs[rank % len(downs)]
                s1, s2 = self.topo.links[u].dst, self.topo.links[d].src
                return [u, *self._unrank(s1, s2, rank // len(downs)), d]
            rank -= n * len(downs)
        raise AssertionError("rank out of range")  # pragma: no cover


def finder_for(topo: Topology, max_paths: int = DEFAULT_MAX_PATHS) -> PathFinder:
    """The shared finder of a topology: its caches outlive one plan (topologies are
    immutable, so a re-plan on the same fabric reuses every enumerated path)."""
    key = (PathFinder, max_paths)
    finder = topo.derived.get(key)
    if not isinstance(finder, PathFinder):
        finder = topo.derived[key] = PathFinder(topo, max_paths)
    return finder
