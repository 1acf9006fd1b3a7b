"""The fabric as the agents' probes found it: hop lists merged into a topology (pure).

Each hop of a TTL trace is the address a router answered from. On a fabric of
point-to-point links whose routers answer from the interface a probe arrived on
(Linux: `icmp_errors_use_inbound_ifaddr=1`; most switch OSes by default), a hop
address names the link into that router, so two rules do the alias resolution:

* every router that precedes one hop address is the same router (the far end of
  one cable), and so is every router that precedes one destination address;
* a router is named by its smallest known address.

The result is a directed topology with one link per observed (router, next hop)
pair and the path table rewritten in router names, so the planner's link
accounting sees two flows share a cable exactly when their probes crossed it.
Routers stay split where no probe ties their addresses together (a spine seen from
two leaves in opposite directions): that splits nodes, never links. INT node ids
name routers directly and need no aliasing; the same code handles them.
"""

from __future__ import annotations

import ipaddress
import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from cruxd.control.records import Nic, PathTable
from cruxd.model.topology import Topology, TopologyBuilder
from cruxd.model.view import DiscoveredPath

NAME = "discovered"


class _Aliases:
    """Union-find over hop addresses."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, a: str) -> str:
        self.parent.setdefault(a, a)
        root = a
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[a] != root:
            self.parent[a], a = root, self.parent[a]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            lo, hi = sorted((ra, rb), key=_order)
            self.parent[hi] = lo  # the root is always the smallest address: the name


def _order(hop: str) -> tuple[int, int, str]:
    try:
        return (0, int(ipaddress.ip_address(hop)), hop)
    except ValueError:
        return (1, 0, hop)


@dataclass(frozen=True)
class DiscoveredFabric:
    topology: Topology
    paths: dict[tuple[str, str], tuple[DiscoveredPath, ...]]  # hops as router names
    routers: dict[str, tuple[str, ...]]  # router name -> its known addresses


def discover(tables: Mapping[str, Mapping[str, PathTable]], nics: Mapping[str, tuple[Nic, ...]],
             link_gbps: float) -> DiscoveredFabric | None:
    """The fabric behind the live agents' path tables (src host -> dst host -> table);
    None when no agent has found a path yet. Host links run at the host's fastest
    NIC speed when it reports one, fabric links at `link_gbps`."""
    hosts = set(nics) | {d for t in tables.values() for d in t}
    aliases = _Aliases()
    ingress_of: dict[str, str] = {}  # hop address or "dst@addr" -> first router seen before it
    found = False
    for by_dst in tables.values():
        for dst, table in by_dst.items():
            for p in table.paths:
                found = found or bool(p.hops)
                for prev, hop in itertools.pairwise(p.hops):
                    _tie(aliases, ingress_of, hop, prev)
                if p.hops:
                    _tie(aliases, ingress_of, f"{dst}@{table.dst_address}", p.hops[-1])
    if not found:
        return None
    hops = {h for by_dst in tables.values() for t in by_dst.values() for p in t.paths
            for h in p.hops}
    clash = sorted(hops & hosts)
    if clash:  # a hop named like a host would merge the two: refuse rather than guess
        raise ValueError(f"hop {clash[0]!r} is also a host name")
    tier: dict[str, int] = {}
    edges: set[tuple[str, str]] = set()
    renamed: dict[tuple[str, str], tuple[DiscoveredPath, ...]] = {}
    for src, by_dst in tables.items():
        for dst, table in by_dst.items():
            out = []
            for p in table.paths:
                names = tuple(aliases.find(h) for h in p.hops)
                if not names:
                    continue
                seq = (src, *names, dst)
                edges.update(itertools.pairwise(seq))
                for i, name in enumerate(names, 1):
                    tier[name] = min(tier.get(name, 99), i, len(names) + 1 - i)
                out.append(DiscoveredPath(names, p.sports, p.tcp))
            if out:
                renamed[(src, dst)] = tuple(out)
    b = TopologyBuilder(NAME)
    for h in sorted(hosts):
        b.host(h, 0)
    for r in sorted(tier, key=_order):
        b.switch(r, tier[r])
    for a, z in sorted(edges):
        speed = _nic_gbps(nics.get(a) or nics.get(z) or ()) if a in hosts or z in hosts else 0
        b.link(a, z, speed or link_gbps, both=False)
    routers: dict[str, list[str]] = {}
    for addr in sorted(hops, key=_order):
        routers.setdefault(aliases.find(addr), []).append(addr)
    return DiscoveredFabric(b.build(), renamed, {r: tuple(a) for r, a in routers.items()})


def _tie(aliases: _Aliases, ingress_of: dict[str, str], hop: str, prev: str) -> None:
    if _order(prev)[0]:
        return  # an INT node id names its router already; never merge two of them
    seen = ingress_of.setdefault(hop, prev)
    aliases.union(seen, prev)


def _nic_gbps(nics: tuple[Nic, ...]) -> float:
    return max((n.speed_gbps for n in nics), default=0.0)
