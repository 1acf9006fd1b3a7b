"""The agent's path discovery: sweeps toward the peers of its local jobs.

Peers come from the leader's plan (every job's routes leaving this host name them,
planned or not), so the agent probes exactly the pairs its jobs' traffic uses. One
sweep runs at a time in a worker thread (the probers block on raw sockets), paced
at `probing.rate_pps`; its result replaces that peer's table and, when the paths or
ports changed, the agent reports at once. Each sweep is followed by TCP ones
(TTL-limited SYNs, `tcp_ports_per_path` ports per path), one per destination port:
`probing.tcp_dport` if set (toward every peer), and the port each route of the plan
leaving this host names (its job's listening port at that peer), at most
`probing.tcp_dports_per_peer` of those per peer. Paths are merged by hop signature,
so a path may carry UDP ports, TCP ports toward several destination ports, or both.

A plan saying the fabric routes (HostPlan.path_selection = "fabric": adaptive routing, the
leader's `[leader] path_selection`) drops every peer: there is no path choice a port could
make, so the agent sweeps nobody and sends no probe, whatever its own `agent.probing` says.
The leader is the one place that decides it, so no agent's configuration can disagree.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from cruxd.config.model import ProbingConfig
from cruxd.control.records import PATHS_BY_FABRIC, HostPlan, PathTable, ProbedPath
from cruxd.model.view import TcpPortSet
from cruxd.waits import wait_event
from probing.int_prober import IntProber
from probing.responder import ProbeResponder
from probing.schedule import PeerState, ProbeSchedule
from probing.sweep import Prober, SweepResult, sweep
from probing.tcp_ttl import TcpTtlProber
from probing.ttl import ProbeCounters, TtlProber

LOG = logging.getLogger(__name__)
RETRY_S = 30.0  # after a sweep that could not run at all


class ClosingProber(Prober, Protocol):
    def close(self) -> None: ...

    def problems(self) -> tuple[int, str]:
        """Replies ignored or missing in this prober's life, and the commonest reason."""
        ...


ProberFactory = Callable[[str], ClosingProber]
# (peer address, TCP destination port, TCP source port -> its known hops) -> a TCP prober
TcpProberFactory = Callable[[str, int, Mapping[int, tuple[str, ...]]], ClosingProber]


def problems(counters: list[ProbeCounters]) -> tuple[int, str]:
    """Replies ignored or missing over `counters`, and the commonest reason."""
    ignored, reasons, miss = 0, dict[str, int](), ""
    for c in counters:
        miss = c.last_miss or miss
        ignored += c.ignored + c.timeouts
        for why, n in c.reasons.items():
            reasons[why] = reasons.get(why, 0) + n
        if c.timeouts:
            reasons["no reply"] = reasons.get("no reply", 0) + c.timeouts
    top = max(reasons.items(), key=lambda kv: kv[1], default=("", 0))
    text = f"{top[0]} ({top[1]})" if top[1] else ""
    return ignored, f"{text}, last: {miss}" if miss and top[0] == "no reply" else text


def _v4(prefixes: tuple[str, ...]) -> tuple[ipaddress.IPv4Network, ...]:
    return tuple(n for n in map(ipaddress.ip_network, prefixes)
                 if isinstance(n, ipaddress.IPv4Network))


class _Probers:
    """TTL, or INT with TTL for the ports whose probes come back with no INT hop
    (a fabric without INT-capable switches); counters in the schedule's shape."""

    def __init__(self, address: str, cfg: ProbingConfig) -> None:
        allowed = _v4(cfg.fabric_prefixes)
        self.ttl = TtlProber(address, dport=cfg.dport, max_hops=cfg.max_hops,
                             timeout_s=cfg.timeout_s, allowed=allowed, dscp=cfg.dscp)
        self.int = IntProber(address, dport=cfg.dport, max_hops=cfg.max_hops,
                             timeout_s=cfg.timeout_s, allowed=allowed, dscp=cfg.dscp) \
            if cfg.method == "int" else None

    def trace(self, sport: int) -> tuple[str, ...] | None:
        if self.int is None:
            return self.ttl.trace(sport)
        before = self.int.counters.reasons.get("no INT hops", 0)
        hops = self.int.trace(sport)
        if hops is None and self.int.counters.reasons.get("no INT hops", 0) > before:
            return self.ttl.trace(sport)
        return hops

    def close(self) -> None:
        self.ttl.close()
        if self.int is not None:
            self.int.close()

    def problems(self) -> tuple[int, str]:
        return problems([p.counters for p in (self.ttl, self.int) if p is not None])


class _TcpProber(TcpTtlProber):
    def problems(self) -> tuple[int, str]:
        return problems([self.counters])


def default_factory(cfg: ProbingConfig) -> ProberFactory:
    def make(address: str) -> ClosingProber:
        return _Probers(address, cfg)
    return make


def default_tcp_factory(cfg: ProbingConfig) -> TcpProberFactory:
    def make(address: str, dport: int, known: Mapping[int, tuple[str, ...]]) -> ClosingProber:
        return _TcpProber(address, dport=dport, max_hops=cfg.max_hops,
                          timeout_s=cfg.timeout_s, allowed=_v4(cfg.fabric_prefixes),
                          known=known, dscp=cfg.dscp)
    return make


class SweepProbing:
    def __init__(self, cfg: ProbingConfig, host_id: str, on_change: Callable[[], None],
                 factory: ProberFactory | None = None,
                 tcp_factory: TcpProberFactory | None = None) -> None:
        self.cfg = cfg
        self.host_id = host_id
        self.swept_by = f"sweep ({cfg.method}{f', tcp/{cfg.tcp_dport}' if cfg.tcp_dport else ''})"
        self.name = self.swept_by
        self.fabric_routes = False  # the leader's plan leaves paths to the fabric
        self.on_change = on_change
        self.factory = factory or default_factory(cfg)
        self.tcp_factory = tcp_factory or default_tcp_factory(cfg)
        self.schedule = ProbeSchedule(tuple(map(ipaddress.ip_network, cfg.fabric_prefixes)),
                                      cfg.interval_s)
        self.sweeps = 0
        self.responder: ProbeResponder | None = None
        self.responder_error = ""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # --- what the agent reports ----------------------------------------------
    def paths(self) -> tuple[PathTable, ...]:
        out = [PathTable(p.host, tuple(ProbedPath(k.hops, k.sports, k.verified_unix_ms,
                                                  tuple(TcpPortSet(d, t) for d, t in k.tcp))
                                       for k in p.paths), p.address, p.probed_unix_ms,
                         p.probes_sent, p.errors, p.last_error)
               for p in sorted(self.schedule.peers.values(), key=lambda p: p.host)]
        out += [PathTable(host, (), last_error=why)
                for host, why in sorted(self.schedule.refused.items())]
        return tuple(out)

    # --- inputs --------------------------------------------------------------
    def plan_changed(self, hp: HostPlan) -> None:
        fabric = hp.path_selection == PATHS_BY_FABRIC
        if fabric != self.fabric_routes:
            self.fabric_routes = fabric
            self.name = f"{self.swept_by}, idle: the fabric routes" if fabric else self.swept_by
            LOG.info("the leader %s: %s", "leaves paths to the fabric" if fabric
                     else "steers paths by probed ports",
                     "no sweeps" if fabric else "sweeping its jobs' peers")
            self.on_change()  # the leader shows the new name
        peers: dict[str, list[str]] = {}
        jobs_ports: dict[str, set[int]] = {}
        for a in () if fabric else hp.jobs:
            for r in a.routes:
                if r.src_host == self.host_id and r.peer_host != self.host_id:
                    peers.setdefault(r.peer_host, []).extend(r.peer_addresses)
                    if r.tcp_dport:
                        jobs_ports.setdefault(r.peer_host, set()).add(r.tcp_dport)
        dports = {peer: self._dports(peer, jobs_ports.get(peer, set())) for peer in peers}
        now = time.monotonic()
        if self.schedule.set_peers(peers, now, dports):
            self.on_change()  # refused peers show up in the next report
        self.schedule.request(() if fabric else hp.reprobe, now)
        self._wake.set()

    def _dports(self, peer: str, jobs: set[int]) -> tuple[int, ...]:
        """The TCP destination ports a sweep of `peer` probes: tcp_dport, then the jobs'
        ports in order, at most tcp_dports_per_peer of them (each is a sweep: the bound
        is what keeps a host with many jobs from multiplying the probe traffic)."""
        extra = self.cfg.tcp_dport
        ports = sorted(jobs - {extra})
        keep = ports[:self.cfg.tcp_dports_per_peer]
        if len(keep) < len(ports):
            LOG.warning("%s: %d jobs' TCP ports to probe, probing.tcp_dports_per_peer is %d; "
                        "not probed (connections to them are not steered): %s", peer,
                        len(ports), self.cfg.tcp_dports_per_peer, ports[len(keep):])
        return ((extra,) if extra else ()) + tuple(keep)

    # --- the loop ------------------------------------------------------------
    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sweeps")
        if self.cfg.responder:
            self._start_responder()

    def _start_responder(self) -> None:
        """Answer other agents' probes; where the port is taken (a RoCE stack owns
        4791) run without: TTL traces still end at the kernel's port unreachable."""
        cfg = self.cfg
        try:
            self.responder = ProbeResponder(port=cfg.responder_port,
                                            rate_pps=cfg.responder_rate_pps,
                                            allowed=_v4(cfg.fabric_prefixes))
        except OSError as exc:
            self.responder_error = f"UDP port {cfg.responder_port}: {exc.strerror or exc}"
            LOG.warning("probe responder disabled: %s", self.responder_error)
            return
        asyncio.get_running_loop().add_reader(self.responder.fileno(),
                                              self.responder.handle_readable)

    async def stop(self) -> None:
        if self.responder is not None:
            asyncio.get_running_loop().remove_reader(self.responder.fileno())
            self.responder.close()
            self.responder = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            peer = self.schedule.next_due()
            wait = None if peer is None else peer.due - time.monotonic()
            if wait is None or wait > 0:
                self._wake.clear()
                await wait_event(self._wake, wait)
                continue
            assert peer is not None
            self.schedule.started(peer.host)
            try:
                result, tcp, errors, why = await asyncio.to_thread(self._sweep, peer)
            except OSError as exc:
                LOG.warning("cannot probe %s (%s): %s", peer.host, peer.address, exc)
                self.schedule.failed(peer.host, str(exc), time.monotonic(), RETRY_S)
                self.on_change()
                continue
            self.sweeps += 1
            changed = self.schedule.record(peer.host, result, errors, why, time.monotonic(),
                                           int(time.time() * 1000), tcp)
            LOG.info("swept %s (%s): %d path(s), %d probe(s), stopped: %s%s%s%s", peer.host,
                     peer.address, len(result.paths), result.probes_sent, result.stopped,
                     "".join(f"; TCP/{d}: {len(t.paths)} path(s), {t.probes_sent} probe(s), "
                             f"stopped: {t.stopped}" for d, t in tcp.items()),
                     f"; {errors} probe(s) unanswered or ignored, most: {why}" if errors
                     else "", f"; paths changed: {changed}" if changed else "")
            self.on_change()  # report the new verification times too

    def _sweep(self, peer: PeerState) -> tuple[SweepResult, dict[int, SweepResult], int, str]:
        cfg = self.cfg
        prober = self.factory(peer.address)
        try:
            ports = self.schedule.sports(peer, range(cfg.sports[0], cfg.sports[1] + 1))
            result = sweep(prober, peer.host, ports, expected=cfg.expected_paths or None,
                           max_probes=cfg.max_probes, miss=cfg.miss, rate_pps=cfg.rate_pps)
            errors, why = prober.problems()
        finally:
            prober.close()
        tcp: dict[int, SweepResult] = {}
        most = errors
        for dport in peer.dports:
            try:
                tcp[dport], tcp_errors, tcp_why = self._sweep_tcp(peer, dport)
            except OSError as exc:  # the other results stand; this port's are dropped
                LOG.warning("cannot probe TCP/%d of %s (%s): %s", dport, peer.host,
                            peer.address, exc)
                tcp[dport], tcp_errors, tcp_why = SweepResult(peer.host), 1, f"TCP: {exc}"
            errors += tcp_errors
            if tcp_errors > most:
                most, why = tcp_errors, tcp_why
        return result, tcp, errors, why

    def _sweep_tcp(self, peer: PeerState, dport: int) -> tuple[SweepResult, int, str]:
        cfg = self.cfg
        prober = self.tcp_factory(peer.address, dport, self.schedule.known_tcp(peer, dport))
        try:
            ports = self.schedule.tcp_sports(peer, dport,
                                             range(cfg.tcp_sports[0], cfg.tcp_sports[1] + 1))
            tcp = sweep(prober, peer.host, ports, expected=cfg.expected_paths or None,
                        max_probes=cfg.max_probes, miss=cfg.miss, rate_pps=cfg.rate_pps,
                        ports_per_path=cfg.tcp_ports_per_path)
            errors, why = prober.problems()
            return tcp, errors, why
        finally:
            prober.close()
