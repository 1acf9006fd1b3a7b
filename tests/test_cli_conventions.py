"""Conventions every crux command keeps: one error root mapped in one place, COLUMNS and
pipes, NO_COLOR, --version, and matplotlib as an optional extra."""

from __future__ import annotations

import ast
import importlib
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from cruxd import __version__
from cruxd.cli import cruxctl
from cruxd.cli.common import console
from cruxd.errors import CruxError, PlanningError, UsageError
from cruxd.scenario import bundled, load_scenario
from tests.cli_errors import one_error_line
from tests.paths import EXAMPLES, REPO

ESC = "\x1b["
NO_PATH = {"topology": {"nodes": [{"id": "a", "kind": "host"}, {"id": "b", "kind": "host"},
                                  {"id": "s1", "kind": "switch"}, {"id": "s2", "kind": "switch"}],
                        "links": [{"a": "a", "b": "s1", "gbps": 100},
                                  {"a": "b", "b": "s2", "gbps": 100}]},
           "jobs": [{"id": "j0", "hosts": ["a", "b"], "compute_s": 0.5, "bytes": 1e9,
                     "iterations": 10}]}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE")}
    return {**env, "TERM": "xterm-256color", **extra}


def _cruxctl(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cruxd.cli.cruxctl", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False,
                          env=_env(**env))


def _on_a_tty(*args: str, **env: str) -> str:
    """cruxctl's stdout when stdout is a terminal (a pseudo-terminal here)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "cruxd.cli.cruxctl", *args], cwd=REPO,
                            stdout=slave, stderr=subprocess.DEVNULL, env=_env(**env))
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=120) == 0
    return out.decode()


# --- one error root ----------------------------------------------------------------------


def _exception_classes() -> list[tuple[str, str]]:
    """(module, class) for every class in cruxd whose name says it is an error."""
    found = []
    for path in sorted((REPO / "cruxd").rglob("*.py")):
        if "gen" in path.relative_to(REPO).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith(
                    ("Error", "Exception", "Unavailable", "Unreachable", "NotRunnable")):
                module = ".".join(path.relative_to(REPO).with_suffix("").parts)
                found.append((module, node.name))
    return found


def test_every_crux_exception_derives_from_crux_error() -> None:
    classes = _exception_classes()
    assert ("cruxd.measure.sampling.gpu", "NvmlUnavailable") in classes
    for module, name in classes:
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, CruxError), f"{module}.{name}"


def test_an_error_says_where_and_why() -> None:
    from cruxd.config.fields import FieldError

    e = UsageError("must be positive", where="--rate")
    assert (e.where, e.why, str(e)) == ("--rate", "must be positive", "--rate: must be positive")
    assert str(UsageError("no where")) == "no where"
    f = FieldError("agent.socket", "expected a path")
    assert isinstance(f, UsageError) and f.where == "agent.socket"
    assert str(f) == "agent.socket: expected a path"


def test_planning_errors_are_value_errors_too(tmp_path: Path) -> None:
    from cruxd.scheduler import plan

    path = tmp_path / "nopath.json"
    path.write_text(json.dumps(NO_PATH))
    sc = load_scenario(path)
    with pytest.raises(PlanningError, match="job j0: no path from a to b") as info:
        plan(sc.view, sc.config)
    assert isinstance(info.value, ValueError) and info.value.exit_status == 2


@pytest.mark.parametrize(("command", "policy"), [("plan", None), ("simulate", "ecmp"),
                                                 ("simulate", "crux-full")])
def test_an_unplannable_scenario_is_one_line_exit_2(tmp_path: Path, command: str,
                                                    policy: str | None) -> None:
    path = tmp_path / "nopath.json"
    path.write_text(json.dumps(NO_PATH))
    args = [command, str(path), *(["--policy", policy] if policy else [])]
    line = one_error_line(_cruxctl(*args, cwd=tmp_path))
    assert line.startswith(f"cruxctl: error: {path}: $: cannot {command}: job j0: no path")


def test_crux_run_errors_go_through_the_same_mapping(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "cruxd.cli.crux_run", "--quiet", "--socket",
                          str(tmp_path / "none.sock"), "--", str(tmp_path / "missing")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 127
    assert run.stderr.splitlines() == [
        f"crux-run: error: cannot run {str(tmp_path / 'missing')!r}: No such file or directory"]


# --- (a) COLUMNS and pipes ----------------------------------------------------------------


def test_piped_output_is_not_wrapped(tmp_path: Path) -> None:
    path = bundled("testbed96")
    assert path is not None
    description = load_scenario(path).description
    assert len(description) > 200
    run = _cruxctl("plan", "testbed96", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert description in run.stdout.splitlines()
    assert max(len(line) for line in run.stdout.splitlines()) > 120


def test_columns_sets_the_width(tmp_path: Path) -> None:
    run = _cruxctl("plan", "testbed96", cwd=tmp_path, COLUMNS="60")
    assert run.returncode == 0, run.stderr
    assert max(len(line) for line in run.stdout.splitlines()) <= 60


def test_console_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert console().width > 10_000 and console().soft_wrap  # pytest's capture is no tty
    monkeypatch.setenv("COLUMNS", "77")
    assert console().width == 77 and not console().soft_wrap


# --- (b) NO_COLOR ---------------------------------------------------------------------------


def test_no_color_removes_every_style(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich then styles even a pipe
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    console().print("[bold]b[/] [dim]d[/] [red]r[/] 12.5")
    assert ESC in capsys.readouterr().out  # the check below can see styles
    monkeypatch.setenv("NO_COLOR", "1")  # rich's own no_color would keep bold and dim
    console().print("[bold]b[/] [dim]d[/] [red]r[/] 12.5")
    assert capsys.readouterr().out == "b d r 12.5\n"


def test_no_color_on_a_terminal() -> None:
    styled = _on_a_tty("plan", "testbed96")
    assert "\x1b[1m" in styled and "\x1b[2m" in styled  # bold and dim without NO_COLOR
    plain = _on_a_tty("plan", "testbed96", NO_COLOR="1")
    assert ESC not in plain and "testbed96" in plain


# --- (c) --version ----------------------------------------------------------------------


@pytest.mark.parametrize("module", ["cruxd.cli.crux_run", "cruxd.cli.cruxctl", "cruxd.cli.daemon"])
def test_version(module: str) -> None:
    run = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    prog = {"cruxd.cli.crux_run": "crux-run", "cruxd.cli.cruxctl": "cruxctl",
            "cruxd.cli.daemon": "cruxd"}[module]
    assert run.stdout == f"{prog} {__version__}\n"


def test_crux_run_passes_the_commands_own_version_flag(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "cruxd.cli.crux_run", "--quiet", "--socket",
                          str(tmp_path / "none.sock"), "--", sys.executable, "--version"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0 and run.stdout.startswith("Python 3"), run.stderr


# --- (d) matplotlib is optional -----------------------------------------------------------


def test_plot_without_matplotlib_is_one_clear_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError

    def no_simulation(*_: object) -> None:
        raise AssertionError("simulated before finding matplotlib missing")

    monkeypatch.setattr("cruxd.cli.simulate_cmd.run_policies", no_simulation)
    png = tmp_path / "x.png"
    assert cruxctl.main(["simulate", str(EXAMPLES / "fig11-simulate.json"),
                         "--plot", str(png)]) == 2  # a missing extra: a usage error
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert len(lines) == 1 and out.out == ""
    assert lines[0].startswith("cruxctl: error: --plot needs crux[plot] (")
    assert lines[0].endswith("pip install 'crux[plot]'")
    assert not png.exists()


def test_matplotlib_is_an_extra() -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("matplotlib") for d in project["dependencies"])
    assert any(d.startswith("matplotlib") for d in project["optional-dependencies"]["plot"])


# --- (e) --json: plain JSON values -----------------------------------------------------------


def test_json_has_numbers_lower_case_states_and_one_infinity() -> None:
    """64-bit integers are numbers (protobuf's own mapping writes "18"), states are "expired"
    (not JOB_STATE_EXPIRED), and an infinite I_j is null, as in `cruxctl plan --json`."""
    import json

    from cruxd.cli.live_cmd import to_json
    from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb

    status = cpb.ClusterStatus(plan_generation=18, jobs=[
        cpb.JobDecision(job_id="a", state=cpb.JOB_STATE_EXPIRED, intensity=float("inf"),
                        qps_total=5, measurement=cpb.JobMeasurement(comm_s=0.25)),
        cpb.JobDecision(job_id="b", state=cpb.JOB_STATE_SCHEDULED, intensity=2.5e14)])
    doc = json.loads(json.dumps(to_json(status), allow_nan=False))  # valid JSON as it is
    assert doc["plan_generation"] == 18
    a, b = doc["jobs"]
    assert (a["state"], a["intensity"], a["qps_total"]) == ("expired", None, 5)
    assert a["measurement"]["comm_s"] == 0.25 and "measurement" not in b  # unset: absent
    assert (b["state"], b["intensity"], b["routes"]) == ("scheduled", 2.5e14, [])


# --- (f) quick commands stay quick ------------------------------------------------------------


def test_jobs_and_status_import_nothing_heavy() -> None:
    """`cruxctl jobs` and `status` (through the agent) load the CLI, the socket client, the
    stubs and the tables, not the scheduler, the simulator, numpy, scipy or grpc: importing
    those cost `cruxctl jobs` 0.44 s of its 0.6 s. Time is measured in the note, not here."""
    import subprocess

    code = ("import sys\n"
            "from cruxd.cli import cruxctl, live_cmd, status_view\n"
            "from cruxd.rpc import local\n"
            "from cruxd.rpc.gen.crux.v1 import agent_pb2\n"
            "heavy = ('numpy', 'scipy', 'grpc', 'cruxd.scheduler', 'cruxd.sim', 'asyncio')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy\n"
            "             or m.startswith(heavy[3:5])))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert run.stdout.strip() == "[]", run.stdout


def test_the_socket_speaks_grpcs_status_numbers() -> None:
    import grpc

    from cruxd.rpc import local

    for name in ("INVALID_ARGUMENT", "NOT_FOUND", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                 "UNAVAILABLE"):
        assert getattr(local, name) == getattr(grpc.StatusCode, name).value[0]
