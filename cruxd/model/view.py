"""What the leader knows when it plans: the fabric, the jobs, the probed paths."""

from __future__ import annotations

from dataclasses import dataclass, field

from cruxd.model.jobs import Job
from cruxd.model.topology import Topology


@dataclass(frozen=True, slots=True)
class DiscoveredPath:
    """A fabric path found by probing: the switches it crosses and the UDP
    source ports (RoCEv2 range 0xC000-0xFFFF) that hash onto it; where TCP was
    probed too, the TCP source ports toward `tcp_dport` that hash onto it (planning
    ignores them; the route of the chosen path carries them)."""

    hops: tuple[str, ...]
    sports: tuple[int, ...]
    tcp_sports: tuple[int, ...] = ()
    tcp_dport: int = 0


@dataclass(frozen=True)
class ClusterView:
    topology: Topology
    jobs: tuple[Job, ...]
    # (src host, dst host) -> discovered paths; pairs absent here use all ECMP candidates
    path_table: dict[tuple[str, str], tuple[DiscoveredPath, ...]] = field(default_factory=dict)
