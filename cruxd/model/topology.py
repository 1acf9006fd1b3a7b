"""The fabric: hosts, switches and directed links with capacity and latency.

A `Topology` is immutable once built. Links are directed (a cable is two links) and
identified by their index, so the scheduler can keep per-link state in numpy arrays.
Hosts' links carry a `port` number (the NIC port on the host side), which lets a
flow be pinned to a NIC rail the way NCCL pins a channel to a NIC.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from cruxd.errors import TopologyError


class NodeKind(StrEnum):
    HOST = "host"
    SWITCH = "switch"


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    kind: NodeKind
    tier: int = 0  # 0 host, 1 ToR/leaf, 2 aggregation/spine, 3 core
    gpus: int = 0


@dataclass(frozen=True, slots=True)
class Link:
    index: int
    src: str
    dst: str
    capacity_gbps: float
    latency_us: float = 1.0
    port: int | None = None  # NIC port on the host end of a host link

    @property
    def name(self) -> str:
        suffix = f"#{self.port}" if self.port is not None else ""
        return f"{self.src}->{self.dst}{suffix}"


@dataclass(frozen=True, eq=False)
class Topology:
    nodes: dict[str, Node]
    links: tuple[Link, ...]
    name: str = "topology"
    out_links: dict[str, tuple[int, ...]] = field(repr=False, default_factory=dict)
    in_links: dict[str, tuple[int, ...]] = field(repr=False, default_factory=dict)
    capacity: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    latency_s: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    # structures derived from this topology (model/paths.py's finders), kept on it so that
    # they die with it: a side table keyed by the topology kept every topology alive
    derived: dict[object, object] = field(init=False, repr=False, default_factory=dict)

    def path_latency(self, path: np.ndarray) -> float:
        """Seconds a path's links add (the alpha of the alpha-beta model)."""
        return float(self.latency_s[path].sum())

    @property
    def hosts(self) -> list[str]:
        return [n.id for n in self.nodes.values() if n.kind is NodeKind.HOST]

    @property
    def switches(self) -> list[str]:
        return [n.id for n in self.nodes.values() if n.kind is NodeKind.SWITCH]

    def is_host(self, node_id: str) -> bool:
        node = self.nodes.get(node_id)
        return node is not None and node.kind is NodeKind.HOST

    def uplinks(self, host: str) -> tuple[int, ...]:
        """The host's outgoing links, ordered by NIC port."""
        return self.out_links.get(host, ())

    def downlinks(self, host: str) -> tuple[int, ...]:
        """Links into the host, ordered by NIC port."""
        return self.in_links.get(host, ())

    def nic_ports(self, host: str) -> int:
        return len(self.uplinks(host))

    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes.values())


# Ten times the largest fabric planned (bench/control_plane.py: 20,480 hosts, 0.3M directed
# links); what a builder's parameters can make us allocate (issue 37: a clos2 of 10^8 hosts
# ran until memory ran out)
MAX_NODES = 200_000
MAX_LINKS = 2_000_000


class TopologyBuilder:
    """Collects nodes and links, validates them, and freezes a `Topology`."""

    def __init__(self, name: str = "topology") -> None:
        self.name = name
        self._nodes: dict[str, Node] = {}
        self._links: list[Link] = []
        self._ports: dict[str, int] = {}

    def host(self, node_id: str, gpus: int = 8) -> str:
        return self._add(Node(node_id, NodeKind.HOST, 0, gpus))

    def switch(self, node_id: str, tier: int) -> str:
        return self._add(Node(node_id, NodeKind.SWITCH, tier, 0))

    def _add(self, node: Node) -> str:
        if not node.id:
            raise TopologyError("node id must be a non-empty string")
        if node.id in self._nodes:
            raise TopologyError(f"duplicate node {node.id!r}")
        if node.gpus < 0:
            raise TopologyError(f"node {node.id!r}: gpus must be >= 0")
        if len(self._nodes) >= MAX_NODES:
            raise TopologyError(f"more than {MAX_NODES:,} nodes: not a fabric crux plans")
        self._nodes[node.id] = node
        return node.id

    def link(self, a: str, b: str, gbps: float, latency_us: float = 1.0, *, both: bool = True,
             count: int = 1) -> None:
        """Add `count` parallel cables a<->b (or one direction when `both` is false)."""
        for _ in range(count):
            self._directed(a, b, gbps, latency_us)
            if both:
                self._directed(b, a, gbps, latency_us)

    def _directed(self, a: str, b: str, gbps: float, latency_us: float) -> None:
        if len(self._links) >= MAX_LINKS:
            raise TopologyError(f"more than {MAX_LINKS:,} links: not a fabric crux plans")
        for end in (a, b):
            if end not in self._nodes:
                raise TopologyError(f"link {a}->{b}: unknown node {end!r}")
        if a == b:
            raise TopologyError(f"link {a}->{b}: a link cannot loop on one node")
        if not (isinstance(gbps, int | float) and math.isfinite(gbps) and gbps > 0):
            raise TopologyError(f"link {a}->{b}: capacity must be a positive finite number, "
                                f"got {gbps!r}")
        if not (math.isfinite(latency_us) and latency_us >= 0):
            raise TopologyError(f"link {a}->{b}: latency must be finite and >= 0")
        port = None
        src_host = self._nodes[a].kind is NodeKind.HOST
        dst_host = self._nodes[b].kind is NodeKind.HOST
        if src_host and dst_host:
            raise TopologyError(f"link {a}->{b}: hosts connect through switches")
        if src_host or dst_host:
            key = f"{a}>" if src_host else f">{b}"
            port = self._ports.get(key, 0)
            self._ports[key] = port + 1
        self._links.append(Link(len(self._links), a, b, float(gbps), float(latency_us), port))

    def build(self) -> Topology:
        if not self._nodes:
            raise TopologyError("topology has no nodes")
        out: dict[str, list[int]] = {n: [] for n in self._nodes}
        into: dict[str, list[int]] = {n: [] for n in self._nodes}
        for link in self._links:
            out[link.src].append(link.index)
            into[link.dst].append(link.index)
        return Topology(
            nodes=dict(self._nodes),
            links=tuple(self._links),
            name=self.name,
            out_links={n: tuple(v) for n, v in out.items()},
            in_links={n: tuple(v) for n, v in into.items()},
            capacity=np.array([lk.capacity_gbps for lk in self._links], dtype=np.float64),
            latency_s=np.array([lk.latency_us * 1e-6 for lk in self._links], dtype=np.float64),
        )


def node_sequence(topo: Topology, link_indices: Sequence[int]) -> list[str]:
    """The nodes a link path visits, source first."""
    if not link_indices:
        return []
    seq = [topo.links[link_indices[0]].src]
    seq.extend(topo.links[i].dst for i in link_indices)
    return seq
