"""Per-job TCP ports (issue 33): what a job listens on reaches the leader bounded and
validated, the leader's routes steer each job toward its own port at the peer with the
ports probed for it, and the agent's sweeps probe exactly those (peer, port) pairs."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cruxd.agent.job_ports import MAX_JOB_PORTS, learned_ports, merge_ports
from cruxd.agent.sweeper import SweepProbing
from cruxd.cli import crux_run
from cruxd.config.parse import parse_config
from cruxd.control.cluster import ClusterState
from cruxd.control.host_plans import make_plan, plan_inputs
from cruxd.control.records import (
    AgentReport,
    HostInventory,
    HostPlan,
    JobAssignment,
    JobState,
    LocalJob,
    Measurement,
    PathTable,
    PeerRoute,
    ProbedPath,
)
from cruxd.control.tcp_routes import route_tcp
from cruxd.control.validate import MAX_JOB_TCP_PORTS, InvalidMessage, check_report
from cruxd.model.view import DiscoveredPath, TcpPortSet
from cruxd.rpc import convert
from tests.test_discovery import FOUR_LEVELS, addr, hops, nics
from tests.test_probing_core import HashProber
from transport.sock_records import SockCounts

EXTRA = 5201  # an agent's [probing] tcp_dport
PORTS = st.integers(1, 65535)


# --- what a job reports -------------------------------------------------------------


def test_declared_ports_come_first_then_learned_each_once_and_bounded() -> None:
    assert merge_ports((5301, 29500), (40000, 5301, 0, 70000)) == (5301, 29500, 40000)
    many = merge_ports(range(1, 10), range(5, 30))
    assert many == tuple(range(1, MAX_JOB_PORTS + 1)) and MAX_JOB_PORTS == MAX_JOB_TCP_PORTS
    assert crux_run.MAX_TCP_PORTS == MAX_JOB_TCP_PORTS  # crux-run refuses what the agent would


def _rec(pid: int, job: str, ports: tuple[int, ...]) -> SockCounts:
    return SockCounts(pid, job, {}, 0, 0, listen_ports=ports)


def test_learned_ports_count_only_from_processes_of_the_jobs_own_user() -> None:
    owners = {"a": 1000, "b": 1001}
    uids = {10: {1000}, 11: {1000}, 12: {1002}, 13: {1001}}
    got = learned_ports([_rec(11, "a", (5302, 5301)), _rec(10, "a", (5301,)),
                         _rec(12, "a", (6000,)),  # another user claims job a: ignored
                         _rec(13, "b", (7000,)), _rec(14, "gone", (8000,))],
                        owners.get, uids.get)
    assert got == {"a": (5301, 5302), "b": (7000,)}


@pytest.mark.parametrize(("ports", "field", "why"), [
    (tuple(range(1, 18)), "jobs[0].tcp_ports", "17 entries, at most 16"),
    ((0,), "jobs[0].tcp_ports[0]", "range"),
    ((65536,), "jobs[0].tcp_ports[0]", "range"),
    ((5301, 5301), "jobs[0].tcp_ports[1]", "duplicate"),
])
def test_a_report_with_bad_job_ports_is_refused_by_field(ports: tuple[int, ...], field: str,
                                                          why: str) -> None:
    r = AgentReport(HostInventory("h0"), (LocalJob("a", 4, tcp_ports=ports),))
    with pytest.raises(InvalidMessage, match=why) as e:
        check_report(convert.report_from_pb(convert.report_to_pb(r)))
    assert e.value.field == field


def test_job_ports_cross_the_wire() -> None:
    r = AgentReport(HostInventory("h0"), (LocalJob("a", 4, tcp_ports=(5301, 40000)),))
    assert convert.report_from_pb(convert.report_to_pb(r)) == r


@pytest.mark.parametrize("argv", [["--tcp-port", "0"], ["--tcp-port", "65536"],
                                  [f"--tcp-port={p}" for p in range(1, 18)]])
def test_crux_run_refuses_bad_ports_before_registering(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert crux_run.main([*argv, "--job-id", "j", "--", "true"]) == 2
    assert "--tcp-port" in capsys.readouterr().err


def test_a_job_changing_its_ports_re_plans() -> None:
    s = ClusterState(agent_timeout_s=30, change_threshold=0.1, profiling_s=0)
    inv = HostInventory("h0")
    s.ingest(AgentReport(inv, (LocalJob("a", 4, tcp_ports=(5301,)),)), 0)
    assert s.ingest(AgentReport(inv, (LocalJob("a", 4, tcp_ports=(5301,)),)), 1) == []
    assert s.ingest(AgentReport(inv, (LocalJob("a", 4, tcp_ports=(5301, 40000)),)), 2) == [
        "TCP ports changed: a on h0"]
    assert s.merged_jobs()[0].ports_at("h0") == (5301, 40000)


# --- the route's port ----------------------------------------------------------------


@given(ports=st.lists(PORTS, max_size=4, unique=True),
       sets=st.dictionaries(PORTS, st.lists(PORTS, min_size=1, max_size=8, unique=True),
                            max_size=5),
       others=st.frozensets(PORTS, max_size=4), probed=st.booleans())
def test_a_route_steers_the_jobs_own_port_with_the_ports_probed_for_it(
        ports: list[int], sets: dict[int, list[int]], others: frozenset[int],
        probed: bool) -> None:
    path = DiscoveredPath(("l", "s"), (49152,),
                          tuple(TcpPortSet(d, tuple(s)) for d, s in sets.items()))
    dport, sports = route_tcp(tuple(ports), path if probed else None, others)
    if dport:  # the source ports are always those probed toward that very port
        assert sports == (path.tcp_sports(dport) if probed else ())
    if ports:  # the job's own port: the first with probed ports, else its first
        assert dport in ports
        with_ports = [p for p in ports if probed and p in sets]
        assert dport == (with_ports[0] if with_ports else ports[0])
    else:  # none of its own: never another job's port at the peer
        assert dport not in others
        assert (dport != 0) == (probed and any(d not in others for d in sets))


def _two_jobs_one_host_pair() -> ClusterState:
    """Jobs a and b both on h0 and h2 (4 GPUs each, a more intensive), a listening on 5301
    and b on 5302 at both hosts, c (h1, h3) on no port of its own; every agent probed both
    spines toward its peers for each job's port there and for EXTRA."""
    s = ClusterState(agent_timeout_s=30, change_threshold=0.1, profiling_s=0)

    def job(jid: str, rank: int, flops: float, ports: tuple[int, ...]) -> LocalJob:
        return LocalJob(jid, 4, rank, 2, tcp_ports=ports, measurement=Measurement(
            flops_per_iter=flops, compute_s=1.0, allreduce_bytes=2e9))

    def table(src: int, dst: int, dports: tuple[int, ...]) -> PathTable:
        return PathTable(f"h{dst}", tuple(ProbedPath(
            hops(src, dst, sp), (49152 + 16 * sp + dst,), 1000,
            tuple(TcpPortSet(d, (61000 + 100 * sp + d % 100, 61001 + 100 * sp + d % 100))
                  for d in dports)) for sp in range(2)), addr(dst), 1000, 8)

    peer = {0: 2, 2: 0, 1: 3, 3: 1}
    for k in range(4):
        inv = HostInventory(f"h{k}", gpus=8, nics=nics()[f"h{k}"], probing_source="sweep")
        rank = int(k >= 2)
        if k in (0, 2):
            jobs = (job("a", rank, 1e14, (5301,)), job("b", rank, 1e12, (5302,)))
            dports = (EXTRA, 5301, 5302)
        else:
            jobs, dports = (job("c", rank, 1e13, ()),), (EXTRA,)
        s.ingest(AgentReport(inv, jobs, (table(k, peer[k], dports),)), 0)
    s.advance_profiling(0, enabled=False)
    return s


def test_two_jobs_on_one_host_pair_each_get_their_own_port_and_its_probed_ports() -> None:
    plan = make_plan(plan_inputs(_two_jobs_one_host_pair(), 1.0), None, FOUR_LEVELS, 1, 1.0)
    routes = {(a.job_id, r.src_host): r for a in plan.jobs for r in a.routes}
    for jid, port in (("a", 5301), ("b", 5302), ("c", EXTRA)):
        for src in (("h0", "h2") if jid != "c" else ("h1", "h3")):
            r = routes[(jid, src)]
            spine = int(r.hops[1].split(".")[2]) % 32
            assert r.tcp_dport == port and r.sport == 49152 + 16 * spine + int(r.peer_host[1:])
            base = 61000 + 100 * spine + port % 100
            assert r.tcp_sports == (base, base + 1)  # the chosen path's, for that port
    # and each job's table entry toward the peer says so, on the same host
    hp = plan.for_host("h0")
    from cruxd.agent.core import plan_decisions
    entries = {(d.job_id, d.peer): d for d in plan_decisions(hp)}
    assert entries[("a", addr(2))].tcp_dport == 5301
    assert entries[("b", addr(2))].tcp_dport == 5302


def test_an_unplanned_jobs_routes_name_its_port_so_that_agents_probe_it() -> None:
    s = ClusterState(agent_timeout_s=30, change_threshold=0.1, profiling_s=0)
    for k in (0, 2):
        s.ingest(AgentReport(HostInventory(f"h{k}", gpus=8, nics=nics()[f"h{k}"]),
                             (LocalJob("a", 4, k // 2, 2, tcp_ports=(5301 + k,)),)), 0)
    plan = make_plan(plan_inputs(s, 1.0), None, FOUR_LEVELS, 1, 1.0)
    (a,) = plan.jobs
    assert a.state is JobState.UNMEASURED
    assert {(r.src_host, r.tcp_dport, r.tcp_sports) for r in a.routes} == {
        ("h0", 5303, ()), ("h2", 5301, ())}


# --- the agent's sweeps ---------------------------------------------------------------


class _Prober(HashProber):
    def close(self) -> None:
        pass

    def problems(self) -> tuple[int, str]:
        return 0, ""


def test_the_agent_probes_each_routes_port_and_the_extra_one_bounded_per_peer() -> None:
    cfg = parse_config('[agent]\nprobing = "sweep"\n[probing]\nfabric_prefixes = ["10.2.0.0/16"]'
                       f"\nrate_pps = 1000\nresponder = false\ntcp_dport = {EXTRA}\n"
                       "tcp_ports_per_path = 2\ntcp_dports_per_peer = 2\n", "<t>").probing
    asked: list[tuple[str, int]] = []

    def tcp_factory(address: str, dport: int, known: Mapping[int, tuple[str, ...]]) -> _Prober:
        asked.append((address, dport))
        return _Prober(2, seed=dport)  # each destination port hashes its own way

    def route(job: str, port: int) -> JobAssignment:
        return JobAssignment(job, JobState.UNMEASURED, routes=(
            PeerRoute("h0", "h1", (addr(1),), tcp_dport=port),
            PeerRoute("h1", "h0", (addr(0),), tcp_dport=9999)))  # another host's route

    async def run() -> None:
        sp = SweepProbing(cfg, "h0", lambda: None, lambda a: _Prober(2, seed=7), tcp_factory)
        await sp.start()
        jobs = (route("a", 5302), route("b", 5301), route("c", 5303), route("d", EXTRA))
        sp.plan_changed(HostPlan(1, "h0", 0, 4, jobs))
        assert sp.schedule.peers["h1"].dports == (EXTRA, 5301, 5302)  # 5303: over the bound
        while sp.sweeps < 1:
            await asyncio.sleep(0.01)
        (table,) = sp.paths()
        assert len(table.paths) == 2
        for p in table.paths:
            assert [t.dport for t in p.tcp] == [EXTRA, 5301, 5302]
            assert all(len(t.sports) == 2 for t in p.tcp)
        assert check_report(AgentReport(HostInventory("h0"), paths=(table,)))
        # a job that leaves takes its port out of the next sweep
        sp.plan_changed(HostPlan(2, "h0", 0, 4, jobs[1:2]))
        assert sp.schedule.peers["h1"].dports == (EXTRA, 5301)
        sp.schedule.request(["h1"], 0.0)
        sp._wake.set()
        while sp.sweeps < 2:
            await asyncio.sleep(0.01)
        assert {t.dport for p in sp.paths()[0].paths for t in p.tcp} == {EXTRA, 5301}
        await sp.stop()

    asyncio.run(run())
    assert asked == [(addr(1), d) for d in (EXTRA, 5301, 5302, EXTRA, 5301)]


def test_a_new_job_port_makes_its_peer_due_at_once() -> None:
    cfg = parse_config('[agent]\nprobing = "sweep"\n[probing]\nfabric_prefixes = ["10.2.0.0/16"]'
                       "\nresponder = false\n", "<t>").probing
    sp = SweepProbing(cfg, "h0", lambda: None)

    def plan(port: int) -> HostPlan:
        return HostPlan(1, "h0", 0, 4, (JobAssignment("a", JobState.UNMEASURED, routes=(
            PeerRoute("h0", "h1", (addr(1),), tcp_dport=port),)),))
    sp.plan_changed(plan(0))
    peer = sp.schedule.peers["h1"]
    assert peer.dports == ()  # nothing to probe over TCP: no job port, no tcp_dport
    peer.due = 1e12  # swept already
    sp.plan_changed(plan(5301))
    assert peer.dports == (5301,) and peer.due < 1e12
