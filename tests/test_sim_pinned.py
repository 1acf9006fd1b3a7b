"""The simulator replaying given paths (cruxd/sim/policies/pinned.py)."""

from __future__ import annotations

import pytest

from cruxd.errors import PlanningError
from cruxd.scenario import load_scenario
from cruxd.scenario.simulation import simulation_of
from cruxd.sim.policies.pinned import Pinned
from cruxd.sim.run import simulate
from tests.paths import EXAMPLES

RIG = EXAMPLES / "testbed-fig19-rig.json"
BERTS = {"bert-a": ("h1", "h4"), "bert-b": ("h5", "h8"), "bert-c": ("h7", "h10"),
         "bert-d": ("h11", "h2")}
GPT = ("h0", "h3", "h6", "h9")


def run(bert_spine: str, levels: dict[str, int] | None = None) -> dict[str, float]:
    """GPT's ring on agg0, every BERT on `bert_spine`; per-job utilisation."""
    via = {"gpt-32": {(a, b): "agg0" for a, b in zip(GPT, GPT[1:] + GPT[:1], strict=True)}}
    for job, (a, b) in BERTS.items():
        via[job] = {(a, b): bert_spine, (b, a): bert_spine}
    sc = load_scenario(RIG)
    jobs, settings = simulation_of(sc, policies=["ecmp"], horizon_s=30)
    res = simulate(jobs, sc.view.topology, Pinned(via, levels=levels), settings.config)
    return {r.job: r.busy_gpu_s / (r.gpus * r.active_s) for r in res.jobs}


def test_the_given_paths_decide_who_collides() -> None:
    apart, together = run("agg1"), run("agg0")
    # apart, GPT shares no uplink with a BERT; on its spine it is slowed by all four
    assert apart["gpt-32"] > together["gpt-32"] + 0.1
    assert all(apart[j] > together[j] for j in BERTS)


def test_a_switch_off_every_shortest_path_is_an_error() -> None:
    sc = load_scenario(RIG)
    jobs, settings = simulation_of(sc, policies=["ecmp"], horizon_s=5)
    with pytest.raises(PlanningError, match="crosses tor3"):
        simulate(jobs, sc.view.topology, Pinned({"bert-a": {("h1", "h4"): "tor3"}}),
                 settings.config)


def test_given_levels_are_applied_as_they_ran() -> None:
    # all on one spine: GPT on top takes its bursts whole, and the BERTs wait for them
    top, bottom = run("agg0", {"gpt-32": 2}), run("agg0", {j: 2 for j in BERTS})
    assert top["gpt-32"] > run("agg0")["gpt-32"] > bottom["gpt-32"]
    assert all(top[j] < bottom[j] for j in BERTS)
