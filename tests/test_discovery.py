"""The leader's fabric from probed hop lists: alias resolution, links, and planning
on it (the path selection returns the probed source ports)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cruxd.control.cluster import ClusterState
from cruxd.control.discovery import discover
from cruxd.control.host_plans import LeaderPlanConfig, make_plan, plan_inputs
from cruxd.control.records import (
    AgentReport,
    HostInventory,
    JobState,
    LocalJob,
    Measurement,
    Nic,
    PathTable,
    ProbedPath,
)
from cruxd.scheduler.planner import PlanConfig

HOSTS_PER_LEAF = 2
FOUR_LEVELS = LeaderPlanConfig(PlanConfig(levels=4))


def addr(k: int) -> str:
    return f"10.2.{k}.2"


def hops(src: int, dst: int, spine: int) -> tuple[str, ...]:
    """What a TTL trace reads on tests/rig/fabric.py with inbound-interface replies."""
    sl, dl = src // HOSTS_PER_LEAF, dst // HOSTS_PER_LEAF
    if sl == dl:
        return (f"10.2.{src}.1",)
    return (f"10.2.{src}.1", f"10.3.{sl * 32 + spine}.2", f"10.3.{dl * 32 + spine}.1")


def table(src: int, dst: int, spines: int = 2, verified: int = 1000) -> PathTable:
    n = 1 if src // HOSTS_PER_LEAF == dst // HOSTS_PER_LEAF else spines
    return PathTable(f"h{dst}", tuple(ProbedPath(hops(src, dst, s), (49152 + 16 * s + dst,),
                                                 verified) for s in range(n)),
                     addr(dst), verified, 2 * n)


def nics(n: int = 4) -> dict[str, tuple[Nic, ...]]:
    return {f"h{k}": (Nic("eth0", addr(k), 0, 25.0),) for k in range(n)}


def test_aliases_links_and_tiers_of_a_two_spine_clos() -> None:
    tables = {f"h{s}": {f"h{d}": table(s, d) for d in range(4) if d != s} for s in range(4)}
    fabric = discover(tables, nics(), link_gbps=100.0)
    assert fabric is not None
    topo = fabric.topology
    # leaf 0 answers as 10.2.0.1 to h0, 10.2.1.1 to h1 and 10.3.s.1 to spine s: one router
    assert fabric.routers["10.2.0.1"] == ("10.2.0.1", "10.2.1.1", "10.3.0.1", "10.3.1.1")
    assert fabric.routers["10.2.2.1"] == ("10.2.2.1", "10.2.3.1", "10.3.32.1", "10.3.33.1")
    # each spine is seen from two sides; no probe ties those addresses together
    assert {r for r in fabric.routers if r.startswith("10.3.")} == {
        "10.3.0.2", "10.3.1.2", "10.3.32.2", "10.3.33.2"}
    assert {topo.nodes[r].tier for r in ("10.2.0.1", "10.2.2.1")} == {1}
    assert {topo.nodes[r].tier for r in ("10.3.0.2", "10.3.33.2")} == {2}
    names = {lk.name for lk in topo.links}
    # host links: 4 up + 4 down; each leaf to each spine and back: 2 x 2 x 2
    assert len(names) == 8 + 8
    assert "h0->10.2.0.1#0" in names and "10.2.0.1->h1#0" in names
    assert "10.2.0.1->10.3.0.2" in names and "10.3.0.2->10.2.2.1" in names
    host_link = next(lk for lk in topo.links if lk.src == "h0")
    fabric_link = next(lk for lk in topo.links if lk.src == "10.3.0.2")
    assert (host_link.capacity_gbps, fabric_link.capacity_gbps) == (25.0, 100.0)
    # paths in router names, ports kept
    p = fabric.paths[("h0", "h2")]
    assert [x.hops for x in p] == [("10.2.0.1", "10.3.0.2", "10.2.2.1"),
                                   ("10.2.0.1", "10.3.1.2", "10.2.2.1")]
    assert [x.sports for x in p] == [(49154,), (49170,)]


def test_int_node_ids_name_routers_without_aliasing() -> None:
    """Node ids are routers: the spine preceded by both leaves stays one node and the
    leaves stay two (the ingress-address rule would wrongly merge them)."""
    def t(src_leaf: str, dst_leaf: str, dst: str) -> PathTable:
        return PathTable(dst, tuple(ProbedPath((src_leaf, f"node:{s}", dst_leaf), (49152 + s,))
                                    for s in (100, 101)), addr(int(dst[1:])))
    tables = {"h0": {"h2": t("node:1", "node:2", "h2")}, "h2": {"h0": t("node:2", "node:1", "h0")}}
    fabric = discover(tables, nics(), 100.0)
    assert fabric is not None
    assert sorted(fabric.routers) == ["node:1", "node:100", "node:101", "node:2"]
    links = {lk.name for lk in fabric.topology.links}
    assert {"node:1->node:100", "node:100->node:2", "node:2->node:100"} <= links


def test_nothing_probed_is_no_fabric_and_hop_host_clash_is_refused() -> None:
    assert discover({"h0": {}}, nics(1), 100.0) is None
    bad = {"h0": {"h1": PathTable("h1", (ProbedPath(("h1",), (49152,)),))}}
    with pytest.raises(ValueError, match="also a host"):
        discover(bad, nics(2), 100.0)


def ring(jid: str, rank: int, flops: float) -> LocalJob:
    return LocalJob(jid, 8, rank, 2, measurement=Measurement(
        flops_per_iter=flops, compute_s=1.0, allreduce_bytes=2e9))


def state(paths: bool = True,
          table_of: Callable[[int, int], PathTable] | None = None) -> ClusterState:
    """Jobs big (h0, h2) and small (h1, h3) on the 2x2 fabric, each host reporting its path
    table toward its job's peer (`table_of(host, peer)`, default `table`), profiled."""
    table_of = table_of or table
    s = ClusterState(agent_timeout_s=30, change_threshold=0.1, profiling_s=0)
    jobs = {0: ring("big", 0, 1e12), 2: ring("big", 1, 1e12),
            1: ring("small", 0, 1e13), 3: ring("small", 1, 1e13)}
    peer = {0: 2, 2: 0, 1: 3, 3: 1}
    for k in range(4):
        inv = HostInventory(f"h{k}", gpus=8, nics=nics()[f"h{k}"], probing_source="sweep")
        tables = (table_of(k, peer[k]),) if paths else ()
        s.ingest(AgentReport(inv, (jobs[k],), tables), 0)
    s.advance_profiling(0, enabled=False)
    return s


def test_planning_on_the_discovered_fabric_separates_jobs_and_returns_ports() -> None:
    """Two rings crossing the same leaf pair get different spines, and each route
    carries the probed source port of the spine it was given."""
    plan = make_plan(plan_inputs(state(), 1.0), None, FOUR_LEVELS, 1, 1.0)
    assert plan.topology == "discovered"
    jobs = {a.job_id: a for a in plan.jobs}
    assert {a.state for a in jobs.values()} == {JobState.SCHEDULED}
    spines = {}
    for a in jobs.values():
        for r in a.routes:
            src, dst = int(r.src_host[1:]), int(r.peer_host[1:])
            spine = next(s for s in range(2) if r.hops[1] == hops(src, dst, s)[1])
            assert r.sport == 49152 + 16 * spine + dst  # the port probed onto that spine
            assert r.peer_addresses == (addr(dst),)
            spines[(a.job_id, src // HOSTS_PER_LEAF)] = spine
    assert spines[("big", 0)] != spines[("small", 0)]  # leaf 0 -> leaf 1
    assert spines[("big", 1)] != spines[("small", 1)]  # leaf 1 -> leaf 0


def test_rings_wait_for_probes_but_still_name_their_peers() -> None:
    """Without path tables there is no discovered fabric: the star plans them. With
    only one direction probed the ring waits, and its routes say whom to probe."""
    plan = make_plan(plan_inputs(state(paths=False), 1.0), None, FOUR_LEVELS, 1, 1.0)
    assert plan.topology == "star"
    s = state()
    s.agents["h2"].paths.clear()  # h2 -> h0 not probed yet
    plan = make_plan(plan_inputs(s, 1.0), None, FOUR_LEVELS, 2, 1.0)
    big = next(a for a in plan.jobs if a.job_id == "big")
    assert big.state is JobState.UNMEASURED and big.note == "no probed path h2 -> h0 yet"
    assert {(r.src_host, r.peer_host, r.sport) for r in big.routes} == {
        ("h0", "h2", 0), ("h2", "h0", 0)}
    assert plan.for_host("h2").jobs[0].routes[0].peer_addresses == (addr(0),)
