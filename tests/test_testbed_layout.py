"""The emulated testbed's pure parts: a scenario's fabric mapped onto the rig (what it
builds, what it refuses and why), and utilisation from iteration logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cruxd.errors import UsageError
from cruxd.scenario import load_scenario
from tests.paths import REPO
from tests.rig.testbed import Layout
from tests.rig.testbed_churn import (
    JobEvent,
    LinkDown,
    around,
    cluster_recovery,
    recovery,
    without_cable,
)
from tests.rig.testbed_metrics import busy, cluster_utilization, job_stats, window_of

FIG19 = REPO / "examples" / "testbed-fig19-rig.json"


def test_the_fig19_example_maps_onto_four_leaves_and_two_spines() -> None:
    lay = Layout.of(load_scenario(FIG19), scale=1e-3)
    assert (lay.leaves, lay.hosts_per_leaf, lay.spines) == (4, 3, 2)
    assert (lay.host_mbit, lay.uplink_mbit) == pytest.approx((400.0, 200.0))
    gpt = next(j for j in lay.jobs if j.id == "gpt-32")
    assert gpt.hosts == ("h0", "h3", "h6", "h9") and gpt.gpus == 32
    # a hop carries 2(K-1)/K of the model, scaled like the links: 2 * 31/32 * 5.2 MB
    assert gpt.hop_bytes == pytest.approx(2 * 31 / 32 * 5.2e6, rel=1e-6)
    assert gpt.model_bytes == pytest.approx(5.2e9)
    assert {h for j in lay.jobs for h in j.hosts} == {f"h{k}" for k in range(12)}


def test_the_multijob_example_puts_two_jobs_on_every_host_each_on_its_own_port() -> None:
    lay = Layout.of(load_scenario(REPO / "examples" / "testbed-multijob-rig.json"))
    assert (lay.leaves, lay.hosts_per_leaf, lay.spines) == (2, 2, 2)
    for host in ("h0", "h1", "h2", "h3"):
        jobs = lay.on_host(host)
        assert len(jobs) == 2 and sum(j.host_gpus[r] for j, r in jobs) == 8
    assert len({j.port for j in lay.jobs}) == len(lay.jobs)  # one ring port per job
    assert all(lay.leaf_of(a) != lay.leaf_of(b) for j in lay.jobs for a, b in j.hops)


def test_the_leaders_routes_name_the_spine_each_hop_was_planned_through() -> None:
    lay = Layout.of(load_scenario(FIG19), scale=1e-3)
    jobs = {"gpt-32": {"routes": [
        {"src_host": "h0", "peer_host": "h3", "hops": ["10.2.0.1", "10.3.1.2", "10.3.32.1"]},
        # spine 0 answering from its address on leaf 2's link: still spine 0
        {"src_host": "h3", "peer_host": "h6", "hops": ["10.2.3.1", "10.3.64.2", "10.3.64.1"]},
        {"src_host": "h6", "peer_host": "h9", "hops": []},  # not probed yet
        {"src_host": "h9", "peer_host": "h0", "hops": ["node:7", "node:8", "node:9"]},  # INT
        {"src_host": "h99", "peer_host": "h0", "hops": ["10.2.9.1", "10.3.1.2", "10.3.1.1"]},
    ]}, "bert-a": {"routes": [{"src_host": "h1", "peer_host": "h4"}]}}
    assert lay.planned_paths(jobs) == {"gpt-32": {
        (lay.host_ids[0], lay.host_ids[3]): lay.spine_ids[1],
        (lay.host_ids[3], lay.host_ids[6]): lay.spine_ids[0]}}


def _scenario(tmp_path: Path, topology: dict[str, object],
              jobs: list[dict[str, object]]) -> Path:
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"version": 1, "name": "s", "topology": topology, "jobs": jobs}))
    return p


def _ring(jid: str, hosts: list[str]) -> dict[str, object]:
    return {"id": jid, "hosts": hosts, "gpus_per_host": 4, "compute_s": 0.3,
            "pattern": "ring_allreduce", "bytes": 1e9}


@pytest.mark.parametrize(("topology", "jobs", "why"), [
    ({"builder": "testbed96"}, [_ring("a", ["h0", "h2"])], "one NIC link"),
    ({"builder": "double_sided", "hosts_per_pod": 2}, [_ring("a", ["h0", "h1"])],
     "two switch tiers"),
])
def test_what_the_rig_cannot_build_is_refused_with_the_reason(
        tmp_path: Path, topology: dict[str, object], jobs: list[dict[str, object]],
        why: str) -> None:
    with pytest.raises(UsageError, match=why):
        Layout.of(load_scenario(_scenario(tmp_path, topology, jobs)))


def _its(t0: float, n: int, period: float, compute: float) -> list[dict[str, float]]:
    return [{"t0": t0 + i * period, "end": t0 + (i + 1) * period, "compute_s": compute}
            for i in range(n)]


def test_utilisation_is_compute_over_wall_time_inside_the_window() -> None:
    a = [_its(0.0, 10, 2.0, 1.5), _its(0.0, 10, 2.0, 1.5)]  # 75 % busy
    b = [_its(1.0, 30, 0.5, 0.5)]  # never waits
    lo, hi = window_of({"a": a, "b": b}, warmup_s=2.0)
    assert (lo, hi) == (3.0, 16.0)  # b ends first
    sa, sb = job_stats(a, lo, hi), job_stats(b, lo, hi)
    assert sb.utilization == pytest.approx(1.0)
    assert busy(a[0], 4.0, 8.0) == pytest.approx(3.0)  # two whole computes
    assert sa.iteration_s == pytest.approx(2.0) and sa.iterations == 6
    assert sa.utilization == pytest.approx((0.5 + 6 * 1.5) / 13)  # a part, then 6 whole
    assert cluster_utilization({"a": sa, "b": sb}, {"a": 3, "b": 1}) == pytest.approx(
        (3 * sa.utilization + 1.0) / 4)


def test_link_down_parses_and_checks_its_cable() -> None:
    assert LinkDown.parse("1:0@12.5") == LinkDown(1, 0, 12.5)
    for bad in ("1:0", "a:0@1", "1:0@x", "-1:0@3", "1:0@-2", "1@3"):
        with pytest.raises(UsageError, match="--link-down"):
            LinkDown.parse(bad)
    LinkDown(3, 1, 10).check(leaves=4, spines=2, duration_s=40)
    with pytest.raises(UsageError, match=r"spines 0\.\.1"):
        LinkDown(0, 2, 10).check(leaves=4, spines=2, duration_s=40)
    with pytest.raises(UsageError, match="not inside"):
        LinkDown(0, 0, 40).check(leaves=4, spines=2, duration_s=40)


def _iterations(times: list[float], start: float = 0.0) -> list[dict[str, float]]:
    out, t = [], start
    for d in times:
        out.append({"t0": t, "end": t + d})
        t += d
    return out


def test_recovery_finds_the_return_to_the_new_steady_state() -> None:
    # 1 s iterations, a failure at t = 10.2, eight slow (2 s) iterations, then 1.2 s
    its = _iterations([1.0] * 10 + [2.0] * 8 + [1.2] * 20)
    r = recovery([its], t_down=10.2)
    assert r["before_s"] == 1.0 and r["steady_s"] == pytest.approx(1.2)
    # the first slow iteration starts at 10, the first steady one at 26; a run of five
    # must average within 10 % of 1.2 s from there on: from 26 exactly
    assert r["recovered_s"] == pytest.approx(26 - 10.2)
    # no disturbance at all: recovered from the failure on
    assert recovery([_iterations([1.0] * 40)], t_down=10.5)["recovered_s"] == 0.0
    # too few iterations after it to tell
    assert recovery([_iterations([1.0] * 12)], t_down=10.5)["recovered_s"] is None


def test_cluster_recovery_reads_the_settling_from_the_timeline() -> None:
    # 0.95 before a failure at 7.3 s, 0.80 for two bins, then 0.65 to the end: the
    # first 3-bin mean within 5 % of 0.65 starts at 12 s
    bins = [(t * 2.0, 0.95 if t < 4 else 0.80 if t < 6 else 0.65) for t in range(17)]
    assert cluster_recovery(bins, 7.3) == pytest.approx(12.0 - 7.3)
    # a dip that climbs back counts the same way
    dip = [(t * 2.0, 0.5 if 4 <= t < 7 else 0.9) for t in range(17)]
    assert cluster_recovery(dip, 7.3) == pytest.approx(14.0 - 7.3)
    flat = [(t * 2.0, 0.9) for t in range(17)]
    assert cluster_recovery(flat, 7.3) == pytest.approx(8.0 - 7.3)
    assert cluster_recovery(flat[:6], 7.3) is None  # too few bins after it


def test_without_cable_drops_both_directions_and_nothing_else() -> None:
    topo = load_scenario(REPO / "examples" / "testbed-fig19-rig.json").view.topology
    cut = without_cable(topo, "tor0", "agg0")
    gone = {(lk.src, lk.dst) for lk in topo.links} - {(lk.src, lk.dst) for lk in cut.links}
    assert gone == {("tor0", "agg0"), ("agg0", "tor0")}
    assert len(cut.links) == len(topo.links) - 2 and cut.nodes.keys() == topo.nodes.keys()


def test_arrivals_and_departures_come_from_the_scenario(tmp_path: Path) -> None:
    topo = {"builder": "clos2", "tors": 2, "aggs": 2, "hosts_per_tor": 2, "nics_per_host": 1}
    lay = Layout.of(load_scenario(_scenario(tmp_path, topo, [
        _ring("a", ["h0", "h2"]),
        {**_ring("b", ["h1", "h3"]), "arrival_s": 12.5, "iterations": 30}])))
    a, b = lay.jobs
    assert (a.arrival_s, a.iterations, a.churns) == (0.0, None, False)
    assert (b.arrival_s, b.iterations, b.churns) == (12.5, 30, True)


def test_a_job_present_for_part_of_the_window_weighs_its_part() -> None:
    a = [_its(0.0, 20, 1.0, 0.5)]  # there throughout, 50 % busy
    b = [_its(10.0, 5, 1.0, 1.0)]  # arrives at 10, leaves at 15, never waits
    lo, hi = window_of({"a": a, "b": b}, warmup_s=2.0, churn={"b"})
    assert (lo, hi) == (2.0, 20.0)  # b's start and end do not bound the window
    sa, sb = job_stats(a, lo, hi), job_stats(b, lo, hi)
    assert sb.present_s == pytest.approx(5.0) and sb.utilization == pytest.approx(1.0)
    assert sa.present_s == pytest.approx(18.0)
    # busy GPU-seconds over allocated ones: 2 GPUs of a for 18 s, 4 of b for 5 s
    assert cluster_utilization({"a": sa, "b": sb}, {"a": 2, "b": 4}) == pytest.approx(
        (2 * 18 * 0.5 + 4 * 5 * 1.0) / (2 * 18 + 4 * 5))
    # a bin the job is not in gives it no weight at all
    assert job_stats(b, 16.0, 18.0).present_s == 0.0


def test_around_reads_each_jobs_iterations_before_an_event_and_after_its_plan() -> None:
    # a: 1 s iterations, 1.5 s from 10 (the arrival) until the plan at 13, then 1 s again
    a = [_iterations([1.0] * 10 + [1.5] * 2 + [1.0] * 7)]
    b = [_iterations([0.5] * 16, start=10.0)]
    ev = around({"a": a, "b": b}, [JobEvent("b", "arrive", 10.0, decided_s=3.0)], 0.0, 20.0)
    assert len(ev) == 1 and ev[0]["at_s"] == 10.0 and ev[0]["decided_s"] == 3.0
    assert ev[0]["jobs"]["a"] == {"before_s": 1.0, "until_plan_s": 1.5, "after_s": 1.0}
    assert ev[0]["jobs"]["b"] == {"before_s": None, "until_plan_s": 0.5, "after_s": 0.5}
    # without a leader the event takes effect at once: a's slow iterations count
    ev = around({"a": a}, [JobEvent("b", "arrive", 10.0)], 0.0, 20.0)
    assert ev[0]["jobs"]["a"]["until_plan_s"] is None
    assert ev[0]["jobs"]["a"]["after_s"] == pytest.approx(1.0)  # median of 1.5, 1.5, 1 x 7
