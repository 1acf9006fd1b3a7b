"""Every shipped scenario runs with `cruxctl simulate FILE` as it stands, no flags; the
flagship testbed96 shows the contention it was built for. Files in examples/ that are
not scenarios must be read by something else that ships."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from cruxd.cli import cruxctl
from cruxd.scenario import bundled_names
from tests.paths import EXAMPLES, REPO

BUNDLED = REPO / "cruxd" / "data" / "scenarios"
DATA = (".json", ".yaml", ".yml")


def _doc(path: Path) -> Any:
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def _is_scenario(path: Path) -> bool:
    doc = _doc(path)
    return isinstance(doc, dict) and "jobs" in doc


SCENARIOS = sorted([p for p in EXAMPLES.iterdir() if p.suffix in DATA and _is_scenario(p)]
                   + sorted(BUNDLED.glob("*.json")))


def simulate(target: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    status = cruxctl.main(["simulate", target, "--json"])
    out = capsys.readouterr()
    assert status == 0, out.err
    doc: dict[str, Any] = json.loads(out.out)
    return doc


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_scenario_simulates_as_shipped(path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    doc = simulate(str(path), capsys)
    spec = _doc(path).get("simulate", {})
    if "horizon_s" in spec:
        assert doc["horizon_s"] == spec["horizon_s"]
    else:  # no horizon is only allowed when every job has its iterations
        assert all("iterations" in j for j in _doc(path)["jobs"])
    assert doc["results"] and {r["jobs"] for r in doc["results"]} == {len(_doc(path)["jobs"])}
    for r in doc["results"]:
        assert 0 < r["gpu_utilization"] <= 1, r["policy"]


def test_testbed96_shows_crux_gaining_over_ecmp(capsys: pytest.CaptureFixture[str]) -> None:
    # the embedded default of `cruxctl plan`: under ECMP two GPT channels share a ToR
    # uplink and outlast the compute they overlap; crux keeps them apart
    assert "testbed96" in bundled_names()
    results = {r["policy"]: r for r in simulate("testbed96", capsys)["results"]}
    ecmp, crux = results["ecmp"], results["crux-full"]
    assert crux["gpu_utilization"] > ecmp["gpu_utilization"]
    assert ecmp["max_slowdown"] > 1.05  # contention, not rounding
    slow = {j["job"]: j["slowdown"] for j in ecmp["per_job"]}
    assert slow["gpt-48"] == max(slow.values())
    assert all(math.isclose(j["slowdown"], 1.0, abs_tol=0.01) for j in crux["per_job"])


def test_the_multijob_rig_loses_a_tenth_to_ecmp_collisions_and_crux_recovers_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Two jobs on every host (each host's GPUs shared, each ring through one NIC): ECMP
    puts both GPTs on one spine, crux keeps them apart (bench/testbed.py runs it live)."""
    path = EXAMPLES / "testbed-multijob-rig.json"
    hosts = [h for j in _doc(path)["jobs"] for h in j["hosts"]]
    assert all(hosts.count(h) == 2 for h in hosts)
    results = {r["policy"]: r for r in simulate(str(path), capsys)["results"]}
    ecmp, crux = results["ecmp"]["gpu_utilization"], results["crux-full"]["gpu_utilization"]
    assert crux >= 1.10 * ecmp and crux >= 0.95, (ecmp, crux)
    slow = {j["job"]: j["slowdown"] for j in results["ecmp"]["per_job"]}
    assert slow["gpt-a"] > 1.1 and slow["gpt-b"] > 1.1  # the two GPTs share a spine


def test_examples_copy_of_testbed96_is_the_bundled_one() -> None:
    assert (EXAMPLES / "testbed96-colocation.json").read_bytes() == \
        (BUNDLED / "testbed96.json").read_bytes()


def test_every_other_data_file_is_read_by_a_scenario() -> None:
    # a JSON or YAML file in examples/ that simulate cannot run is a topology some scenario
    # names in topology.file (cruxd's leader.topology reads the same format)
    referenced = {(p.parent / _doc(p)["topology"]["file"]).resolve() for p in SCENARIOS
                  if isinstance(_doc(p)["topology"], dict) and "file" in _doc(p)["topology"]}
    others = {p.resolve() for p in EXAMPLES.iterdir() if p.suffix in DATA} \
        - {p.resolve() for p in SCENARIOS}
    assert others and others <= referenced, others - referenced
