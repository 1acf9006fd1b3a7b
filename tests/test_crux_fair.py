"""crux-fair's throughput floor: no job's lifetime throughput below half of standalone,
for most of crux-full's utilisation gain over ECMP (cruxd/sim/policies/crux.py)."""

from __future__ import annotations

import pytest

from cruxd.model.jobs import Job
from cruxd.model.paths import finder_for
from cruxd.sim.metrics import SimResult
from cruxd.sim.policies import make_policy
from cruxd.sim.policies.base import Context
from cruxd.sim.policies.crux import crux_fair, crux_full
from cruxd.sim.run import SimConfig, simulate
from cruxd.sim.trace import DAY_S, trace_jobs
from cruxd.topo.builders import clos2, trace_clos

FLOOR = 0.5


def _run(tors: int, aggs: int, jobs: int, days: float, bytes_scale: float,
         seed: int) -> dict[str, SimResult]:
    topo = trace_clos(tors=tors, aggs=aggs)
    trace = trace_jobs(topo, jobs=jobs, days=days, seed=seed, bytes_scale=bytes_scale,
                       placement="none", min_period_s=3.0, max_gpus=128)
    # bench/simulate.py's trace windows; crux-fair re-plans on its own clock
    cfg = SimConfig(horizon_s=days * DAY_S, seed=seed, window_s=5.0, window_periods=3.0)
    return {p: simulate(trace, topo, make_policy(p), cfg)
            for p in ("ecmp", "crux-full", "crux-fair")}


# 256 GPUs, 6 h, 150 jobs. The lift rule on the last three epochs' throughput, shared
# top level and planned paths missed the floor on both (worst 0.00 and 0.44).
@pytest.mark.parametrize(("tors", "aggs", "jobs", "days", "bytes_scale", "seed"), [
    (16, 8, 150, 0.25, 4.0, 8),
    (16, 8, 150, 0.25, 4.0, 4),
])
def test_the_floor_holds_on_a_trace_slice(tors: int, aggs: int, jobs: int, days: float,
                                          bytes_scale: float, seed: int) -> None:
    r = _run(tors, aggs, jobs, days, bytes_scale, seed)
    ecmp, full, fair = r["ecmp"], r["crux-full"], r["crux-fair"]
    # the slice means something: crux-full's strict priorities starve a job below it
    assert full.worst_throughput_ratio < FLOOR
    assert fair.worst_throughput_ratio >= FLOOR
    assert full.gpu_utilization > ecmp.gpu_utilization
    gain = fair.gpu_utilization - ecmp.gpu_utilization
    assert gain >= 0.95 * (full.gpu_utilization - ecmp.gpu_utilization)


def _ctx(jobs: tuple[Job, ...], now: float, throughput: dict[str, float],
         new: frozenset[str] = frozenset()) -> Context:
    topo = clos2(2, 1, 1)
    return Context(topo, finder_for(topo, 8), jobs, new, now, 8, throughput)


def test_the_lift_margin_shrinks_with_age() -> None:
    jobs = tuple(Job(j, (("h0", 8),), 0.1, 1e12, 0.0, ()) for j in "abc")
    policy = crux_fair()
    assert policy.throughput_window is None  # it judges lifetime throughput, as the metric
    # unmeasured (first epoch): left to the plan
    assert policy.lift(_ctx(jobs, 0.0, {}, frozenset("abc"))) == set()
    # 100 s old: 0.9 is only 40 s ahead of the floor, short of the 150 s that 300 s
    # starved would cost; 0.45 is below it
    assert policy.lift(_ctx(jobs, 100.0, {"a": 0.9, "b": 0.45, "c": 2.0})) == {"a", "b"}
    # 10,000 s old: 0.52 is 200 s ahead, enough; 0.51 (100 s) is not
    assert policy.lift(_ctx(jobs, 10_000.0, {"a": 0.52, "b": 0.51, "c": 2.0})) == {"b"}
    # a job that left and came back under the same id starts afresh
    assert policy.lift(_ctx(jobs, 10_100.0, {"a": 0.9}, frozenset("a"))) == {"a"}


def test_crux_full_has_no_floor() -> None:
    full = crux_full()
    assert full.floor is None
    assert full.throughput_window == 3  # what the simulator always handed over
