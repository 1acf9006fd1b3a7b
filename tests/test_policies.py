"""Baseline policies of the simulator (seed §6.3): Sincronia, TACCL*, CASSINI."""

from __future__ import annotations

import numpy as np
import pytest

from cruxd.model.jobs import FlowSpec, Job, ring_allreduce
from cruxd.model.paths import finder_for
from cruxd.model.topology import Topology
from cruxd.sim.policies import POLICIES, Context, Decisions, make_policy
from cruxd.sim.policies.cassini import Cassini, profile
from cruxd.sim.policies.sincronia import Sincronia, bssi
from cruxd.sim.policies.taccl import Taccl
from cruxd.sim.run import SimConfig, SimJob, simulate
from cruxd.topo import clos2

BASELINES = ("sincronia", "taccl*", "cassini")
GBIT = 1e9 / 8.0  # bytes per Gbit


def ring(jid: str, hosts: list[str], nbytes: float, compute_s: float = 1.0,
         overlap: float = 0.0) -> Job:
    """A job whose ring sends `nbytes` on every host-to-host hop."""
    flows = tuple(FlowSpec(h, hosts[(i + 1) % len(hosts)], nbytes)
                  for i, h in enumerate(hosts))
    return Job(jid, tuple((h, 8) for h in hosts), compute_s, 1e12, overlap, flows)


def ctx_for(topo: Topology, jobs: list[Job], new: set[str] | None = None) -> Context:
    ids = {j.id for j in jobs} if new is None else new
    return Context(topo, finder_for(topo), tuple(jobs), frozenset(ids), 0.0, 8, seed=0)


def one_agg() -> Topology:
    """Two ToRs under one aggregation switch: all cross-ToR traffic shares its links."""
    return clos2(2, 1, 2, nics_per_host=1, uplink_gbps=100.0)


def same(a: Decisions, b: Decisions) -> bool:
    return (a.level == b.level and a.offset_s == b.offset_s and a.paths.keys() == b.paths.keys()
            and all(len(a.paths[k]) == len(b.paths[k])
                    and all(np.array_equal(x, y) for x, y in zip(a.paths[k], b.paths[k],
                                                                 strict=True))
                    for k in a.paths))


# --- Sincronia ---------------------------------------------------------------

def test_bssi_scales_weights_as_in_the_paper() -> None:
    # link 0 is the first bottleneck (5 > 4.5): coflow 0 (3/1) goes last and
    # coflow 1's weight drops to 1 - 2/3; on link 1, 2 / (1/3) = 6 beats 2.5 / 1, so
    # coflow 1 goes second to last. Without the scaling coflow 2 would.
    demand = np.array([[3.0, 0.0], [2.0, 2.0], [0.0, 2.5]])
    assert bssi(demand) == [2, 1, 0]


def test_bssi_puts_idle_coflows_first() -> None:
    assert bssi(np.array([[1.0], [0.0], [2.0]])) == [1, 0, 2]


def test_sincronia_small_coflow_first_paths_left_to_ecmp() -> None:
    topo = one_agg()
    # ids chosen so that id order would be the wrong order
    big = ring("a-big", ["h1", "h3"], 4e9)
    small = ring("b-small", ["h0", "h2"], 1e9)
    d = Sincronia().decide(ctx_for(topo, [big, small]))
    assert d.level == {"b-small": 1, "a-big": 0}
    assert d.paths == {} and d.offset_s == {}


def test_sincronia_compressed_keeps_the_head_of_the_order() -> None:
    topo = clos2(2, 2, 2, nics_per_host=2)
    ctx = Context(topo, finder_for(topo), tuple(mixed_jobs()), frozenset(), 0.0, 2)
    unique = Sincronia().decide(ctx).level
    first = max(unique, key=lambda j: unique[j])
    compressed = Sincronia(compress=True).decide(ctx).level
    assert compressed == {j: int(j == first) for j in unique}


def test_sincronia_ignores_gpu_intensity() -> None:
    topo = one_agg()
    small = ring("small", ["h0", "h2"], 1e9, compute_s=0.01)
    big = Job("big", (("h1", 8), ("h3", 8)), 10.0, 1e18, 0.0, ring("x", ["h1", "h3"], 4e9).flows)
    d = Sincronia().decide(ctx_for(topo, [small, big]))
    assert d.level["small"] > d.level["big"]


# --- TACCL* ------------------------------------------------------------------

def test_taccl_spreads_jobs_of_one_tor_pair_over_spines() -> None:
    topo = clos2(2, 2, 2, nics_per_host=1)
    a, b = ring("a", ["h0", "h2"], 1e9), ring("b", ["h1", "h3"], 1e9)
    d = Taccl().decide(ctx_for(topo, [a, b]))
    spine = {jid: {topo.links[int(path[1])].dst for path in paths if path is not None}
             for jid, paths in d.paths.items()}
    # both hops of a ring on one aggregation switch, the two rings on different ones
    assert len(spine["a"]) == len(spine["b"]) == 1 and spine["a"] != spine["b"]


def test_taccl_ranks_longer_paths_higher() -> None:
    topo = clos2(2, 2, 2, nics_per_host=1)
    local = ring("a-local", ["h0", "h1"], 8e9)  # more bytes, smaller id, 2 hops
    far = ring("b-far", ["h2", "h0"], 1e9)  # 4 hops
    d = Taccl().decide(ctx_for(topo, [local, far]))
    assert d.level == {"b-far": 1, "a-local": 0}
    assert [len(p) for p in d.paths["b-far"] if p is not None] == [4, 4]
    assert [len(p) for p in d.paths["a-local"] if p is not None] == [2, 2]


def test_taccl_breaks_distance_ties_by_bytes_times_hops() -> None:
    topo = clos2(2, 2, 2, nics_per_host=1)
    d = Taccl().decide(ctx_for(topo, [ring("a", ["h0", "h2"], 1e9),
                                      ring("b", ["h1", "h3"], 2e9)]))
    assert d.level == {"b": 1, "a": 0}


# --- CASSINI -----------------------------------------------------------------

def busy_disjoint(p_period: float, comm: float, offset: float) -> bool:
    """Two identical jobs with phases 0 and `offset`: are their busy windows disjoint?"""
    x = offset % p_period
    return comm - 1e-9 <= x <= p_period - comm + 1e-9


def test_cassini_interleaves_identical_jobs() -> None:
    topo = one_agg()
    # t_j = 5 GB / 100 Gbit/s = 0.4 s; period 1.4 s: duty cycle 29%
    a, b = ring("a", ["h0", "h2"], 0.4 * 100 * GBIT), ring("b", ["h1", "h3"], 0.4 * 100 * GBIT)
    ctx = ctx_for(topo, [a, b])
    p = profile(ctx, b)
    assert p.period == pytest.approx(1.4, rel=1e-4) and p.comm == pytest.approx(0.4, rel=1e-4)
    d = Cassini().decide(ctx)
    assert d.level == {} and d.paths == {}
    assert d.offset_s["a"] == 0.0
    assert 0.0 <= d.offset_s["b"] < p.period
    assert busy_disjoint(p.period, p.comm, d.offset_s["b"])


def test_cassini_offsets_only_new_jobs_against_running_ones() -> None:
    topo = one_agg()
    a, b = ring("a", ["h0", "h2"], 0.4 * 100 * GBIT), ring("b", ["h1", "h3"], 0.4 * 100 * GBIT)
    ctx = ctx_for(topo, [a, b], new={"b"})
    d = Cassini().decide(ctx)
    assert set(d.offset_s) == {"b"}
    p = profile(ctx, b)
    assert busy_disjoint(p.period, p.comm, d.offset_s["b"])
    assert Cassini().decide(ctx_for(topo, [a, b], new=set())) == Decisions()


def test_cassini_leaves_jobs_that_share_no_link_alone() -> None:
    topo = clos2(2, 2, 2, nics_per_host=1)
    a, b = ring("a", ["h0", "h1"], 5e9), ring("b", ["h2", "h3"], 5e9)
    assert Cassini().decide(ctx_for(topo, [a, b])).offset_s == {"a": 0.0, "b": 0.0}


def test_cassini_beats_ecmp_on_a_shared_link() -> None:
    topo = one_agg()
    jobs = [SimJob(ring(j, hosts, 0.4 * 100 * GBIT))
            for j, hosts in (("a", ["h0", "h2"]), ("b", ["h1", "h3"]))]
    config = SimConfig(horizon_s=30.0)
    ecmp = simulate(jobs, topo, make_policy("ecmp"), config).gpu_utilization
    cassini = simulate(jobs, topo, make_policy("cassini"), config).gpu_utilization
    assert ecmp == pytest.approx(1.0 / 1.8, rel=0.02)  # both send at once: 0.8 s each
    assert cassini > ecmp + 0.1


# --- all baselines -----------------------------------------------------------

def mixed_jobs() -> list[Job]:
    return [ring("j0", ["h0", "h2", "h1"], 2e9, 0.5, 0.3), ring("j1", ["h3", "h1"], 3e9),
            ring("j2", ["h0", "h1"], 1e9, 0.2), ring("j3", ["h2", "h3"], 5e8, 2.0, 0.5),
            Job("j4", (("h0", 8),), 1.0, 1e12, 0.0, ())]


@pytest.mark.parametrize("name", BASELINES)
def test_registered_and_deterministic(name: str) -> None:
    topo = clos2(2, 2, 2, nics_per_host=2)
    policy = make_policy(name)
    assert policy.name == name and name in POLICIES
    d1 = policy.decide(ctx_for(topo, mixed_jobs()))
    d2 = make_policy(name).decide(ctx_for(topo, list(reversed(mixed_jobs()))))
    assert same(d1, d2)
    ids = {j.id for j in mixed_jobs()}
    if name == "cassini":
        assert d1.level == {} and set(d1.offset_s) == ids
    else:
        assert set(d1.level) == ids
        assert sorted(d1.level.values()) == list(range(len(ids)))  # unique priorities


def test_taccl_paths_are_candidates_one_per_network_flow() -> None:
    topo = clos2(2, 2, 2, nics_per_host=2)
    ctx = ctx_for(topo, mixed_jobs())
    d = Taccl().decide(ctx)
    for job in mixed_jobs():
        net = [f for f in job.flows if f.src != f.dst]
        assert len(d.paths[job.id]) == len(net)
        for f, path in zip(net, d.paths[job.id], strict=True):
            cands = ctx.finder.candidates(f.src, f.dst, f.src_port, f.dst_port)
            assert path is not None and any(np.array_equal(path, c) for c in cands)


@pytest.mark.parametrize("name", BASELINES)
def test_simulate_tiny_scenario(name: str) -> None:
    topo = clos2(2, 2, 2, nics_per_host=1)
    ports = {h: 1 for h in topo.hosts}
    specs = [("r0", [("h0", 8), ("h2", 8)], 2e9, 0.0), ("r1", [("h1", 8), ("h3", 8)], 3e9, 0.0),
             ("r2", [("h0", 8), ("h3", 8), ("h1", 8)], 1e9, 2.0)]
    jobs = [SimJob(Job(j, tuple(hosts), 0.5, 1e12, 0.5, ring_allreduce(hosts, size, ports)),
                   arrival_s=at) for j, hosts, size, at in specs]
    res = simulate(jobs, topo, make_policy(name), SimConfig(horizon_s=20.0))
    assert res.policy == name and len(res.jobs) == 3
    assert 0.0 < res.gpu_utilization <= 1.0
