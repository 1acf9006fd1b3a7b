"""The leader keeps each job's routes between plans (cruxd/control/job_routes.py): a plan made
with the kept routes is the plan made afresh, whatever changed in between, and a re-plan
on an unchanged view builds no route again."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from cruxd.control.cluster import ClusterState
from cruxd.control.host_plans import (
    JobMemo,
    LeaderPlanConfig,
    PublishedPlan,
    make_plan,
    plan_inputs,
)
from cruxd.control.records import (
    AgentReport,
    HostInventory,
    LocalJob,
    Measurement,
    Nic,
    PathTable,
    ProbedPath,
)
from cruxd.model.topology import Topology
from cruxd.model.view import TcpPortSet
from cruxd.scheduler.incremental import IncrementalPlanner
from cruxd.scheduler.planner import PlanConfig
from cruxd.topo.builders import clos2

HOSTS = 4  # two ToRs of two hosts, two aggregation switches, two NICs a host
CONFIG = LeaderPlanConfig(PlanConfig(levels=4))
JOBS = {"big": (0, 2), "small": (1, 3), "third": (0, 3)}


def _topology() -> Topology:
    return clos2(2, 2, 2, nics_per_host=2)


class View:
    """What the agents report, changed one event at a time."""

    def __init__(self) -> None:
        self.jobs = dict(JOBS)
        self.flops = {j: 1e12 * (k + 1) for k, j in enumerate(JOBS)}
        self.ports: dict[tuple[str, int], tuple[int, ...]] = {("big", 2): (5201,)}
        self.address = {h: 1 for h in range(HOSTS)}
        self.order = {h: 0 for h in range(HOSTS)}  # how a host's sweep lists its ports

    def table(self, src: int, dst: int) -> PathTable:
        tor_s, tor_d = src // 2, dst // 2
        paths = []
        for agg in range(2):
            hops = (f"tor{tor_s}",) if tor_s == tor_d else (f"tor{tor_s}", f"agg{agg}",
                                                            f"tor{tor_d}")
            sports = (49152 + 16 * agg + dst, 50000 + 16 * agg + dst)[::1 - 2 * self.order[src]]
            tcp = (TcpPortSet(5201, (61000 + 10 * agg + dst, 62000 + 10 * agg + dst)),)
            paths.append(ProbedPath(hops, sports, 1000, tcp))
            if tor_s == tor_d:
                break
        return PathTable(f"h{dst}", tuple(paths), f"10.{self.address[dst]}.0.{dst}", 1000, 4)

    def report(self, h: int) -> AgentReport:
        mine = [(j, hosts) for j, hosts in self.jobs.items() if h in hosts]
        local = tuple(LocalJob(j, 4, hosts.index(h), len(hosts), measurement=Measurement(
            flops_per_iter=self.flops[j] / len(hosts), compute_s=1.0, allreduce_bytes=2e9),
            tcp_ports=self.ports.get((j, h), ())) for j, hosts in mine)
        peers = sorted({p for _, hosts in mine for p in hosts if p != h})
        inv = HostInventory(f"h{h}", gpus=8, nics=tuple(
            Nic(f"mlx5_{p}", f"10.{self.address[h]}.{p}.{h}", p, 100.0) for p in range(2)))
        return AgentReport(inv, local, tuple(self.table(h, p) for p in peers))

    def state(self) -> ClusterState:
        s = ClusterState(agent_timeout_s=30, change_threshold=0.1, profiling_s=0)
        for h in range(HOSTS):
            s.ingest(self.report(h), 0)
        s.advance_profiling(0, enabled=False)
        return s


EVENTS = st.sampled_from(["leave", "return", "flops", "port", "address", "reorder", "none"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(EVENTS, st.sampled_from(sorted(JOBS)), st.integers(0, HOSTS - 1)),
                min_size=1, max_size=8))
def test_kept_routes_are_the_routes_made_afresh(events: list[tuple[str, str, int]]) -> None:
    topo, view = _topology(), View()
    planner, memo = IncrementalPlanner(), JobMemo()
    state = view.state()  # one view, as the leader's: what a report does not change stays
    kept: PublishedPlan | None = None
    fresh: PublishedPlan | None = None
    for gen, (what, job, host) in enumerate([("none", "big", 0), *events], start=1):
        if what == "leave":
            view.jobs.pop(job, None)
        elif what == "return":
            view.jobs[job] = JOBS[job]
        elif what == "flops":
            view.flops[job] *= 7.0  # moves its intensity: paths may be picked again
        elif what == "port":
            hosts = JOBS[job]
            at = hosts[host % len(hosts)]
            view.ports[(job, at)] = () if view.ports.get((job, at)) else (5201 + host,)
        elif what == "address":
            view.address[host] += 1
        elif what == "reorder":
            view.order[host] ^= 1
        for h in range(HOSTS):
            state.ingest(view.report(h), 0)
        inputs = plan_inputs(state, 1.0)
        kept = make_plan(inputs, topo, CONFIG, gen, 1.0, planner=planner, jobs=memo,
                         previous=kept)
        fresh = make_plan(inputs, topo, CONFIG, gen, 1.0, previous=fresh)
        assert [(a.job_id, a.routes) for a in kept.jobs] == [
            (a.job_id, a.routes) for a in fresh.jobs]


def test_an_unchanged_view_builds_no_route_again() -> None:
    topo, view = _topology(), View()
    planner, memo = IncrementalPlanner(), JobMemo()
    state = view.state()
    first = make_plan(plan_inputs(state, 1.0), topo, CONFIG, 1, 1.0, planner=planner,
                      jobs=memo)
    second = make_plan(plan_inputs(state, 1.0), topo, CONFIG, 2, 1.0, planner=planner,
                       jobs=memo, previous=first)
    assert memo.routes.built == len(JOBS)  # once more: `first` had no previous routes
    third = make_plan(plan_inputs(state, 1.0), topo, CONFIG, 3, 1.0, planner=planner,
                      jobs=memo, previous=second)
    assert memo.routes.built == 0
    assert all(a is b for a, b in zip(second.jobs, third.jobs, strict=True))
    assert all(a.routes for a in third.jobs)
    # a peer's new NIC address: the jobs with a route toward it, and only they
    view.address[3] += 1
    state.ingest(view.report(3), 0)
    fourth = make_plan(plan_inputs(state, 1.0), topo, CONFIG, 4, 1.0, planner=planner,
                       jobs=memo, previous=third)
    assert memo.routes.built == 2  # small (h1 <-> h3) and third (h0 <-> h3)
    moved = {a.job_id for a in fourth.jobs if any("10.2." in x for r in a.routes
                                                  for x in r.peer_addresses)}
    assert moved == {"small", "third"}
    assert replace(fourth, generation=3) != third
