"""Which TCP destination port a job's route toward a peer steers, and its source ports.

Each job reports the ports it listens on at each host (LocalJob.tcp_ports); an agent
probes toward the port each route from its host names, and the leader's next plan puts
the ports probed onto the chosen path into the route. Pure.
"""

from __future__ import annotations

from cruxd.control.cluster import MergedJob
from cruxd.model.view import DiscoveredPath


def route_tcp(ports: tuple[int, ...], path: DiscoveredPath | None,
              others: frozenset[int]) -> tuple[int, tuple[int, ...]]:
    """(tcp_dport, tcp_sports) of a job's route toward a peer where it listens on `ports`
    (its order: declared first), on the chosen `path` (None: not probed). The first of
    its ports with source ports probed onto the path; else its first port, unsteered
    until the source host's agent has probed toward it (it probes each route's port).
    A job with no known port takes the path's first set for a port no job listens on at
    the peer (the agents' [probing] tcp_dport, as before jobs had ports): `others`. A
    table entry holds one destination port per job and peer, so one is steered."""
    for port in ports:
        if path is not None and (sports := path.tcp_sports(port)):
            return port, sports
    if ports:
        return ports[0], ()
    extra = next((t for t in path.tcp if t.dport not in others), None) if path else None
    return (extra.dport, extra.sports) if extra is not None else (0, ())


def listening_ports(merged: tuple[MergedJob, ...]) -> dict[str, frozenset[int]]:
    """Per host, the ports any job listens on there."""
    out: dict[str, set[int]] = {}
    for m in merged:
        for (h, _), ports in zip(m.hosts, m.tcp_ports, strict=False):
            out.setdefault(h, set()).update(ports)
    return {h: frozenset(ps) for h, ps in out.items()}
