"""Each planned job's routes (PeerRoute), from the scheduler's flows, kept per job while
everything they are made of is the same.

A route is made of: the job's flow decisions (the scheduler hands the same tuple again
for a job whose choices did not change: IncrementalPlanner), the job itself (its ports;
MergedJob objects are kept while the job's reports are the same), the peers' NICs (kept
while their agents' inventories are), the ports any job listens on at the peers, the
probed paths between the job's hosts, and the job's routes in the previous plan (whose
ports a route keeps: sticky_routes). At 10,000 hosts a plan has 81,000 flows, and
building every route again was 200 ms of each re-plan (bench/control_plane.py): an
arrival changes the flows of a few jobs. Pure; one plan at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cruxd.control.cluster import MergedJob
from cruxd.control.records import Nic, PeerRoute
from cruxd.control.sticky_routes import keep_ports
from cruxd.control.tcp_routes import route_tcp
from cruxd.model.plan import FlowDecision
from cruxd.model.view import DiscoveredPath

Paths = Mapping[tuple[str, str], tuple[DiscoveredPath, ...]]
# (NICs by host, peer host, the flow's NIC port) -> the peer's addresses (JobMemo.addresses)
Addresses = Callable[[Mapping[str, tuple[Nic, ...]], str, int | None], tuple[str, ...]]


@dataclass(frozen=True)
class RouteContext:
    """What one plan's routes are built from, for all its jobs."""

    nics: Mapping[str, tuple[Nic, ...]]
    paths: Paths  # (src, dst) -> the probed paths
    listening: Mapping[str, frozenset[int]]  # host -> ports any job listens on there
    fabric: bool  # adaptive routing: no port, no hops


@dataclass
class _Kept:
    flows: tuple[FlowDecision, ...]
    job: MergedJob
    fabric: bool
    hosts: tuple[str, ...]  # the flows' peers
    nics: tuple[tuple[Nic, ...] | None, ...]  # theirs (kept objects: identity compares first)
    listening: tuple[frozenset[int] | None, ...]
    pairs: tuple[tuple[str, str], ...]  # the flows' host pairs
    probed: tuple[tuple[DiscoveredPath, ...] | None, ...]  # their paths
    before: tuple[PeerRoute, ...]
    routes: tuple[PeerRoute, ...]  # one tuple: the saves keep its text (codec_json.Memo)


class RouteMemo:
    """The routes each job got in the last plan, with what they were made of."""

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}
        self.built = 0  # jobs whose routes the last plan built again

    def keep(self, job_ids: set[str]) -> None:
        for jid in self._kept.keys() - job_ids:
            del self._kept[jid]

    def turn(self) -> None:
        self.built = 0

    def routes(self, job: MergedJob, flows: tuple[FlowDecision, ...],
               before: tuple[PeerRoute, ...], ctx: RouteContext,
               addresses: Addresses) -> tuple[PeerRoute, ...]:
        """The job's routes for its `flows`; `before`: its routes in the previous plan."""
        k = self._kept.get(job.job_id)
        if k is not None and _same(k, job, flows, before, ctx):
            return k.routes
        self.built += 1
        hosts = tuple(dict.fromkeys(f.dst for f in flows))
        pairs = tuple(dict.fromkeys((f.src, f.dst) for f in flows))
        routes = _build(job, flows, before, ctx, addresses)
        self._kept[job.job_id] = _Kept(
            flows, job, ctx.fabric, hosts, tuple(map(ctx.nics.get, hosts)),
            tuple(map(ctx.listening.get, hosts)), pairs, tuple(map(ctx.paths.get, pairs)),
            before, routes)
        return routes


def _same(k: _Kept, job: MergedJob, flows: tuple[FlowDecision, ...],
          before: tuple[PeerRoute, ...], ctx: RouteContext) -> bool:
    # tuples compare item by item, by identity first: kept NICs and paths cost no more
    return (k.flows is flows and k.job is job and k.fabric == ctx.fabric
            and (k.before is before or k.before == before)
            and tuple(map(ctx.nics.get, k.hosts)) == k.nics
            and tuple(map(ctx.listening.get, k.hosts)) == k.listening
            and tuple(map(ctx.paths.get, k.pairs)) == k.probed)


def _build(job: MergedJob, flows: tuple[FlowDecision, ...], before: tuple[PeerRoute, ...],
           ctx: RouteContext, addresses: Addresses) -> tuple[PeerRoute, ...]:
    fabric = ctx.fabric
    ports_at = dict(zip((h for h, _ in job.hosts), job.tcp_ports, strict=False))
    was = {(r.src_host, r.peer_host): r for r in before}
    out = []
    for f in flows:
        chosen, probed_tcp = _entries(ctx.paths.get((f.src, f.dst), ()), f.hops)
        tcp_dport, tcp_sports = (0, ()) if fabric else route_tcp(
            ports_at.get(f.dst, ()), probed_tcp, ctx.listening.get(f.dst, frozenset()))
        # with the fabric routing, the path the scheduler modelled holds no traffic to it
        out.append(keep_ports(PeerRoute(
            src_host=f.src, peer_host=f.dst,
            peer_addresses=addresses(ctx.nics, f.dst, f.src_port),
            sport=0 if fabric else f.sport or 0, hops=() if fabric else f.hops,
            nic_port=f.src_port if f.src_port is not None else -1,
            tcp_dport=tcp_dport, tcp_sports=tcp_sports), was, chosen))
    return tuple(out)


def _entries(pair: tuple[DiscoveredPath, ...], hops: tuple[str, ...]
             ) -> tuple[DiscoveredPath | None, DiscoveredPath | None]:
    """The pair's path with these hops, and its path with these hops and TCP ports probed
    (the last of each, should a table list the same hops twice)."""
    chosen = tcp = None
    for p in pair:
        if p.hops == hops:
            chosen = p
            if p.tcp:
                tcp = p
    return chosen, tcp
