"""bench/optimality.py --joint: the joint brute-force optimum bounds crux-full and TACCL*
(their own paths and levels are among its candidates), and its shortcuts (components
simulated alone, merged memo keys) give what simulating everything together gives."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.paths import REPO

BENCH = REPO / "bench"


@pytest.fixture
def joint() -> Iterator[Any]:
    sys.path.insert(0, str(BENCH))
    try:
        import _joint_case

        yield _joint_case
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.slow
def test_the_optimum_bounds_the_policies(tmp_path: Path) -> None:
    out = tmp_path / "joint.json"
    run = subprocess.run([sys.executable, str(BENCH / "optimality.py"), "--joint", "--cases",
                          "2", "--levels", "2", "--oversubscription", "2", "--workers", "1",
                          "--worst", "1", "--json", str(out)],
                         capture_output=True, text=True, check=True, timeout=600)
    assert "crux-full (2 levels)" in run.stdout and "worst cases" in run.stdout
    assert run.stdout.startswith("$ ")
    doc = json.loads(out.read_text())
    assert len(doc["cases"]) == 2
    for case in doc["cases"]:
        for policy in ("crux-full", "taccl*"):
            ratio = case[f"u_{policy}"] / case["optimum"]
            assert 0 < ratio <= 1 + 1e-12, (case["seed"], policy, ratio)
        assert case["u_crux-ps-pa"] > 0  # one level per job: may beat the <= K optimum
    assert 0 < doc["summary"]["crux-full"]["min"] <= 1 + 1e-12


def test_components_sum_to_the_whole_simulation(joint: Any) -> None:
    from cruxd.sim.policies.crux import crux_full
    from cruxd.sim.policies.taccl import Taccl
    from cruxd.sim.run import SimConfig, SimJob, simulate

    jc = joint
    case = jc.make_case(1, 2.0)
    case.horizon = 20.0
    ev = jc.Evaluator(case)
    for policy in (crux_full(), Taccl()):
        whole = simulate([SimJob(j) for j in case.jobs], case.topo, policy,
                         SimConfig(horizon_s=case.horizon, window_s=1e9, levels=2))
        d = jc.policy_decisions(case, policy, 2)
        parts = ev.utilisation({j.id: tuple(d.paths[j.id]) for j in case.jobs}, d.level)
        assert parts == pytest.approx(whole.gpu_utilization, rel=1e-12)


def test_merged_memo_keys_change_nothing(joint: Any) -> None:
    jc = joint
    case = jc.make_case(1, 2.0)
    case.horizon = 10.0
    merged, plain = jc.Evaluator(case), jc.Evaluator(case, merge=False)
    ids = [j.id for j in case.jobs]
    combos = list(itertools.product(*jc.spine_options(case)))
    for combo in combos[:2] + combos[-2:]:  # the last ones mirror the first ones
        paths = dict(zip(ids, combo, strict=True))
        assert merged.best(paths, 2)[0] == pytest.approx(plain.best(paths, 2)[0], rel=1e-9)
    assert merged.simulations < plain.simulations
