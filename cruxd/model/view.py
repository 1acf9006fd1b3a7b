"""What the leader knows when it plans: the fabric, the jobs, the probed paths."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: agents read TcpPortSet and DiscoveredPath from here,
    # and an agent that never plans loads no numpy (tests/test_agent_imports.py)
    from cruxd.model.jobs import Job
    from cruxd.model.topology import Topology


@dataclass(frozen=True, slots=True)
class TcpPortSet:
    """TCP source ports that hash onto one path toward the peer's TCP port `dport`: a
    switch hashes both ports, so each destination port has its own set."""

    dport: int
    sports: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DiscoveredPath:
    """A fabric path found by probing: the switches it crosses and the UDP
    source ports (RoCEv2 range 0xC000-0xFFFF) that hash onto it; where TCP was
    probed too, per destination port probed (the [probing] tcp_dport, the jobs'
    listening ports at the peer) the TCP source ports that hash onto it (planning
    ignores them; the route of the chosen path carries its job's set)."""

    hops: tuple[str, ...]
    sports: tuple[int, ...]
    tcp: tuple[TcpPortSet, ...] = ()

    def tcp_sports(self, dport: int) -> tuple[int, ...]:
        """The source ports probed onto this path toward `dport` (() if none)."""
        return next((t.sports for t in self.tcp if t.dport == dport), ())


@dataclass(frozen=True)
class ClusterView:
    topology: Topology
    jobs: tuple[Job, ...]
    # (src host, dst host) -> discovered paths; pairs absent here use all ECMP candidates
    path_table: dict[tuple[str, str], tuple[DiscoveredPath, ...]] = field(default_factory=dict)
