"""plan(view, config): composition, determinism and end-to-end invariants."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cruxd.model.jobs import FlowSpec, Job, ring_allreduce
from cruxd.model.view import ClusterView
from cruxd.scenario import load_scenario
from cruxd.scheduler import PlanConfig, plan
from cruxd.scheduler.dscp import default_dscp
from cruxd.topo import clos2, testbed96
from tests.paths import EXAMPLES


def _ring(topo, job_id, hosts, gpus, compute, size, overlap=0.0):  # type: ignore[no-untyped-def]
    placed = tuple((h, gpus) for h in hosts)
    flows = ring_allreduce(placed, size, {h: topo.nic_ports(h) for h in hosts})
    return Job(job_id, placed, compute, gpus * len(hosts) * compute * 1e14, overlap, flows,
               "ring_allreduce")


def _fabric_links(topo, p, job):  # type: ignore[no-untyped-def]
    return {i for f in p.flows if f.job == job for i in f.path
            if not topo.is_host(topo.links[i].src) and not topo.is_host(topo.links[i].dst)}


def test_same_input_same_plan() -> None:
    sc = load_scenario(EXAMPLES / "testbed96-colocation.json")
    a, b = plan(sc.view, sc.config), plan(sc.view, sc.config)
    assert json.dumps(a.to_dict()) == json.dumps(b.to_dict())


def test_most_intensive_job_gets_paths_of_its_own() -> None:
    sc = load_scenario(EXAMPLES / "testbed96-colocation.json")
    p = plan(sc.view, sc.config)
    top = p.jobs[0].job
    assert top == "gpt-48"
    mine = _fabric_links(sc.view.topology, p, top)
    for d in p.jobs[1:]:
        assert not mine & _fabric_links(sc.view.topology, p, d.job), d.job


def test_path_selection_steers_around_an_intensive_job() -> None:
    # Two jobs between the same pair of ToRs with one NIC each: the second takes
    # the other spine rather than the one the first (more intensive) job uses.
    topo = clos2(2, 2, 2, nics_per_host=1)
    big = _ring(topo, "big", ["h0", "h2"], 8, 1.0, 4e9)
    small = _ring(topo, "small", ["h1", "h3"], 8, 0.2, 1e9)
    p = plan(ClusterView(topo, (small, big)))
    assert p.job("big").intensity > p.job("small").intensity
    assert not _fabric_links(topo, p, "big") & _fabric_links(topo, p, "small")
    assert p.contention_weight == 0.0


def test_comm_time_is_the_busiest_link() -> None:
    topo = clos2(2, 1, 1, nics_per_host=1, nic_gbps=100)  # uplinks 100 Gbit/s
    job = Job("j", (("h0", 8), ("h1", 8)), 1.0, 1e15, 0.0, (FlowSpec("h0", "h1", 25e9),))
    d = plan(ClusterView(topo, (job,))).job("j")
    assert d.comm_s == pytest.approx(25e9 * 8 / 100e9)  # 2 s
    assert d.intensity == pytest.approx(1e15 / 2.0)
    assert d.period_s == pytest.approx(3.0)


def test_measured_comm_time_wins_over_the_model() -> None:
    topo = clos2(2, 1, 1, nics_per_host=1)
    job = Job("j", (("h0", 8), ("h1", 8)), 1.0, 1e15, 0.0, (FlowSpec("h0", "h1", 1e9),),
              comm_s=0.5)
    assert plan(ClusterView(topo, (job,))).job("j").comm_s == 0.5


def test_a_job_without_network_traffic() -> None:
    topo = testbed96()
    local = Job("local", (("h0", 8),), 1.0, 1e15, 0.0, ())
    ring = _ring(topo, "ring", ["h2", "h4"], 8, 1.0, 1e9)
    p = plan(ClusterView(topo, (ring, local)))
    d = p.job("local")
    assert not d.network and d.intensity == float("inf") and d.rank == 0
    assert p.to_dict()["jobs"][0]["intensity"] is None  # JSON has no infinity
    json.dumps(p.to_dict(), allow_nan=False)


def test_dscp_follows_the_levels() -> None:
    assert default_dscp(5) == (8, 16, 24, 32, 40)
    assert default_dscp(3) == (24, 32, 40)
    with pytest.raises(ValueError, match="unreserved"):
        default_dscp(6)
    sc = load_scenario(EXAMPLES / "fig13-compression.json")
    p = plan(sc.view, PlanConfig(levels=2, dscp=(26, 46)))
    assert {d.level: d.dscp for d in p.jobs} == {0: 26, 1: 46}
    assert all(d.traffic_class == d.dscp << 2 for d in p.jobs)


@st.composite
def clusters(draw: st.DrawFn) -> ClusterView:
    tors = draw(st.integers(2, 4))
    per_tor = draw(st.integers(1, 5))
    topo = clos2(tors, 2, per_tor, nics_per_host=draw(st.integers(1, 2)))
    hosts = topo.hosts
    jobs = []
    for j in range(draw(st.integers(1, 7))):
        members = draw(st.lists(st.sampled_from(hosts), min_size=2, max_size=len(hosts),
                                unique=True))
        jobs.append(_ring(topo, f"j{j}", members, draw(st.sampled_from([4, 8])),
                          draw(st.floats(0.05, 2.0)), draw(st.floats(1e8, 4e9)),
                          draw(st.floats(0.0, 1.0))))
    return ClusterView(topo, tuple(jobs))


@given(view=clusters(), levels=st.integers(1, 5))
def test_plans_never_invert_a_contending_pair(view: ClusterView, levels: int) -> None:
    p = plan(view, PlanConfig(levels=levels, samples=3))
    assert sorted(d.rank for d in p.jobs) == list(range(len(view.jobs)))
    assert all(0 <= d.level < levels for d in p.jobs)
    users: dict[int, set[str]] = {}
    for f in p.flows:
        assert len(f.path) >= 2 and f.candidates >= 1
        for link in f.path:
            users.setdefault(link, set()).add(f.job)
    by_id = {d.job: d for d in p.jobs}
    for jobs in users.values():
        for a in jobs:
            for b in jobs:
                if by_id[a].rank < by_id[b].rank:
                    assert by_id[a].level >= by_id[b].level
    assert 0.0 <= p.cut_weight <= p.contention_weight * (1 + 1e-9)
    ordered = [d.priority for d in p.jobs]
    assert ordered == sorted(ordered, reverse=True)
    assert np.isfinite([d.k for d in p.jobs]).all()
