"""Level-aware planning (issue 32): paths chosen again once the levels are known, and
jobs whose priorities tie free to be cut apart by compression."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from cruxd.model.jobs import Job, ring_allreduce
from cruxd.model.plan import Plan
from cruxd.model.view import ClusterView
from cruxd.scenario import load_scenario
from cruxd.scheduler.compression import compress_indexed
from cruxd.scheduler.planner import PlanConfig, plan
from cruxd.sim.policies import make_policy
from cruxd.sim.run import SimConfig, SimJob, simulate
from cruxd.topo.builders import clos2
from tests.paths import EXAMPLES

# 2 ToRs of 4 hosts, 2 aggregation switches, uplinks at 2:1
TOPO = clos2(2, 2, 4, nics_per_host=1, oversubscription=2.0)


def _job(jid: str, hosts: list[str], compute: float, nbytes: float, flops: float) -> Job:
    placed = tuple((h, 8) for h in hosts)
    return Job(jid, placed, compute, flops, 0.3,
               ring_allreduce(placed, nbytes, {h: 1 for h, _ in placed}), "ring_allreduce")


def _jobs() -> tuple[Job, ...]:
    """An intensive job with little traffic across the ToRs, and a weak one whose ring
    crosses them four times: two of its flows leave each ToR."""
    strong = _job("strong", ["h0", "h4"], 1.0, 2e8, 1e17)
    weak = _job("weak", ["h1", "h5", "h2", "h6"], 0.5, 2e9, 1e15)
    return strong, weak


def _uplink_users(p: Plan, job: str) -> Counter[int]:
    """How many of the job's flows take each ToR uplink (the first switch-to-switch hop)."""
    ups = [lk for i, lk in enumerate(TOPO.links) if lk.src.startswith("tor")
           and lk.dst.startswith("agg")]
    up_ids = {TOPO.links.index(lk) for lk in ups}
    return Counter(i for f in p.flows if f.job == job for i in f.path if i in up_ids)


def test_a_job_below_shares_the_intensive_jobs_links_instead_of_doubling_up() -> None:
    view = ClusterView(TOPO, _jobs())
    one = plan(view, PlanConfig(levels=1))
    two = plan(view, PlanConfig(levels=2))
    # one level: the weak job keeps off the intensive job's spine, two flows per uplink
    assert max(_uplink_users(one, "weak").values()) == 2
    # two levels: it is below the intensive job, so it takes that spine's leftovers
    level = {d.job: d.level for d in two.jobs}
    assert level["strong"] > level["weak"]
    assert max(_uplink_users(two, "weak").values()) == 1
    # and the simulator agrees that this is worth it
    util = {}
    for k in (1, 2):
        res = simulate([SimJob(j) for j in _jobs()], TOPO, make_policy("crux-full"),
                       SimConfig(horizon_s=10.0, window_s=1e9, levels=k))
        util[k] = res.gpu_utilization
    assert util[2] > util[1] * 1.05


def test_with_a_level_per_job_every_job_above_counts_at_its_rate() -> None:
    view = ClusterView(TOPO, _jobs())
    ideal = plan(view, PlanConfig(levels=1, ideal_levels=True))
    assert max(_uplink_users(ideal, "weak").values()) == 1


def test_one_level_is_the_first_selection_alone() -> None:
    """With K = 1 crux is paths only: the plan is the intensity-weighted selection."""
    view = ClusterView(TOPO, _jobs())
    p = plan(view, PlanConfig(levels=1))
    assert {d.level for d in p.jobs} == {0}
    assert p.cut_weight == 0.0


def test_tied_jobs_alternate_on_two_levels() -> None:
    """Fig. 19 at rig scale: four identical BERTs contend in a ring (a-b, b-c, c-d, d-a).
    Their priorities tie, so their order (by id) must not forbid the alternating cut."""
    sc = load_scenario(EXAMPLES / "testbed-fig19-rig.json")
    p = plan(sc.view, PlanConfig(levels=2))
    level = {d.job: d.level for d in p.jobs}
    links: dict[str, set[int]] = {}
    for f in p.flows:
        links.setdefault(f.job, set()).update(f.path)
    berts = sorted(j for j in level if j.startswith("bert"))
    sharing = [(a, b) for i, a in enumerate(berts) for b in berts[i + 1:] if links[a] & links[b]]
    assert len(sharing) >= 4
    assert all(level[a] != level[b] for a, b in sharing)


def test_free_edges_weigh_in_the_cut_without_ordering() -> None:
    hi, lo = np.array([0, 0, 1, 2]), np.array([1, 3, 2, 3])  # a 4-cycle a-b-c-d
    w = np.ones(4)
    order = np.arange(4)
    ordered = compress_indexed(4, hi, lo, w, 2, order, samples=10)
    free = compress_indexed(4, hi, lo, w, 2, order, samples=10, free=np.ones(4, dtype=bool))
    cut = lambda lv: int((lv[hi] != lv[lo]).sum())  # noqa: E731
    assert cut(ordered) == 2  # every order-respecting 2-cut of this DAG cuts two edges
    assert cut(free) == 4
    assert all(ordered[h] >= ordered[low] for h, low in zip(hi, lo, strict=True))


@pytest.mark.parametrize("levels", [2, 3])
def test_the_rig_example_at_few_levels_is_no_worse_than_taccl(levels: int) -> None:
    sc = load_scenario(EXAMPLES / "testbed-fig19-rig.json")
    jobs = [SimJob(j) for j in sc.view.jobs]
    util = {pol: simulate(jobs, sc.view.topology, make_policy(pol),
                          SimConfig(horizon_s=30.0, window_s=1e9, levels=levels)).gpu_utilization
            for pol in ("taccl*", "crux-full")}
    assert util["crux-full"] >= util["taccl*"] - 1e-9


def test_the_incremental_planner_keeps_the_first_selection_for_its_next_plan() -> None:
    """The level-aware rounds move the weak job's paths here; the incremental planner
    must give exactly plan() before and after the intensive job leaves and returns."""
    from cruxd.scheduler.incremental import IncrementalPlanner

    strong, weak = _jobs()
    config = PlanConfig(levels=2)
    inc = IncrementalPlanner()
    views = [(strong, weak), (weak,), (weak, strong), (strong, weak)]
    plans = [inc.plan(ClusterView(TOPO, v), config) for v in views]
    assert plans == [plan(ClusterView(TOPO, v), config) for v in views]
    assert max(_uplink_users(plans[0], "weak").values()) == 1  # the rounds did move it


def test_above_the_job_cap_the_first_selection_stands() -> None:
    view = ClusterView(TOPO, _jobs())
    capped = plan(view, PlanConfig(levels=2, level_aware_max_jobs=1))
    assert max(_uplink_users(capped, "weak").values()) == 2
    with pytest.raises(ValueError, match="level_aware_max_jobs"):
        PlanConfig(level_aware_max_jobs=-1)
