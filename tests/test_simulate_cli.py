"""`cruxctl simulate`: the seed's Fig. 11 numbers, JSON, plots, bad input; scenario parsing."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cruxd.errors import ScenarioError, UsageError
from cruxd.scenario import parse_scenario
from cruxd.scenario.simulation import simulation_of
from tests.cli_errors import one_error_line
from tests.paths import EXAMPLES

MODULE = [sys.executable, "-m", "cruxd.cli.cruxctl", "simulate"]
FIG11 = EXAMPLES / "fig11-simulate.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
Doc = dict[str, Any]


def simulate(*args: str, cwd: Path, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MODULE, *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})},
                          timeout=300, check=False)


def as_json(*args: str, cwd: Path) -> dict[str, Any]:
    run = simulate(*args, "--json", cwd=cwd)
    assert run.returncode == 0, run.stderr
    out: dict[str, Any] = json.loads(run.stdout)
    return out


def by_policy(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["policy"]: r for r in out["results"]}


def fig11() -> Doc:
    doc: Doc = json.loads(FIG11.read_text())
    return doc


# --- the seed's numbers -------------------------------------------------------------

@pytest.mark.parametrize(("name", "fixed", "crux"), [
    ("fig11-simulate.json", 0.375, 0.417), ("fig11-simulate-job2-first.json", 0.417, 0.417)])
def test_fig11_utilisation_matches_the_seed(tmp_path: Path, name: str, fixed: float,
                                            crux: float) -> None:
    results = by_policy(as_json(str(EXAMPLES / name), cwd=tmp_path))
    assert results["fixed"]["gpu_utilization"] == pytest.approx(fixed, rel=0.01)
    assert results["crux-full"]["gpu_utilization"] == pytest.approx(crux, rel=0.01)
    assert results["ecmp"]["gpu_utilization"] < crux


def test_table_shows_utilisation_and_slowdowns(tmp_path: Path) -> None:
    run = simulate(str(FIG11), cwd=tmp_path, env={"COLUMNS": "120"})
    assert run.returncode == 0, run.stderr
    assert "0.375" in run.stdout and "0.417" in run.stdout
    for word in ("fixed", "ecmp", "crux-full", "job1", "job2", "mean slowdown"):
        assert word in run.stdout
    assert max(len(line) for line in run.stdout.splitlines()) <= 120  # the width asked for


def test_json_document(tmp_path: Path) -> None:
    out = as_json(str(EXAMPLES / "fig12-simulate.json"), "--seed", "3", cwd=tmp_path)
    assert out["version"] == 1 and out["scenario"] == "fig12-simulate"
    assert (out["horizon_s"], out["seed"], out["levels"]) == (120, 3, 8)
    assert [r["policy"] for r in out["results"]] == ["ecmp", "crux-full"]
    for res in out["results"]:
        assert {"gpu_utilization", "mean_slowdown", "max_slowdown", "worst_throughput_ratio",
                "network_utilization"} <= res.keys()
        assert [j["job"] for j in res["per_job"]] == ["job1", "job2"]
        for j in res["per_job"]:
            assert {"job", "gpus", "throughput_ratio", "slowdown", "jct_s", "standalone_jct_s",
                    "busy_gpu_s", "iterations"} <= j.keys()
            assert j["slowdown"] == pytest.approx(1 / j["throughput_ratio"], rel=1e-4)


def test_overrides_and_a_run_bounded_by_iterations(tmp_path: Path) -> None:
    doc = fig11()
    del doc["simulate"]["horizon_s"]
    doc["jobs"][0]["iterations"], doc["jobs"][1]["iterations"] = 3, 6
    path = tmp_path / "bounded.json"
    path.write_text(json.dumps(doc))
    out = as_json(str(path), "--policy", "fixed", cwd=tmp_path)
    assert out["horizon_s"] is None
    jobs = {j["job"]: j for j in out["results"][0]["per_job"]}
    assert jobs["job1"]["finished"] and jobs["job2"]["finished"]
    assert (jobs["job1"]["iterations"], jobs["job2"]["iterations"]) == (3, 6)
    short = as_json(str(FIG11), "--policy", "ecmp", "--horizon", "4", "--levels", "4",
                    cwd=tmp_path)
    assert short["horizon_s"] == 4 and short["levels"] == 4
    assert short["results"][0]["horizon_s"] == pytest.approx(4)


def test_plot_is_a_png(tmp_path: Path) -> None:
    png = tmp_path / "fig11.png"
    run = simulate(str(FIG11), "--plot", str(png), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000
    assert str(png) in run.stdout


def test_help(tmp_path: Path) -> None:
    run = simulate("--help", cwd=tmp_path)
    assert run.returncode == 0
    for opt in ("--policy", "--horizon", "--seed", "--levels", "--json", "--plot"):
        assert opt in run.stdout


# --- bad input: one line, exit 2, the JSON path --------------------------------------

def put(where: Callable[[Doc], Any], key: str | int, value: Any) -> Callable[[Doc], None]:
    def apply(doc: Doc) -> None:
        where(doc)[key] = value
    return apply


def drop(where: Callable[[Doc], Any], key: str) -> Callable[[Doc], None]:
    def apply(doc: Doc) -> None:
        del where(doc)[key]
    return apply


def sim(d: Doc) -> Any:
    return d["simulate"]


def job(i: int) -> Callable[[Doc], Any]:
    return lambda d: d["jobs"][i]


BAD = {
    "unknown policy": (put(sim, "policies", ["fixed", "warp"]), "$.simulate.policies[1]"),
    "fixed without levels": (drop(sim, "fixed_levels"), "$.simulate: missing field"),
    "fixed unknown job": (put(sim, "fixed_levels", {"job1": 1, "job9": 0}),
                          "$.simulate.fixed_levels.job9"),
    "fixed level too high": (put(sim, "fixed_levels", {"job1": 2}),
                             "$.simulate.fixed_levels.job1"),
    "negative arrival": (put(job(0), "arrival_s", -1), "$.jobs[0].arrival_s"),
    "sideways": (put(job(1), "start_phase", "sideways"), "$.jobs[1].start_phase"),
    "zero iterations": (put(job(1), "iterations", 0), "$.jobs[1].iterations"),
    "no horizon": (drop(sim, "horizon_s"), "$.simulate.horizon_s"),
    "unknown field": (put(sim, "horizon", 3), "$.simulate.horizon"),
    "levels": (put(sim, "levels", 65), "$.simulate.levels"),
    "policy twice": (put(sim, "policies", ["fixed", "fixed"]), "$.simulate.policies[1]"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_scenario_names_the_json_path(tmp_path: Path, case: str) -> None:
    mutate, where = BAD[case]
    doc = fig11()
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    line = one_error_line(simulate(str(path), cwd=tmp_path))
    assert line.startswith(f"cruxctl: error: {path}: {where}"), line


@pytest.mark.parametrize(("args", "says"), [
    (["--policy", "warp"], "--policy"), (["--horizon", "-1"], "--horizon"),
    (["--policy", "ecmp,,crux-full"], "--policy"), (["--levels", "1"], "--levels 1"),
    (["--plot", "/nonexistent/dir/x.png"], "--plot")])
def test_bad_flags(tmp_path: Path, args: list[str], says: str) -> None:
    assert says in one_error_line(simulate(str(FIG11), *args, cwd=tmp_path))


def test_fixed_from_the_command_line_needs_fixed_levels(tmp_path: Path) -> None:
    line = one_error_line(simulate(str(EXAMPLES / "fig12-simulate.json"), "--policy", "fixed",
                                   cwd=tmp_path))
    assert "fixed_levels" in line


# --- parsing, in process --------------------------------------------------------------

def parse(doc: Doc) -> Any:
    return parse_scenario(doc, EXAMPLES, "mem.json")


def test_parsing_and_defaults() -> None:
    doc = fig11()
    doc["jobs"][0].update(arrival_s=2.5, iterations=10)
    sc = parse(doc)
    spec = sc.simulation
    assert (spec.horizon_s, spec.levels, spec.policies) == (12, 2, ("fixed", "ecmp", "crux-full"))
    assert dict(spec.fixed_levels) == {"job1": 1, "job2": 0}
    jobs, settings = simulation_of(sc)
    assert [(j.job.id, j.arrival_s, j.iterations, j.start_phase) for j in jobs] == [
        ("job1", 2.5, 10, "comm"), ("job2", 0.0, None, "comm")]
    assert [name for name, _ in settings.runs] == ["fixed", "ecmp", "crux-full"]
    assert (settings.config.horizon_s, settings.config.levels) == (12, 2)
    shipped = json.loads((EXAMPLES / "fig11-iteration-time.json").read_text())
    assert parse(shipped).simulation.horizon_s == 120  # runs as shipped
    # without its horizon, jobs that never finish leave the run no end
    plain = parse({k: v for k, v in shipped.items() if k != "simulate"})
    assert plain.simulation.timing[0].start_phase == "compute"
    with pytest.raises(ScenarioError, match=r"\$\.simulate\.horizon_s"):
        simulation_of(plain)
    _, settings = simulation_of(plain, horizon_s=5, seed=7, levels=3)
    cfg = settings.config
    assert (cfg.horizon_s, cfg.seed, cfg.levels) == (5, 7, 3)
    assert [name for name, _ in settings.runs] == ["ecmp", "crux-full"]


def test_only_all_bounded_jobs_run_without_a_horizon() -> None:
    doc = copy.deepcopy(fig11())
    del doc["simulate"]["horizon_s"]
    for j in doc["jobs"]:
        j["iterations"] = 4
    _, settings = simulation_of(parse(doc))
    assert math.isinf(settings.config.horizon_s)


def test_policy_names_are_checked_when_simulating_not_when_planning() -> None:
    doc = fig11()
    doc["simulate"]["policies"] = ["ecmp", "not-yet-written"]
    sc = parse(doc)  # cruxctl plan reads this file fine
    with pytest.raises(ScenarioError) as err:
        simulation_of(sc)
    assert err.value.path == "$.simulate.policies[1]" and err.value.where == "mem.json"
    with pytest.raises(UsageError, match="--levels 1"):
        simulation_of(sc, policies=["fixed"], levels=1)
