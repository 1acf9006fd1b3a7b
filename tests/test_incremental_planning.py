"""IncrementalPlanner (cruxd/scheduler/incremental.py) gives exactly plan()'s plan."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cruxd.errors import PlanningError
from cruxd.model.jobs import Job, ring_allreduce
from cruxd.model.topology import Topology
from cruxd.model.view import ClusterView, DiscoveredPath
from cruxd.scheduler.compression import compress_indexed
from cruxd.scheduler.incremental import IncrementalPlanner
from cruxd.scheduler.planner import PlanConfig, plan
from cruxd.topo.builders import clos2

TOPO = clos2(3, 2, 3, nics_per_host=2)  # 9 hosts, 2 NIC rails, 2 spines
HOSTS = TOPO.hosts
Table = dict[tuple[str, str], tuple[DiscoveredPath, ...]]


def make_job(jid: str, hosts: list[int], gpus: int, compute: float, nbytes: float,
             flops_scale: float, comm_s: float | None = None, declared: bool = False,
             topo: Topology = TOPO) -> Job:
    placed = tuple((topo.hosts[h], gpus) for h in hosts)
    flows = ring_allreduce(placed, nbytes, {h: topo.nic_ports(h) for h, _ in placed})
    return Job(jid, placed, compute, len(placed) * gpus * compute * 1e14 * flops_scale, 0.5,
               flows, comm_s=comm_s, declared=declared)


jobs_st = st.builds(
    lambda hosts, gpus, compute, nbytes, scale, declared: (hosts, gpus, compute, nbytes, scale,
                                                          declared),
    st.lists(st.integers(0, len(HOSTS) - 1), min_size=1, max_size=4, unique=True),
    st.sampled_from([4, 8]), st.sampled_from([0.2, 0.5, 1.0, 1.5]),
    st.sampled_from([1e8, 5e8, 2e9]), st.sampled_from([0.5, 1.0, 2.0]), st.booleans())

events_st = st.lists(st.one_of(
    st.tuples(st.just("arrive"), jobs_st),
    st.tuples(st.just("depart"), st.integers(0, 30)),
    st.tuples(st.just("measure"), st.integers(0, 30),
              st.sampled_from([None, 0.05, 0.3, 1.0]), st.sampled_from([0.5, 1.0, 3.0])),
    st.tuples(st.just("probe"), st.integers(0, 30), st.integers(0, 1)),
), min_size=1, max_size=14)


def apply(event: tuple[Any, ...], jobs: list[Job], table: Table, serial: list[int]) -> None:
    kind = event[0]
    if kind == "arrive":
        hosts, gpus, compute, nbytes, scale, declared = event[1]
        serial[0] += 1
        jobs.insert(serial[0] % (len(jobs) + 1),
                    make_job(f"j{serial[0]:02d}", hosts, gpus, compute, nbytes, scale,
                             declared=declared))
    elif not jobs:
        return
    elif kind == "depart":
        jobs.pop(event[1] % len(jobs))
    elif kind == "measure":  # a new t_j and W_j for one job (declared ones become measured)
        i = event[1] % len(jobs)
        jobs[i] = replace(jobs[i], comm_s=event[2], flops=jobs[i].flops * event[3],
                          declared=False)
    else:  # a probe: one flow's pair gets a path table entry (the spine it found)
        job = jobs[event[1] % len(jobs)]
        if job.flows:
            f = job.flows[0]
            tor = f"tor{HOSTS.index(f.src) // 3}"
            dst_tor = f"tor{HOSTS.index(f.dst) // 3}"
            hops = (tor,) if tor == dst_tor else (tor, f"agg{event[2]}", dst_tor)
            table[(f.src, f.dst)] = (DiscoveredPath(hops, (49152 + event[2],)),)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.lists(jobs_st, max_size=6), events=events_st, levels=st.integers(1, 4),
       tolerance=st.sampled_from([0.0, 0.0, 0.3]), samples=st.sampled_from([1, 3]),
       ideal=st.booleans())
def test_incremental_equals_from_scratch(first: list[tuple[Any, ...]],
                                         events: list[tuple[Any, ...]], levels: int,
                                         tolerance: float, samples: int, ideal: bool) -> None:
    """Also across the level-aware rounds (levels > 1, or a level per job: `ideal`),
    which read every job's level and must not leak into the next plan's selection."""
    config = PlanConfig(levels=levels, tie_tolerance=tolerance, samples=samples, seed=3,
                        busiest_links=4, ideal_levels=ideal)
    jobs: list[Job] = []
    table: Table = {}
    serial = [0]
    for spec in first:
        apply(("arrive", spec), jobs, table, serial)
    inc = IncrementalPlanner()
    for event in [("depart", 10**6), *events]:  # the first plan, then one per event
        apply(event, jobs, table, serial)
        view = ClusterView(TOPO, tuple(jobs), dict(table))
        assert inc.plan(view, config) == plan(view, config)


def two_pod_jobs() -> list[Job]:
    """Jobs on disjoint ToRs (no shared candidate link between the groups)."""
    return [make_job("a1", [0, 1], 8, 1.0, 2e9, 1.0), make_job("a2", [1, 2], 8, 0.5, 1e9, 1.0),
            make_job("a3", [0, 2], 8, 1.5, 5e8, 2.0), make_job("b1", [3, 4], 8, 1.0, 2e9, 1.0),
            make_job("b2", [4, 5], 8, 0.2, 2e9, 0.5)]


def test_a_new_most_intensive_job_leaves_the_other_group_alone() -> None:
    """The new job is the most intensive (it would have moved I_max): the jobs it shares
    no link with keep their picks and their compressed component."""
    inc = IncrementalPlanner()
    jobs = two_pod_jobs()
    config = PlanConfig(levels=2, samples=4)
    assert inc.plan(ClusterView(TOPO, tuple(jobs)), config) == plan(
        ClusterView(TOPO, tuple(jobs)), config)
    hot = make_job("hot", [3, 5], 8, 1.5, 1e8, 50.0)
    view = ClusterView(TOPO, (*jobs, hot))
    got = inc.plan(view, config)
    assert got == plan(view, config)
    assert got.jobs[0].job == "hot"  # rank 0: the largest P_j
    assert inc.rebuilt == 1  # only the new job's candidates were computed
    assert inc.repicked < len(jobs)  # ToR 0's jobs (a*) were not placed again
    assert inc._memo.hits >= 1  # the a-component's levels were reused


def test_a_repeated_view_reuses_everything() -> None:
    inc = IncrementalPlanner()
    view = ClusterView(TOPO, tuple(two_pod_jobs()))
    first = inc.plan(view)
    again = inc.plan(ClusterView(TOPO, tuple(two_pod_jobs())))  # equal, not the same, Jobs
    assert again == first == plan(view)
    assert (inc.rebuilt, inc.repicked, inc._memo.misses) == (0, 0, 0)


def test_a_measured_job_caps_declared_ones_and_everything_follows() -> None:
    """Declared intensities are capped at the lowest measured one: a measurement of
    one job changes other jobs' intensities, which the planner must notice."""
    jobs = [replace(j, declared=True) for j in two_pod_jobs()]
    inc = IncrementalPlanner()
    inc.plan(ClusterView(TOPO, tuple(jobs)))
    jobs[0] = replace(jobs[0], declared=False, comm_s=0.9, flops=jobs[0].flops / 100)
    view = ClusterView(TOPO, tuple(jobs))
    got = inc.plan(view)
    assert got == plan(view)
    capped = got.job("a1").intensity
    assert all(d.intensity <= capped for d in got.jobs if d.job != "a1")


def test_another_topology_or_max_paths_starts_afresh() -> None:
    inc = IncrementalPlanner()
    jobs = two_pod_jobs()
    inc.plan(ClusterView(TOPO, tuple(jobs)))
    other = clos2(3, 3, 3, nics_per_host=2)
    view = ClusterView(other, tuple(make_job(j.id, [HOSTS.index(h) for h, _ in j.hosts], 8,
                                             j.compute_s, 1e9, 1.0, topo=other) for j in jobs))
    assert inc.plan(view) == plan(view)
    assert inc.rebuilt == len(jobs)
    config = PlanConfig(max_paths=1)
    assert inc.plan(view, config) == plan(view, config)
    assert inc.rebuilt == len(jobs)


def test_a_failed_plan_leaves_no_half_state_and_duplicates_plan_afresh() -> None:
    inc = IncrementalPlanner()
    jobs = two_pod_jobs()
    inc.plan(ClusterView(TOPO, tuple(jobs)))
    with pytest.raises(PlanningError):
        inc.plan(ClusterView(TOPO, tuple(jobs)), PlanConfig(reference_job="nobody"))
    view = ClusterView(TOPO, tuple(jobs[1:]))
    assert inc.plan(view) == plan(view)
    twice = ClusterView(TOPO, (*jobs, jobs[0]))
    assert inc.plan(twice) == plan(twice)


def test_components_are_compressed_independently() -> None:
    """What the component memo relies on: a component's levels do not depend on the
    other components (seeded per component, weights rescaled per component)."""
    rng = np.random.default_rng(5)
    hi = np.array([0, 0, 1, 2, 5, 5, 6, 7], dtype=np.int64)
    lo = np.array([1, 2, 3, 3, 6, 7, 8, 8], dtype=np.int64)
    w = rng.uniform(0.1, 1.0, len(hi))
    both = compress_indexed(9, hi, lo, w, 3, np.arange(9), samples=5, seed=2)
    first = compress_indexed(4, hi[:4], lo[:4], w[:4], 3, np.arange(4), samples=5, seed=2)
    second = compress_indexed(4, hi[4:] - 5, lo[4:] - 5, w[4:] * 1024.0, 3, np.arange(4),
                              samples=5, seed=2)
    assert both[:4].tolist() == first.tolist()
    assert both[5:].tolist() == second.tolist()
    assert both[4] == 2  # no edges: the top level
