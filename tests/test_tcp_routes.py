"""TCP-probed ports from the agent's sweeps to the decision table: the sweeper merges
UDP and TCP sweeps by hop signature, reports validate and convert, the leader's route
carries the chosen path's TCP ports (path selection unchanged), and the agent writes
them into the table entry."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Mapping
from dataclasses import replace

import pytest

from cruxd.agent.core import plan_decisions
from cruxd.agent.sweeper import SweepProbing
from cruxd.config.parse import parse_config
from cruxd.control.host_plans import make_plan, plan_inputs
from cruxd.control.records import (
    AgentReport,
    HostInventory,
    HostPlan,
    JobAssignment,
    JobState,
    PathTable,
    PeerRoute,
    ProbedPath,
)
from cruxd.control.validate import InvalidMessage, check_host_plan, check_report
from cruxd.model.view import TcpPortSet
from cruxd.rpc import convert
from probing.schedule import ProbeSchedule
from probing.sweep import SweepResult
from tests.test_discovery import FOUR_LEVELS, addr, hops, state
from tests.test_probing_core import HashProber

TCP = (61003, 61004, 61007)


def tcp_table(src: int, dst: int) -> PathTable:
    """Both spines, each with its UDP port and three TCP ports toward 5201."""
    return PathTable(f"h{dst}", tuple(
        ProbedPath(hops(src, dst, s), (49152 + 16 * s + dst,), 1000,
                   (TcpPortSet(5201, tuple(p + 100 * s + dst for p in TCP)),)) for s in range(2)),
        addr(dst), 1000, 8)


def test_the_route_carries_the_tcp_ports_of_the_chosen_path() -> None:
    def table_of(k: int, peer: int) -> PathTable:
        table = tcp_table(k, peer)
        if k == 3:  # h3 probed TCP on neither path: its route keeps only the UDP port
            table = replace(table, paths=tuple(replace(p, tcp=()) for p in table.paths))
        return table

    s = state(table_of=table_of)
    plan = make_plan(plan_inputs(s, 1.0), None, FOUR_LEVELS, 1, 1.0)
    spines = {}
    for a in plan.jobs:
        assert a.state is JobState.SCHEDULED
        for r in a.routes:
            src, dst = int(r.src_host[1:]), int(r.peer_host[1:])
            spine = next(s for s in range(2) if r.hops[1] == hops(src, dst, s)[1])
            spines[(a.job_id, src)] = spine
            assert r.sport == 49152 + 16 * spine + dst  # the chosen path's UDP port ...
            if src == 3:
                assert (r.tcp_dport, r.tcp_sports) == (0, ())
            else:  # ... and its TCP ports, for the port they were probed toward
                assert r.tcp_dport == 5201
                assert r.tcp_sports == tuple(p + 100 * spine + dst for p in TCP)
    assert spines[("big", 0)] != spines[("small", 1)]  # selection as without TCP ports

    # the agent writes them into the peer's table entry, not into the job-wide one
    hp = plan.for_host("h0")
    entries = {d.peer: d for d in plan_decisions(hp)}
    route = hp.jobs[0].routes[0]
    assert entries[addr(2)].tcp_sports == route.tcp_sports and entries[addr(2)].tcp_dport == 5201
    assert entries[None].tcp_sports == () and entries[None].tcp_dport == 0
    # ... and the plan crosses the wire unchanged
    assert convert.host_plan_from_pb(convert.host_plan_to_pb(hp)) == hp


def test_reports_with_tcp_ports_convert_and_validate() -> None:
    r = AgentReport(HostInventory("h0"), paths=(tcp_table(0, 2),))
    back = convert.report_from_pb(convert.report_to_pb(r))
    assert back == r and back.paths[0].paths[1].tcp == (TcpPortSet(5201, (61105, 61106, 61109)),)
    assert check_report(back) is back
    # fields 4/5 carry the first set for a leader from before the sets, and an agent from
    # before them (fields 4/5 alone) reads as one set
    wire = convert.report_to_pb(r)
    assert (wire.paths[0].paths[1].tcp_dport, list(wire.paths[0].paths[1].tcp_sports)) == (
        5201, [61105, 61106, 61109])
    for path in wire.paths[0].paths:
        del path.tcp[:]
    assert convert.report_from_pb(wire) == r


def test_several_destination_ports_per_path_cross_the_wire() -> None:
    sets = (TcpPortSet(5301, (61000, 61001)), TcpPortSet(5302, (61005,)))
    r = AgentReport(HostInventory("h0"), paths=(PathTable("h1", (ProbedPath(
        ("a", "b"), (49152,), 5, sets),)),))
    back = convert.report_from_pb(convert.report_to_pb(r))
    assert back == r and check_report(back) is back


def _with_path(*tcp: TcpPortSet) -> AgentReport:
    path = ProbedPath(("a", "b"), (49152,), tcp=tcp)
    return AgentReport(HostInventory("h0"), paths=(PathTable("h1", (path,)),))


P = "paths[0].paths[0].tcp"


@pytest.mark.parametrize(("tcp", "field", "why"), [
    ((TcpPortSet(5201, tuple(range(61000, 61009))),), f"{P}[0].sports", "9 entries, at most 8"),
    ((TcpPortSet(5201, (0,)),), f"{P}[0].sports[0]", "range"),
    ((TcpPortSet(5201, (70000,)),), f"{P}[0].sports[0]", "range"),
    ((TcpPortSet(5201, (61000, 61000)),), f"{P}[0].sports[1]", "duplicate"),
    ((TcpPortSet(0, (61000,)),), f"{P}[0].dport", "range"),
    ((TcpPortSet(65536, (61000,)),), f"{P}[0].dport", "range"),
    ((TcpPortSet(5201, ()),), f"{P}[0].sports", "empty"),
    ((TcpPortSet(5201, (61000,)), TcpPortSet(5201, (61001,))), f"{P}[1]", "duplicate"),
    (tuple(TcpPortSet(d, (61000,)) for d in range(1, 35)), P, "34 entries, at most 33"),
])
def test_bad_tcp_ports_in_a_report_are_refused_by_field(tcp: tuple[TcpPortSet, ...],
                                                         field: str, why: str) -> None:
    with pytest.raises(InvalidMessage, match=why) as e:
        check_report(_with_path(*tcp))
    assert e.value.field == field


def test_bad_tcp_ports_in_a_plan_are_refused_whole() -> None:
    def hp(**tcp: object) -> HostPlan:
        route = replace(PeerRoute("h0", "h1", ("10.2.1.2",), 49152), **tcp)  # type: ignore[arg-type]
        return HostPlan(1, "h0", 0, 4, (JobAssignment("a", JobState.SCHEDULED, level=1,
                                                      dscp=8, routes=(route,)),))
    assert check_host_plan(hp(tcp_dport=5201, tcp_sports=(61000, 61001)), "h0")
    for bad in ({"tcp_dport": 5201, "tcp_sports": tuple(range(61000, 61009))},
                {"tcp_dport": 0, "tcp_sports": (61000,)},
                {"tcp_dport": 5201, "tcp_sports": (61000, 61000)},
                {"tcp_dport": 70000}):
        with pytest.raises(InvalidMessage, match=r"jobs\[0\]\.routes\[0\]\.tcp_"):
            check_host_plan(hp(**bad), "h0")


def test_schedule_merges_udp_and_tcp_paths_by_hop_signature() -> None:
    s = ProbeSchedule((ipaddress.ip_network("10.0.0.0/8"),), interval_s=60)
    s.set_peers({"h1": ["10.2.1.2"]}, now=0.0)
    udp = SweepResult("h1", {("l0", "s0"): [49152], ("l0", "s1"): [49153]})
    tcp = SweepResult("h1", {("l0", "s1"): [61001, 61002], ("l0", "s2"): [61000]})
    assert s.record("h1", udp, 0, "", 1.0, 1000, {5201: tcp})
    paths = {p.hops: (p.sports, p.tcp_sports(5201)) for p in s.peers["h1"].paths}
    assert paths == {("l0", "s0"): ((49152,), ()), ("l0", "s1"): ((49153,), (61001, 61002)),
                     ("l0", "s2"): ((), (61000,))}
    assert not s.record("h1", udp, 0, "", 2.0, 2000, {5201: tcp})  # same ports: no change
    assert s.record("h1", udp, 0, "", 3.0, 3000, {5201: SweepResult("h1")})  # TCP ports gone
    s.record("h1", udp, 0, "", 4.0, 4000, {5201: tcp})
    peer = s.peers["h1"]
    assert list(s.tcp_sports(peer, 5201, range(60999, 61003))) == [61001, 61002, 61000, 60999]
    assert list(s.tcp_sports(peer, 5301, range(61000, 61002))) == [61000, 61001]
    assert s.known_tcp(peer, 5201) == {61001: ("l0", "s1"), 61002: ("l0", "s1"),
                                       61000: ("l0", "s2")}
    assert s.known_tcp(peer, 5301) == {}


class _Prober(HashProber):
    def close(self) -> None:
        pass

    def problems(self) -> tuple[int, str]:
        return 0, ""


def test_the_agent_sweeps_tcp_too_and_reports_both_per_path() -> None:
    cfg = parse_config('[agent]\nprobing = "sweep"\n[probing]\nfabric_prefixes = ["10.2.0.0/16"]'
                       "\nrate_pps = 1000\nresponder = false\ntcp_dport = 5201\n"
                       'tcp_sports = "61000-61999"\ntcp_ports_per_path = 4\n', "<t>").probing
    known: list[Mapping[int, tuple[str, ...]]] = []

    def tcp_factory(address: str, dport: int, k: Mapping[int, tuple[str, ...]]) -> _Prober:
        assert dport == 5201
        known.append(dict(k))
        return _Prober(2, seed=11)  # TCP hashes differently from UDP: its own ports

    async def run() -> None:
        sp = SweepProbing(cfg, "h0", lambda: None, lambda a: _Prober(2, seed=7), tcp_factory)
        await sp.start()
        route = PeerRoute("h0", "h1", ("10.2.1.2",))
        sp.plan_changed(HostPlan(1, "h0", 0, 4, (JobAssignment("a", JobState.UNMEASURED,
                                                               routes=(route,)),)))
        while sp.sweeps < 1:
            await asyncio.sleep(0.01)
        first = sp.paths()[0]
        assert len(first.paths) == 2 and sp.name == "sweep (ttl, tcp/5201)"
        for p in first.paths:
            assert len(p.sports) == 1 and [t.dport for t in p.tcp] == [5201]
            assert len(p.tcp[0].sports) == 4 and all(61000 <= x <= 61999 for x in p.tcp[0].sports)
        check_report(AgentReport(HostInventory("h0"), paths=(first,)))
        sp.schedule.request(["h1"], 0.0)  # sweep again: the known TCP ports are kept
        sp._wake.set()
        while sp.sweeps < 2:
            await asyncio.sleep(0.01)
        assert sp.paths()[0].paths == tuple(replace(p, verified_unix_ms=q.verified_unix_ms)
                                            for p, q in zip(first.paths, sp.paths()[0].paths,
                                                            strict=True))
        await sp.stop()

    asyncio.run(run())
    assert known[0] == {} and len(known[1]) == 8  # the second sweep knew every TCP port


def test_tcp_probing_config() -> None:
    p = parse_config("[probing]\n", "<t>").probing
    assert (p.tcp_dport, p.tcp_sports, p.tcp_ports_per_path) == (0, (61000, 65535), 8)
    assert p.tcp_dports_per_peer == 8


def test_a_replan_on_the_same_paths_keeps_the_ports() -> None:
    """A sweep that finds the same paths with their ports in another order (and one more
    TCP port) leaves every route as it was; a route that lost one of its TCP ports takes
    the new set, and one whose UDP port is gone takes the path's new first port."""
    first = make_plan(plan_inputs(state(table_of=tcp_table), 1.0), None, FOUR_LEVELS, 1, 1.0)

    def resweep(k: int, peer: int) -> PathTable:
        t = tcp_table(k, peer)
        return replace(t, paths=tuple(replace(
            p, sports=(p.sports[0] + 1000, *p.sports),
            tcp=(TcpPortSet(5201, (61999, *reversed(p.tcp[0].sports))),)) for p in t.paths))

    inputs = plan_inputs(state(table_of=resweep), 2.0)
    fresh = make_plan(inputs, None, FOUR_LEVELS, 2, 2.0)
    kept = make_plan(inputs, None, FOUR_LEVELS, 2, 2.0, previous=first)
    routes = {a.job_id: a.routes for a in first.jobs}
    assert {a.job_id: a.routes for a in kept.jobs} == routes
    # the same objects, not equal copies: the leader's saves convert each record once
    assert all(a is b for a, b in zip(kept.jobs, first.jobs, strict=True))
    assert {a.job_id: a.routes for a in fresh.jobs} != routes  # without it, new ports

    def lose(k: int, peer: int) -> PathTable:  # each path's first UDP and TCP port gone
        t = tcp_table(k, peer)
        return replace(t, paths=tuple(replace(p, sports=(p.sports[0] + 1000,),
                                              tcp=(TcpPortSet(5201, p.tcp[0].sports[1:]),))
                                      for p in t.paths))

    moved = make_plan(plan_inputs(state(table_of=lose), 3.0), None, FOUR_LEVELS, 3, 3.0,
                      previous=first)
    for a in moved.jobs:
        for old, new in zip({b.job_id: b for b in first.jobs}[a.job_id].routes, a.routes,
                            strict=True):
            assert new.hops == old.hops
            assert new.sport == old.sport + 1000
            assert new.tcp_sports == old.tcp_sports[1:]
