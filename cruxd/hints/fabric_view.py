"""The fabric as schedulers see it: tiers, GPUs, link bandwidth and load (pure).

Every export format is rendered from one `FabricView`, built from a `Topology`
(configured, built or discovered from probes) plus what the leader knows: each
host's GPUs, the GPUs the current jobs hold, the plan's per-link demand by
priority level, and measured bandwidth samples.

Tiers are inferred from the graph, not from `Node.tier`, because a discovered
fabric only knows hop distances: a *leaf* (ToR) is a switch with a host below
it; an *aggregation* switch is one a leaf links to; every other switch is
*core*. A *pod* (Arnold's minipod) is a connected group of leaves and the
aggregation switches they link to, the cores removed. On a two-tier Clos every
leaf reaches every spine, so the whole fabric is one pod, which is the truth.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from cruxd.model.topology import NodeKind, Topology

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class HostHint:
    host: str
    leaves: tuple[str, ...]  # the ToRs it is cabled to, sorted (dual-homed: two)
    pod: str
    gpus: int
    gpus_used: int = 0

    @property
    def leaf(self) -> str:
        return self.leaves[0] if self.leaves else ""

    @property
    def gpus_free(self) -> int:
        return max(0, self.gpus - self.gpus_used)


@dataclass(frozen=True, slots=True)
class LinkHint:
    """One direction of a node pair; parallel cables merged."""

    src: str
    dst: str
    nominal_gbps: float  # sum over the parallel cables
    cables: int = 1
    load_gbps: tuple[float, ...] = ()  # planned demand per priority level, level 0 first
    measured_gbps: float | None = None  # best recent measured throughput, when known

    @property
    def load_total_gbps(self) -> float:
        return sum(self.load_gbps)


@dataclass(frozen=True, slots=True)
class JobHint:
    job_id: str
    hosts: tuple[str, ...]
    gpus: int
    intensity: float = 0.0  # I_j, FLOP/s unlocked per second on the wire; 0 = unknown
    level: int = 0


@dataclass(frozen=True)
class FabricView:
    name: str
    generated_unix_ms: int
    levels: int
    hosts: dict[str, HostHint]
    leaf_pod: dict[str, str]  # leaf -> pod
    pod_aggs: dict[str, tuple[str, ...]]  # pod -> its aggregation switches
    cores: tuple[str, ...]
    links: tuple[LinkHint, ...]  # sorted by (src, dst)
    jobs: tuple[JobHint, ...] = ()

    @cached_property
    def _link_index(self) -> dict[tuple[str, str], LinkHint]:
        return {(lk.src, lk.dst): lk for lk in self.links}

    def link(self, src: str, dst: str) -> LinkHint | None:
        return self._link_index.get((src, dst))

    def pods(self) -> dict[str, tuple[str, ...]]:
        """pod -> its leaves, sorted."""
        out: dict[str, list[str]] = {}
        for leaf, pod in sorted(self.leaf_pod.items(), key=lambda lp: natural(lp[0])):
            out.setdefault(pod, []).append(leaf)
        return {p: tuple(v) for p, v in sorted(out.items(), key=lambda pv: natural(pv[0]))}

    def leaf_hosts(self) -> dict[str, tuple[str, ...]]:
        """leaf -> the hosts whose first ToR it is, sorted."""
        out: dict[str, list[str]] = {leaf: [] for leaf in self.leaf_pod}
        for h in sorted(self.hosts, key=natural):
            if self.hosts[h].leaf:
                out[self.hosts[h].leaf].append(h)
        return {leaf: tuple(v) for leaf, v in sorted(out.items(), key=lambda lv: natural(lv[0]))}


def natural(name: str) -> tuple[object, ...]:
    """Sort key that puts agg2 before agg10."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def build_view(topo: Topology, *, gpus: Mapping[str, int] | None = None,
               used: Mapping[str, int] | None = None,
               load: Mapping[tuple[str, str], tuple[float, ...]] | None = None,
               measured: Mapping[tuple[str, str], float] | None = None,
               jobs: tuple[JobHint, ...] = (), levels: int = 1,
               generated_unix_ms: int = 0) -> FabricView:
    """`gpus` overrides the topology's per-host GPU counts (agents' inventories);
    `used` is GPUs held per host; `load` and `measured` are keyed by (src, dst) node."""
    gpus = gpus or {}
    used = used or {}
    hosts = set(topo.hosts)
    alias = split_leaves(topo)
    edges = [(alias.get(lk.src, lk.src), alias.get(lk.dst, lk.dst), lk.capacity_gbps)
             for lk in topo.links]
    nbrs: dict[str, set[str]] = {n: set() for n in topo.nodes if n not in alias}
    for a, z, _ in edges:
        nbrs[a].add(z)
        nbrs[z].add(a)
    switches = [s for s in nbrs if topo.nodes[s].kind is NodeKind.SWITCH]
    leaves = sorted((s for s in switches if nbrs[s] & hosts), key=natural)
    leaf_set = set(leaves)
    aggs = sorted((s for s in switches if s not in leaf_set and nbrs[s] & leaf_set),
                  key=natural)
    agg_set = set(aggs)
    cores = tuple(sorted((s for s in switches if s not in leaf_set and s not in agg_set),
                         key=natural))

    leaf_pod, pod_aggs = _pods(leaves, agg_set, nbrs)
    host_hints = {}
    for h in sorted(hosts, key=natural):
        mine = tuple(sorted(nbrs[h] & leaf_set, key=natural))
        pod = leaf_pod[mine[0]] if mine else ""
        total = gpus.get(h, topo.nodes[h].gpus)
        host_hints[h] = HostHint(h, mine, pod, total, min(total, used.get(h, 0)))

    merged: dict[tuple[str, str], list[float]] = {}
    for a, z, cap in edges:
        merged.setdefault((a, z), []).append(cap)
    loads: dict[tuple[str, str], list[float]] = {}
    for (a, z), per_level in (load or {}).items():
        key = (alias.get(a, a), alias.get(z, z))
        acc = loads.setdefault(key, [0.0] * len(per_level))
        for i, v in enumerate(per_level):
            acc[i] += v
    best: dict[tuple[str, str], float] = {}
    for (a, z), v in (measured or {}).items():
        key = (alias.get(a, a), alias.get(z, z))
        best[key] = max(best.get(key, 0.0), v)
    links = tuple(
        LinkHint(a, z, sum(caps), len(caps), tuple(loads.get((a, z), ())), best.get((a, z)))
        for (a, z), caps in sorted(merged.items()))
    return FabricView(topo.name, generated_unix_ms, levels, host_hints, leaf_pod, pod_aggs,
                      cores, links, jobs)


def split_leaves(topo: Topology) -> dict[str, str]:
    """Halves of one ToR that probing could not tie together -> the name kept for it.

    Routers that answer TTL probes from the interface a probe arrived on show a ToR as two
    routers: one its hosts' traffic enters (host links in only), one that delivers to them
    (host links out only), and nothing in the hop lists ties their addresses (see
    cruxd/control/discovery.py). Such one-way halves serving the same hosts are one ToR.
    Real ToRs carry host links both ways, so a dual-homed pair is never merged. The
    aggregation and core switches can stay split the same way; that over-counts them but
    leaves every tier (host -> leaf -> pod) exact."""
    up: dict[str, set[str]] = {}
    down: dict[str, set[str]] = {}
    for lk in topo.links:
        if topo.is_host(lk.src) and not topo.is_host(lk.dst):
            up.setdefault(lk.dst, set()).add(lk.src)
        elif topo.is_host(lk.dst) and not topo.is_host(lk.src):
            down.setdefault(lk.src, set()).add(lk.dst)
    groups: dict[frozenset[str], list[str]] = {}
    for leaf in up.keys() ^ down.keys():  # one-way halves only
        groups.setdefault(frozenset(up.get(leaf) or down[leaf]), []).append(leaf)
    alias = {}
    for halves in groups.values():
        keep = min(halves, key=natural)
        alias.update({h: keep for h in halves if h != keep})
    return alias


def _pods(leaves: list[str], aggs: set[str], nbrs: dict[str, set[str]]
          ) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """Connected groups of leaves and aggregation switches, each named after its
    first leaf's position: pod0, pod1, ... in leaf order."""
    leaf_pod: dict[str, str] = {}
    pod_aggs: dict[str, tuple[str, ...]] = {}
    leaf_set = set(leaves)
    for start in leaves:
        if start in leaf_pod:
            continue
        pod = f"pod{len(pod_aggs)}"
        seen_aggs: set[str] = set()
        stack = [start]
        while stack:
            leaf = stack.pop()
            if leaf in leaf_pod:
                continue
            leaf_pod[leaf] = pod
            for agg in nbrs[leaf] & aggs:
                if agg not in seen_aggs:
                    seen_aggs.add(agg)
                    stack.extend(n for n in nbrs[agg] & leaf_set if n not in leaf_pod)
        pod_aggs[pod] = tuple(sorted(seen_aggs, key=natural))
    return leaf_pod, pod_aggs
