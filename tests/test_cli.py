"""cruxctl as a person runs it: a real process, its exit status, stdout and stderr."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cruxd.scenario import bundled_names
from tests.cli_errors import one_error_line
from tests.paths import EXAMPLES, REPO

MODULE = [sys.executable, "-m", "cruxd.cli.cruxctl"]
_script = shutil.which("cruxctl", path=str(Path(sys.executable).parent))
SCRIPT = [_script] if _script else None
BUNDLED = REPO / "cruxd" / "data" / "scenarios" / "testbed96.json"
JOB_KEYS = {"job", "intensity", "k", "rank", "level", "dscp", "traffic_class"}


def cruxctl(*args: str, cwd: Path, launcher: list[str] = MODULE
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*launcher, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, check=False)


def plan_json(*args: str, cwd: Path) -> dict[str, Any]:
    run = cruxctl("plan", *args, "--json", cwd=cwd)
    assert run.returncode == 0, run.stderr
    out: dict[str, Any] = json.loads(run.stdout)
    return out


def _is_scenario(path: Path) -> bool:
    text = path.read_text()
    doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    return isinstance(doc, dict) and "jobs" in doc


EXAMPLE_SCENARIOS = sorted(p for p in EXAMPLES.iterdir()
                           if p.suffix in (".json", ".yaml", ".yml") and _is_scenario(p))


@pytest.fixture(params=["module", "script"])
def launcher(request: pytest.FixtureRequest) -> list[str]:
    if request.param == "script":
        if SCRIPT is None:
            pytest.skip("no cruxctl script next to this Python")
        return SCRIPT
    return MODULE


def test_plan_without_scenario_plans_the_bundled_default(tmp_path: Path) -> None:
    run = cruxctl("plan", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "bundled" in run.stderr and "testbed96" in run.stderr
    assert "Jobs by priority" in run.stdout
    for job in json.loads(BUNDLED.read_text())["jobs"]:
        assert job["id"] in run.stdout


def test_plan_json_is_complete_and_consistent(tmp_path: Path) -> None:
    out = plan_json("testbed96", cwd=tmp_path)
    assert {"version", "scenario", "topology", "plan"} <= out.keys()
    assert out["scenario"] == "testbed96"
    jobs, levels = out["plan"]["jobs"], out["plan"]["levels"]
    file_jobs = json.loads(BUNDLED.read_text())["jobs"]
    assert levels == 3
    assert sorted(j["job"] for j in jobs) == sorted(j["id"] for j in file_jobs)
    assert [j["rank"] for j in jobs] == list(range(len(jobs)))
    for j in jobs:
        assert j.keys() >= JOB_KEYS
        assert 0 <= j["level"] <= levels - 1
        assert j["traffic_class"] == j["dscp"] << 2


def test_levels_flag_overrides_the_scenario(tmp_path: Path) -> None:
    out = plan_json("testbed96", "--levels", "2", cwd=tmp_path)
    assert out["plan"]["levels"] == 2
    assert {j["level"] for j in out["plan"]["jobs"]} <= {0, 1}
    assert len({j["dscp"] for j in out["plan"]["jobs"]}) <= 2


def test_examples_include_scenarios() -> None:
    assert {p.suffix for p in EXAMPLE_SCENARIOS} >= {".json"} and len(EXAMPLE_SCENARIOS) >= 4


@pytest.mark.parametrize("example", EXAMPLE_SCENARIOS, ids=lambda p: p.name)
def test_every_example_scenario_plans(tmp_path: Path, example: Path) -> None:
    out = plan_json(str(example), cwd=tmp_path)
    text = example.read_text()
    doc = json.loads(text) if example.suffix == ".json" else yaml.safe_load(text)
    assert sorted(j["job"] for j in out["plan"]["jobs"]) == sorted(j["id"] for j in doc["jobs"])
    assert out["source"] == str(example)


def test_example_copy_of_the_bundled_scenario_is_identical() -> None:
    assert (EXAMPLES / "testbed96-colocation.json").read_bytes() == BUNDLED.read_bytes()


BASE = {"topology": {"builder": "clos2", "tors": 2, "aggs": 2, "hosts_per_tor": 2},
        "jobs": [{"id": "j0", "hosts": ["h0", "h7"], "compute_s": 0.5, "bytes": 1e9}]}


@pytest.mark.parametrize(("name", "text", "json_path"), [
    pytest.param("bad.json", json.dumps(BASE), "$.jobs[0].hosts[1]", id="unknown-host"),
    pytest.param("bad.json", json.dumps({**BASE, "priority": 1}), "$.priority",
                 id="unknown-field"),
    pytest.param("bad.json", json.dumps(BASE).replace("1000000000.0", "NaN"), "$",
                 id="NaN-literal"),
    pytest.param("bad.json", '{"jobs": [}', "$", id="json-syntax"),
    pytest.param("bad.yaml", "jobs: [\n  - {id: j0\n", "$", id="yaml-syntax"),
    pytest.param("bad.json", json.dumps({**BASE, "topology": {**BASE["topology"], "tors": None}}),
                 "$.topology.tors", id="builder-parameter-null"),
])
def test_bad_scenario_is_one_line_exit_2(tmp_path: Path, launcher: list[str], name: str,
                                        text: str, json_path: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    line = one_error_line(cruxctl("plan", str(path), cwd=tmp_path, launcher=launcher))
    assert line.startswith(f"cruxctl: error: {path}: {json_path}: ")


def test_unknown_scenario_name_lists_the_bundled_ones(tmp_path: Path) -> None:
    line = one_error_line(cruxctl("plan", "no-such-scenario", cwd=tmp_path))
    assert "no-such-scenario" in line
    names = bundled_names()
    assert names and all(n in line for n in names)


def test_levels_zero_is_bad_input(tmp_path: Path) -> None:
    assert "--levels" in one_error_line(cruxctl("plan", "--levels", "0", cwd=tmp_path))


def test_too_many_levels_is_bad_input(tmp_path: Path) -> None:
    line = one_error_line(cruxctl("plan", "testbed96", "--levels", "6", cwd=tmp_path))
    assert "6 levels do not fit" in line


def test_too_many_levels_blames_the_flag(tmp_path: Path) -> None:
    line = one_error_line(cruxctl("plan", "testbed96", "--levels", "6", cwd=tmp_path))
    assert "--levels" in line and "$.levels" not in line


@pytest.mark.parametrize("args", [["--help"], ["plan", "--help"]], ids=" ".join)
def test_help_exits_0(tmp_path: Path, launcher: list[str], args: list[str]) -> None:
    run = cruxctl(*args, cwd=tmp_path, launcher=launcher)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: cruxctl")
    expected = ["--levels", "--json", "testbed96"] if args[0] == "plan" else ["plan"]
    assert all(word in run.stdout for word in expected)
