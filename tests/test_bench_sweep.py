"""bench/simulate.py's --oversubscription, --levels and --sweep (bench/_sweep.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO

SCRIPT = REPO / "bench" / "simulate.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600, check=False)


@pytest.mark.parametrize(("args", "says"), [
    (["--levels", "0"], "every K must be an integer >= 1"),
    (["--levels", "two"], "--levels: 'two' is not a number"),
    (["--oversubscription", "0"], "every R must be a finite number > 0"),
    (["--oversubscription", "1,x", "--sweep"], "--oversubscription: 'x' is not a number"),
    (["--oversubscription", "1,2"], "need --sweep"),
    (["--levels", "2,2", "--sweep"], "each value once"),
    (["--json", "x.json"], "go with --sweep"),
])
def test_bad_flags_are_usage_errors(tmp_path: Path, args: list[str], says: str) -> None:
    run = bench(*args, cwd=tmp_path)
    assert run.returncode == 2, run.stdout
    assert says in run.stderr
    assert run.stdout == ""  # refused before any run


@pytest.mark.slow
def test_a_small_sweep_end_to_end(tmp_path: Path) -> None:
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    run = bench("--sweep", "--days", "0.02", "--jobs", "8", "--oversubscription", "1,4",
                "--levels", "1,8", "--policies", "ecmp,spray,taccl*,crux-full",
                "--procs", "2", "--json", str(out), "--plot", str(png), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("$ ") and "--sweep" in run.stdout.splitlines()[0]
    assert "(d) sensitivity" in run.stdout
    doc = json.loads(out.read_text())
    assert doc["policies"] == ["ecmp", "spray", "taccl*", "crux-full"]
    cells = {(c["fabric"], c["oversubscription"], c["levels"]): c for c in doc["cells"]}
    assert set(cells) == {("clos", r, k) for r in (1.0, 4.0) for k in (1, 8)}
    for c in cells.values():
        util = c["gpu_utilization"]
        assert all(0.0 < util[p] <= 1.0 for p in doc["policies"])
        best = max(("ecmp", "spray", "taccl*"), key=lambda p: util[p])
        assert c["best_non_crux"] == best
        assert c["crux_full_gain"] == pytest.approx(util["crux-full"] / util[best] - 1)
        assert c["crux_full_vs_spray"] == pytest.approx(util["crux-full"] / util["spray"] - 1)
    # a fabric with one level cannot prioritise: crux-full is paths only there
    for r in (1.0, 4.0):
        one, eight = cells[("clos", r, 1)], cells[("clos", r, 8)]
        assert one["gpu_utilization"]["ecmp"] == eight["gpu_utilization"]["ecmp"]
        assert one["gpu_utilization"]["spray"] == eight["gpu_utilization"]["spray"]
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_one_cell_runs_at_the_asked_levels_and_ratio(tmp_path: Path) -> None:
    run = bench("--days", "0.02", "--jobs", "4", "--topologies", "clos", "--policies", "spray",
                "--oversubscription", "3", "--levels", "2", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "oversubscription 3; SimConfig(levels=2," in run.stdout
    assert "spray" in run.stdout
