"""Which peer to probe next, and what is known toward each (pure: the clock is passed in).

A peer is swept when it first appears, every `interval_s` after that, and at once
when asked (the leader saw a hop on its paths go down). A sweep starts from the
ports of the paths already known, so each known path is re-verified by its own
port's first probe and keeps that port (the decision table does not churn); a
path whose port now leads elsewhere, or nowhere, is dropped. Only peers inside the
fabric prefixes are ever probed.

Where TCP is probed too, a path (a hop signature) may be reached by UDP ports, TCP
ports or both: each known path carries its UDP ports and, per TCP destination port
probed toward the peer (`PeerState.dports`: the jobs' listening ports there, and the
[probing] tcp_dport), the TCP source ports onto it; switches hash both ports, so each
destination port has its own set. A TCP sweep toward one destination port starts from
all of its known source ports (jobs hold several connections to one peer, one per port).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from probing.sweep import SweepResult


@dataclass(frozen=True, slots=True)
class KnownPath:
    hops: tuple[str, ...]
    sports: tuple[int, ...]  # UDP (RoCEv2) source ports onto this path
    verified_unix_ms: int
    # (TCP destination port, the TCP source ports onto this path toward it), by port
    tcp: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def tcp_sports(self, dport: int) -> tuple[int, ...]:
        return next((sports for d, sports in self.tcp if d == dport), ())


@dataclass
class PeerState:
    host: str
    address: str
    paths: tuple[KnownPath, ...] = ()
    probed_unix_ms: int = 0
    probes_sent: int = 0
    errors: int = 0
    last_error: str = ""
    due: float = 0.0  # monotonic seconds
    dports: tuple[int, ...] = ()  # TCP destination ports each sweep probes toward
    # asked for again (a reprobe, a new port) since its sweep began: the sweep under way
    # may have missed what was asked, so the one after it comes at once
    asked: bool = False


@dataclass
class ProbeSchedule:
    prefixes: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    interval_s: float = 300.0
    peers: dict[str, PeerState] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # host -> why it is not probed

    def inside(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.prefixes)

    def set_peers(self, peers: Mapping[str, Iterable[str]], now: float,
                  dports: Mapping[str, tuple[int, ...]] | None = None) -> bool:
        """The peer hosts to keep probing, with their addresses (the first one inside
        the fabric is probed) and the TCP destination ports to probe toward each (a new
        port makes its peer due at once: a job waits for it). Returns whether the set of
        peers changed."""
        wanted: dict[str, str] = {}
        self.refused = {}
        for host, addresses in peers.items():
            addrs = list(addresses)
            inside = [a for a in addrs if self.inside(a)]
            if inside:
                wanted[host] = inside[0]
            else:
                self.refused[host] = (f"no address inside the fabric prefixes "
                                      f"({', '.join(addrs) or 'none known'})")
        changed = wanted.keys() != self.peers.keys()
        for host in list(self.peers):
            if host not in wanted:
                del self.peers[host]
        for host, address in wanted.items():
            old = self.peers.get(host)
            want = (dports or {}).get(host, ())
            if old is None or old.address != address:
                self.peers[host] = PeerState(host, address, due=now, dports=want)
                changed = True
            elif old.dports != want:
                if set(want) - set(old.dports):
                    old.due, old.asked = min(old.due, now), True
                old.dports = want  # a port no longer wanted leaves with the next sweep
        return changed

    def request(self, hosts: Iterable[str], now: float) -> None:
        for h in hosts:
            if h in self.peers:
                self.peers[h].due = min(self.peers[h].due, now)
                self.peers[h].asked = True

    def started(self, host: str) -> None:
        """A sweep toward `host` begins: what was asked so far, it takes in."""
        if host in self.peers:
            self.peers[host].asked = False

    def next_due(self) -> PeerState | None:
        return min(self.peers.values(), key=lambda p: (p.due, p.host), default=None)

    def sports(self, peer: PeerState, sweep_ports: Iterable[int]) -> Iterator[int]:
        """Known paths' ports first, then the sweep range (each port once)."""
        first = [p.sports[0] for p in peer.paths if p.sports]
        yield from first
        skip = set(first)
        yield from (s for s in sweep_ports if s not in skip)

    def tcp_sports(self, peer: PeerState, dport: int,
                   sweep_ports: Iterable[int]) -> Iterator[int]:
        """Every known TCP port toward `dport` first (each keeps its path, so connections
        the shim steered stay where the plan put them), then the sweep range (each once)."""
        first = [s for p in peer.paths for s in p.tcp_sports(dport)]
        yield from first
        skip = set(first)
        yield from (s for s in sweep_ports if s not in skip)

    @staticmethod
    def known_tcp(peer: PeerState, dport: int) -> dict[int, tuple[str, ...]]:
        """TCP source port -> the hops it led to toward `dport` (re-verifies a port a job
        holds)."""
        return {s: p.hops for p in peer.paths for s in p.tcp_sports(dport)}

    def record(self, host: str, result: SweepResult, errors: int, last_error: str,
               now: float, now_unix_ms: int,
               tcp: Mapping[int, SweepResult] | None = None) -> str:
        """A finished sweep toward `host` (and its TCP sweeps, by destination port);
        returns what changed in its paths or ports ("" when nothing did), for the log.
        Paths are merged by hop signature; a destination port not swept loses its ports."""
        peer = self.peers.get(host)
        if peer is None:  # dropped while it was being swept
            return ""
        before = {p.hops: (p.sports, p.tcp) for p in peer.paths}
        tcp = tcp or {}
        hops_seen = set(result.paths).union(*(r.paths.keys() for r in tcp.values()))
        peer.paths = tuple(
            KnownPath(hops, tuple(result.paths.get(hops, ())), now_unix_ms,
                      tuple((d, tuple(r.paths[hops])) for d, r in sorted(tcp.items())
                            if r.paths.get(hops)))
            for hops in sorted(hops_seen))
        peer.probed_unix_ms = now_unix_ms
        peer.probes_sent = result.probes_sent + sum(r.probes_sent for r in tcp.values())
        peer.errors = errors + result.unanswered + sum(r.unanswered for r in tcp.values())
        peer.last_error = last_error
        peer.due = now if peer.asked else now + self.interval_s
        return _changes(before, {p.hops: (p.sports, p.tcp) for p in peer.paths})

    def failed(self, host: str, error: str, now: float, retry_s: float) -> None:
        """A sweep that could not run (socket error): try again after `retry_s`."""
        peer = self.peers.get(host)
        if peer is not None:
            peer.errors += 1
            peer.last_error = error
            peer.due = now + retry_s


# a path's UDP source ports, and its TCP ones per destination port
Ports = tuple[tuple[int, ...], tuple[tuple[int, tuple[int, ...]], ...]]


def _changes(before: dict[tuple[str, ...], Ports], after: dict[tuple[str, ...], Ports],
             most: int = 2) -> str:
    """What differs between two path tables of one peer, briefly ("" when nothing)."""
    parts = []
    if added := after.keys() - before.keys():
        parts.append(f"{len(added)} new path(s)")
    if gone := before.keys() - after.keys():
        parts.append(f"{len(gone)} path(s) gone")
    moved = sorted(h for h in after.keys() & before.keys() if after[h] != before[h])
    for hops in moved[:most]:
        (u0, t0), (u1, t1) = before[hops], after[hops]
        via = hops[len(hops) // 2] if hops else "?"
        if u0 != u1:
            parts.append(f"via {via}: UDP {list(u0)} -> {list(u1)}")
            continue
        a, b = dict(t0), dict(t1)
        for d in sorted(a.keys() | b.keys()):
            x, y = set(a.get(d, ())), set(b.get(d, ()))
            if a.get(d) != b.get(d):
                parts.append(f"via {via}: TCP/{d} -{sorted(x - y)} +{sorted(y - x)}"
                             + (" (reordered)" if x == y else ""))
    if len(moved) > most:
        parts.append(f"{len(moved) - most} more")
    return ", ".join(parts)
