"""Priority assignment (seed §4.2): the worked examples of Fig. 11 and Fig. 12."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cruxd.scenario import load_scenario
from cruxd.scheduler import PlanConfig, plan
from cruxd.scheduler.pairwise import busy_time, low_share, pair_gains, timing
from cruxd.scheduler.priority import assign, tie_groups
from tests.paths import EXAMPLES


def test_fig11_link_times_match_the_seed_timeline() -> None:
    # Seed: prioritising job 1, the link carries job 1 for 6 s and job 2 for 3 s of
    # the 12 s shown; prioritising job 2, 4 s and 6 s.
    job1, job2 = timing(2.0, 0.0, 2.0), timing(1.0, 0.0, 1.0)
    window = np.array(12.0)
    assert busy_time(job1, window) == 6.0
    assert low_share(job1, job2, window) == 3.0
    assert busy_time(job2, window) == 6.0
    assert low_share(job2, job1, window) == 4.0


def test_fig11_k_is_one_and_a_half() -> None:
    sc = load_scenario(EXAMPLES / "fig11-iteration-time.json")
    p = plan(sc.view, sc.config)
    assert p.reference_job == "job1"  # the most traffic per iteration
    assert p.job("job1").intensity == pytest.approx(p.job("job2").intensity)
    assert p.job("job1").k == 1.0
    assert p.job("job2").k == pytest.approx(1.5)
    assert p.job("job2").rank == 0  # the shorter iteration wins
    assert p.job("job2").level > p.job("job1").level


def test_fig12_the_job_that_cannot_overlap_wins() -> None:
    sc = load_scenario(EXAMPLES / "fig12-overlap.json")
    p = plan(sc.view, sc.config)
    assert p.job("job1").intensity == pytest.approx(p.job("job2").intensity)
    assert p.job("job2").rank == 0
    assert p.job("job1").k < 1.0
    assert p.job("job2").level > p.job("job1").level


def test_fig12_swapping_the_reference_keeps_the_order() -> None:
    sc = load_scenario(EXAMPLES / "fig12-overlap.json")
    p = plan(sc.view, PlanConfig(levels=2, reference_job="job1"))
    assert p.reference_job == "job1"
    assert p.job("job2").rank == 0 and p.job("job2").k > 1.0


def test_identical_jobs_get_k_one() -> None:
    ids = ["a", "b", "c"]
    one = np.ones(3)
    pr = assign(ids, one * 5, one, one * 0.5, one * 0.4, one * 100)
    assert np.allclose(pr.k, 1.0)
    assert sorted(pr.rank.tolist()) == [0, 1, 2]
    assert pr.rank.tolist() == [0, 1, 2]  # ties broken by id


def test_jobs_without_network_rank_first_and_keep_k_one() -> None:
    ids = ["net", "local"]
    pr = assign(ids, np.array([5.0, np.inf]), np.ones(2), np.zeros(2), np.array([0.5, 0.0]),
                np.array([1e9, 0.0]))
    assert pr.k.tolist() == [1.0, 1.0]
    assert pr.rank.tolist() == [1, 0]
    assert pr.reference == 0


def test_unknown_reference_is_refused() -> None:
    with pytest.raises(ValueError, match="not among"):
        assign(["a"], np.ones(1), np.ones(1), np.zeros(1), np.ones(1), np.ones(1),
               reference="zz")


durations = st.floats(0.05, 5.0)
overlaps = st.floats(0.0, 1.0)


@given(c1=durations, o1=overlaps, t1=durations, c2=durations, o2=overlaps, t2=durations)
def test_priority_helps_and_gains_are_bounded(c1: float, o1: float, t1: float, c2: float,
                                              o2: float, t2: float) -> None:
    ref, job = timing(c1, o1, t1), timing([c2], [o2], [t2])
    gain, loss = pair_gains(ref, job)
    window = 3.0 * max(float(ref.period), float(job.period[0]))
    # going first never hurts, and nobody sends more than the window allows
    assert gain[0] >= -1e-9 and loss[0] >= -1e-9
    assert gain[0] <= window + 1e-9 and loss[0] <= window + 1e-9


@given(c1=durations, o1=overlaps, t1=durations, c2=durations, o2=overlaps, t2=durations,
       scale=st.floats(0.1, 10.0))
def test_k_is_invariant_to_the_time_unit(c1: float, o1: float, t1: float, c2: float, o2: float,
                                         t2: float, scale: float) -> None:
    g1, l1 = pair_gains(timing(c1, o1, t1), timing([c2], [o2], [t2]))
    g2, l2 = pair_gains(timing(c1 * scale, o1, t1 * scale),
                        timing([c2 * scale], [o2], [t2 * scale]))
    assert g2[0] == pytest.approx(g1[0] * scale, rel=1e-6, abs=1e-6)
    assert l2[0] == pytest.approx(l1[0] * scale, rel=1e-6, abs=1e-6)


# --- declared figures cannot buy priority (issue 17) ------------------------------------


@given(st.lists(st.tuples(st.floats(1e9, 1e18), st.floats(0.01, 2.0), st.booleans()),
                min_size=2, max_size=8))
def test_declared_jobs_rank_after_every_measured_job(jobs: list[tuple[float, float, bool]]
                                                     ) -> None:
    ids = [f"j{i}" for i in range(len(jobs))]
    intensity = np.array([w for w, _, _ in jobs])
    comm = np.array([c for _, c, _ in jobs])
    declared = np.array([d for _, _, d in jobs])
    one = np.ones(len(jobs))
    pr = assign(ids, intensity, one, one * 0.5, comm, comm * 1e9, declared=declared)
    measured_ranks = pr.rank[~declared]
    if len(measured_ranks) and declared.any():
        assert pr.rank[declared].min() > measured_ranks.max()
    # within each group the order is what priority alone gives
    plain = assign(ids, intensity, one, one * 0.5, comm, comm * 1e9)
    for group in (~declared, declared):
        members = np.flatnonzero(group)
        assert sorted(members, key=lambda i: pr.rank[i]) == \
            sorted(members, key=lambda i: plain.rank[i])


@given(st.lists(st.floats(0.0, 1e6), min_size=1, max_size=30), st.floats(0.0, 0.5))
def test_tie_groups_keep_the_order_and_the_tolerance(values: list[float], tol: float) -> None:
    v = np.array(values)
    g = tie_groups(v, tol)
    for i in range(len(v)):
        for j in range(len(v)):
            if v[i] > v[j]:
                assert g[i] <= g[j]  # a larger value never ranks in a later group
            if g[i] == g[j]:  # one group spans less than the tolerance
                assert min(v[i], v[j]) >= max(v[i], v[j]) * (1 - tol) - 1e-9
    if tol == 0.0:
        assert all((g[i] == g[j]) == (v[i] == v[j]) for i in range(len(v))
                   for j in range(len(v)))


def test_noise_within_the_tolerance_does_not_order_equal_jobs() -> None:
    # four equal jobs measured with a few percent of noise: by P_j alone the noise
    # decides; with the tolerance the ids do, whatever the noise
    ids = ["d", "b", "a", "c"]
    intensity = np.array([1.03, 0.98, 1.0, 1.05])
    ones, zeros = np.ones(4), np.zeros(4)
    args = (ids, intensity, ones, zeros, ones * 0.1, ones)
    noisy = assign(*args).rank
    assert [ids[i] for i in np.argsort(noisy)] == ["c", "d", "a", "b"]
    tied = assign(*args, tie_tolerance=0.1).rank
    assert [ids[i] for i in np.argsort(tied)] == ["a", "b", "c", "d"]
    # a job clearly above the others still leads
    intensity[1] = 1.5
    assert [ids[i] for i in np.argsort(assign(*args, tie_tolerance=0.1).rank)] == \
        ["b", "a", "c", "d"]
