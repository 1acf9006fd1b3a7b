"""The simulator: the seed's numbers, conservation, priority and fairness invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cruxd.model.jobs import Job, ring_allreduce
from cruxd.scenario import load_scenario
from cruxd.sim.policies import Fixed, make_policy
from cruxd.sim.rates import allocate
from cruxd.sim.run import SimConfig, SimJob, simulate
from cruxd.topo import clos2
from tests.paths import EXAMPLES


def _fig(name: str, phase: str = "compute") -> tuple[list[SimJob], object]:
    sc = load_scenario(EXAMPLES / name)
    return [SimJob(j, start_phase=phase) for j in sc.view.jobs], sc.view.topology


@pytest.mark.parametrize(("levels", "expected"), [
    ({"job1": 1, "job2": 0}, 0.375),  # job 1 first: 37.5 % over the first 12 s
    ({"job1": 0, "job2": 1}, 0.417),  # job 2 first: 41.7 %
])
def test_fig11_utilisation(levels: dict[str, int], expected: float) -> None:
    jobs, topo = _fig("fig11-iteration-time.json", "comm")
    r = simulate(jobs, topo, Fixed(levels), SimConfig(horizon_s=12.0))  # type: ignore[arg-type]
    assert r.gpu_utilization == pytest.approx(expected, rel=0.01)


def test_fig11_timeline_matches_the_seed() -> None:
    jobs, topo = _fig("fig11-iteration-time.json", "comm")
    r = simulate(jobs, topo, Fixed({"job1": 1, "job2": 0}), SimConfig(horizon_s=12.0))  # type: ignore[arg-type]
    busy = {j.job: j.busy_gpu_s / j.gpus for j in r.jobs}
    # the seed: job 1's GPUs idle 6 s, job 2's idle 9 s of the 12
    assert busy["job1"] == pytest.approx(6.0, abs=0.01)
    assert busy["job2"] == pytest.approx(3.0, abs=0.01)


def test_fig12_the_job_that_cannot_overlap_should_go_first() -> None:
    jobs, topo = _fig("fig12-overlap.json")
    cfg = SimConfig(horizon_s=120.0)
    one_first = simulate(jobs, topo, Fixed({"job1": 1, "job2": 0}), cfg)  # type: ignore[arg-type]
    two_first = simulate(jobs, topo, Fixed({"job1": 0, "job2": 1}), cfg)  # type: ignore[arg-type]
    crux = simulate(jobs, topo, make_policy("crux-full"), cfg)  # type: ignore[arg-type]
    assert two_first.gpu_utilization > one_first.gpu_utilization
    assert crux.gpu_utilization == pytest.approx(two_first.gpu_utilization)


def _small_cluster(seed: int, n: int = 4) -> tuple[list[SimJob], object]:
    rng = np.random.default_rng(seed)
    topo = clos2(2, 2, 3, nics_per_host=1)
    hosts = topo.hosts
    jobs = []
    for k in range(n):
        members = [hosts[int(i)] for i in rng.choice(len(hosts), 2, replace=False)]
        placed = tuple((h, 4) for h in members)
        flows = ring_allreduce(placed, float(rng.uniform(1e8, 2e9)), {h: 1 for h in members})
        compute = float(rng.uniform(0.1, 1.0))
        jobs.append(SimJob(Job(f"j{k}", placed, compute, 8 * compute * 1e14,
                               float(rng.uniform(0, 0.9)), flows, "ring_allreduce"),
                           arrival_s=float(k), iterations=float(rng.integers(5, 40))))
    return jobs, topo


@pytest.mark.parametrize("policy", ["ecmp", "crux-full", "crux-pa"])
def test_bytes_are_conserved(policy: str) -> None:
    jobs, topo = _small_cluster(1)
    r = simulate(jobs, topo, make_policy(policy), SimConfig(window_s=1e9))  # type: ignore[arg-type]
    # every job finished its budget, and the links carried exactly its bytes on its paths
    for rec, s in zip(sorted(r.jobs, key=lambda j: j.job), sorted(jobs, key=lambda s: s.job.id),
                      strict=True):
        assert rec.iterations == pytest.approx(s.iterations)
    hops = {s.job.id: 0.0 for s in jobs}
    for s in jobs:
        for f in s.job.flows:
            hops[s.job.id] += f.bytes
    # host uplinks carry each flow's bytes exactly once per iteration
    host_up = sum(r.link_bytes[i] for h in topo.hosts for i in topo.uplinks(h))
    expected = sum(hops[s.job.id] * s.iterations for s in jobs)
    assert host_up == pytest.approx(expected, rel=1e-6)


def test_same_seed_same_run() -> None:
    jobs, topo = _small_cluster(3)
    a = simulate(jobs, topo, make_policy("crux-full"), SimConfig(seed=5, window_s=1e9))  # type: ignore[arg-type]
    b = simulate(jobs, topo, make_policy("crux-full"), SimConfig(seed=5, window_s=1e9))  # type: ignore[arg-type]
    assert a.summary() == b.summary()
    assert np.array_equal(a.link_bytes, b.link_bytes)


def test_extrapolation_agrees_with_exact_simulation() -> None:
    jobs, topo = _small_cluster(7, n=3)
    long = [SimJob(s.job, arrival_s=0.0) for s in jobs]
    cfg_exact = SimConfig(horizon_s=600.0, window_s=1e9)
    cfg_extra = SimConfig(horizon_s=600.0, window_s=20.0, window_periods=5)
    for name in ("ecmp", "crux-full"):
        exact = simulate(long, topo, make_policy(name), cfg_exact)  # type: ignore[arg-type]
        extra = simulate(long, topo, make_policy(name), cfg_extra)  # type: ignore[arg-type]
        assert extra.gpu_utilization == pytest.approx(exact.gpu_utilization, rel=0.03)


@st.composite
def allocations(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = draw(st.integers(1, 6))
    links = draw(st.integers(1, 5))
    weights = np.array([[draw(st.sampled_from([0.0, 0.0, 1.0, 2.0, 4.0])) for _ in range(links)]
                        for _ in range(n)])
    for i in range(n):
        if not weights[i].any():
            weights[i, draw(st.integers(0, links - 1))] = 1.0
    cap = np.array([draw(st.floats(1.0, 100.0)) for _ in range(links)])
    level = np.array([draw(st.integers(0, 2)) for _ in range(n)])
    return weights, cap, level


@given(allocations())
def test_rates_are_feasible_strict_and_max_min_fair(case: tuple) -> None:  # type: ignore[type-arg]
    weights, cap, level = case
    rate = allocate(weights, cap, level)
    assert np.all(rate >= 0) and np.all(np.isfinite(rate))
    load = rate @ weights
    assert np.all(load <= cap * (1 + 1e-9))  # no link over capacity
    for i in range(len(rate)):
        # certificate: a link of i that is full counting only levels >= i's, on which
        # no entity of i's level gets a higher rate (max-min fair, strict priority)
        at_or_above = level >= level[i]
        fills = (rate * at_or_above) @ weights >= cap * (1 - 1e-9)
        mine = weights[i] > 0
        ok = False
        for e in np.flatnonzero(fills & mine):
            peers = (level == level[i]) & (weights[:, e] > 0)
            if rate[i] >= rate[peers].max() * (1 - 1e-9):
                ok = True
        assert ok, (i, rate, load)


def test_higher_level_is_served_first() -> None:
    rate = allocate(np.array([[1.0], [1.0]]), np.array([10.0]), np.array([0, 1]))
    assert rate.tolist() == [0.0, 10.0]
    rate = allocate(np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]), np.array([10.0, 4.0]),
                    np.array([0, 0, 0]))
    assert rate.tolist() == pytest.approx([8.0, 2.0, 2.0])


def test_crux_fair_keeps_the_starved_job_above_its_floor() -> None:
    from cruxd.model.jobs import FlowSpec
    from cruxd.model.topology import TopologyBuilder

    b = TopologyBuilder("one-link")
    for h in ("a1", "a2", "b1", "b2"):
        b.host(h, 8)
    b.switch("s1", 1)
    b.switch("s2", 1)
    for h in ("a1", "a2"):
        b.link(h, "s1", 100)
    for h in ("b1", "b2"):
        b.link(h, "s2", 100)
    b.link("s1", "s2", 8)
    topo = b.build()
    # the intensive job keeps the 1 GB/s link busy 91 % of the time
    big = Job("big", (("a1", 8), ("b1", 8)), 0.1, 1e16, 0.0, (FlowSpec("a1", "b1", 1e9),))
    small = Job("small", (("a2", 2), ("b2", 2)), 1.0, 1e14, 0.0, (FlowSpec("a2", "b2", 5e8),))
    jobs = [SimJob(big), SimJob(small)]
    cfg = SimConfig(horizon_s=1200.0)
    full = simulate(jobs, topo, make_policy("crux-full"), cfg)
    fair = simulate(jobs, topo, make_policy("crux-fair"), cfg)
    assert full.worst_throughput_ratio < 0.35  # strict priority squeezes the small job
    assert fair.worst_throughput_ratio >= 0.5
    ratio = {j.job: j.throughput_ratio for j in fair.jobs}
    assert ratio["big"] > ratio["small"]  # the intensive job still leads


def test_a_sliver_of_bytes_below_float_resolution_does_not_stall() -> None:
    # at t ~ 6.6e4 s the float spacing is ~7e-12 s; 1.5e-9 of a collective at 286
    # collectives/s takes 5e-12 s, which once left the event loop spinning forever
    from cruxd.sim.engine import Engine, JobState

    t0 = 66000.123456
    eng = Engine(compute_s=np.array([0.5]), overlap=np.array([0.0]), gpus=np.array([8.0]),
                 m_bytes=np.array([[1e9]]), mean_flow=np.array([1e9]),
                 capacity=np.array([286e9]), level=np.array([0]), alpha=np.array([0.0]),
                 budget=np.array([np.inf]))
    state = JobState(start=t0 - 0.6, comm_at=t0 - 0.1, remaining=1.478e-9, begin=0.0)
    res = eng.run([state], t0, t0 + 2.0)
    assert res.end == t0 + 2.0
    assert res.iterations[0] >= 2


@given(allocations(), st.lists(st.integers(0, 4), min_size=1, max_size=6))
def test_links_alike_once_each_give_the_same_rates_bit_for_bit(
        case: tuple, copies: list[int]) -> None:  # type: ignore[type-arg]
    """The engine solves over distinct links only (`Engine._distinct_links`): repeating a
    link, same capacity and same weights, must not change a rate, not even by rounding."""
    weights, cap, level = case
    extra = [c % weights.shape[1] for c in copies]
    more = allocate(np.hstack([weights, weights[:, extra]]), np.concatenate([cap, cap[extra]]),
                    level)
    assert np.array_equal(allocate(weights, cap, level), more)


def test_an_engine_with_links_alike_runs_as_one_without_them() -> None:
    from cruxd.sim.engine import Engine, initial_state

    def run(m_bytes: np.ndarray, capacity: np.ndarray) -> tuple[list[float], float]:
        eng = Engine(compute_s=np.array([0.3, 0.5, 0.4]), overlap=np.array([0.0, 0.5, 0.2]),
                     gpus=np.array([8.0, 16.0, 8.0]), m_bytes=m_bytes,
                     mean_flow=np.array([1e9, 2e9, 1e9]), capacity=capacity,
                     level=np.array([0, 0, 1]), alpha=np.array([1e-5] * 3),
                     budget=np.array([np.inf] * 3))
        states = [initial_state(0.0, c, o, "compute") for c, o in ((0.3, 0.0), (0.5, 0.5),
                                                                     (0.4, 0.2))]
        res = eng.run(states, 0.0, 20.0)
        return res.iterations.tolist(), float(res.busy.sum())
    m = np.array([[1e9, 2e9, 0.0], [2e9, 2e9, 4e9], [0.0, 1e9, 1e9]])
    cap = np.array([12.5e9, 12.5e9, 25e9])
    # the second link twice over, and the first three times: the same run
    twice = run(np.hstack([m, m[:, [1, 0, 0]]]), np.concatenate([cap, cap[[1, 0, 0]]]))
    assert twice == run(m, cap)
