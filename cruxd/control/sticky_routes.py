"""Keep a job's ports when a re-plan keeps its path.

The scheduler picks a path; the port that steers a flow onto it is the first the agents'
sweep found for that path, and the TCP ports are all of them. A later sweep can find the
same path with its ports in another order, or more of them, and a re-plan would then hand
out other ports for the same path. Each different port is a new decision at the shim: a
job that re-creates its connections on a changed decision rebuilds them for nothing, and a
TCP connection made on the old port lands on the same path anyway. So a route whose path
(hops) is the one it had in the previous plan keeps its UDP port while the path table
still lists it for that path, and its TCP ports while every one is still probed for that
path toward the same destination port. Only a lost port or a new path changes them.
"""

from __future__ import annotations

from collections.abc import Mapping

from cruxd.control.records import PeerRoute
from cruxd.model.view import DiscoveredPath

RouteKey = tuple[str, str]  # source host, peer host (of one job)


def keep_ports(route: PeerRoute, before: Mapping[RouteKey, PeerRoute],
               path: DiscoveredPath | None) -> PeerRoute:
    """`route` as the plan made it, with its previous ports where the path is the same;
    the previous route itself where the two are equal. `before`: the job's routes in the
    previous plan; `path`: the path table's entry for the route's hops (None: none)."""
    old = before.get((route.src_host, route.peer_host))
    if old is None or not route.hops or old.hops != route.hops:
        return route
    if path is None:
        return route
    sport = old.sport if old.sport and old.sport in path.sports else route.sport
    tcp = route.tcp_sports
    if (old.tcp_sports and old.tcp_dport == route.tcp_dport
            and set(old.tcp_sports) <= set(path.tcp_sports(route.tcp_dport))):
        tcp = old.tcp_sports
    if (sport, tcp) != (route.sport, route.tcp_sports):
        route = PeerRoute(route.src_host, route.peer_host, route.peer_addresses, sport,
                          route.hops, route.nic_port, route.tcp_dport, tcp)
    # the previous object where nothing changed: the leader's saves convert a record once
    # (codec.Memo), and comparing plans is by identity first
    return old if route == old else route
