"""Faults that must not lose or corrupt state (issue 17): a leader killed right after it
published a plan, a damaged or hostile leader state file, a full disk, a decision table
shrunk or overwritten under its readers, a runtime filesystem too small for the table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cruxd.config.statefile import write_atomic
from cruxd.control.cluster import ClusterState
from cruxd.errors import UsageError
from cruxd.leader import store
from cruxd.testing import BIN, Daemon, crux_run, free_port, wait_for
from tests.cbuild import REPO, build
from transport.decision_table import Decision, TableReader, TableWriter

JOB = ("--gpus", "8", "--nnodes", "2", "--flops-per-iter", "1e15", "--compute-s", "0.5",
       "--allreduce-bytes", "1e9")


def _table(d: Daemon) -> tuple[int, frozenset[str]]:
    with TableReader(d.table) as t:
        return t.header().plan_generation, frozenset(x.job_id for x in t.snapshot())


def _job(agents: dict[str, Daemon], job: str) -> list[subprocess.Popen[bytes]]:
    return [crux_run(agents[h].socket, job, "--node-rank", str(r), *JOB)
            for r, h in enumerate(agents)]


@pytest.mark.slow
def test_leader_killed_right_after_a_plan_never_reuses_its_generation(tmp_path: Path) -> None:
    port = free_port()
    leader = Daemon(tmp_path, "leader", {
        "daemon": {"roles": ["leader"]},
        "leader": {"listen": f"127.0.0.1:{port}", "profiling_s": 0, "agent_timeout_s": 5.0,
                   "debounce_ms": 0}})
    agents = {h: Daemon(tmp_path, h, {
        "daemon": {"roles": ["agent"]},
        "agent": {"leader": f"127.0.0.1:{port}", "addresses": [f"10.0.0.{i + 1}"], "gpus": 8,
                  "leader_token": str(leader.root / "state" / "leader.token"),
                  "report_interval_s": 0.2, "reconnect_max_s": 0.5}})
        for i, h in enumerate(["h0", "h1"])}
    jobs: list[subprocess.Popen[bytes]] = []
    seen: dict[int, frozenset[str]] = {}  # generation -> the jobs h0's table held with it

    def look() -> tuple[int, frozenset[str]]:
        # the agent drops an ended job's entries at once (same generation): fewer jobs under
        # a generation is allowed, another job under it means the number was reused
        gen, content = _table(agents["h0"])
        assert content <= seen.setdefault(gen, content), (
            f"generation {gen} reused: {sorted(seen[gen])} then {sorted(content)}")
        return gen, content
    try:
        leader.start().wait_log("leader listening")
        for a in agents.values():
            a.start()
        for a in agents.values():
            a.wait_log(" applied: ")
        jobs += _job(agents, "a")
        wait_for("job a in h0's table", lambda: "a" in look()[1])
        jobs += _job(agents, "b")
        # the kill lands as soon as the plan with b reaches a table: before any delayed save
        wait_for("job b in h0's table", lambda: "b" in _table(agents["h0"])[1], every=0.001)
        leader.stop(signal.SIGKILL)
        gen_b, _ = look()
        # the number is recorded before the plan goes out (the whole state follows it)
        mark = json.loads((leader.root / "state" / "leader-state.json.generation").read_text())
        assert mark["generation"] >= gen_b, "a published generation was not recorded first"

        for p in jobs[2:]:  # b ends while the leader is down; c starts after its restart
            p.terminate()
            p.wait()
        leader.start().wait_log("resumed plan generation")
        jobs += _job(agents, "c")
        final = wait_for("c in h0's table and b gone", lambda: (
            lambda g_c: g_c if "c" in g_c[1] and "b" not in g_c[1] else None)(look()))
        assert final[0] != gen_b
    finally:
        for p in jobs:
            if p.poll() is None:
                p.kill()
                p.wait()
        codes = {d.name: d.stop() for d in [*agents.values(), leader]}
    assert all(rc == 0 for rc in codes.values()), codes


def _load(path: Path) -> tuple[Any, ClusterState]:
    state = ClusterState(5.0, 0.1, 0.0)
    return store.load(path, state, time.time()), state


def _good_state(path: Path, generation: int) -> dict[str, Any]:
    plan = {"generation": generation, "planned_unix_ms": 1, "levels": 4, "jobs": []}
    doc = {"format": store.FORMAT, "agents": {}, "jobs": {}, "plan": plan}
    path.write_text(json.dumps(doc))
    return doc


def test_state_nested_deep_is_set_aside_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "leader-state.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    assert _load(path)[0] is None
    assert not path.exists() and path.with_suffix(".json.corrupt").exists()


def test_state_generation_beyond_uint64_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "leader-state.json"
    _good_state(path, 2**70)
    assert _load(path)[0] is None
    assert path.with_suffix(".json.corrupt").exists()
    _good_state(path, 2**64 - 1)  # fits the wire, but the next plan's would not
    assert _load(path)[0] is None
    _good_state(path, 2**63 - 1)
    plan, _ = _load(path)
    assert plan is not None and plan.generation == 2**63 - 1


def test_state_file_over_the_size_bound_is_refused_unread(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "leader-state.json"
    with open(path, "wb") as f:
        f.truncate(store.MAX_BYTES + 1)  # sparse: costs no disk
    assert _load(path)[0] is None
    assert path.with_suffix(".json.corrupt").exists()
    assert f"over the {store.MAX_BYTES}-byte limit" in caplog.text  # refused by size, unread


def test_state_file_that_is_a_directory_is_a_config_error_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "leader-state.json"
    path.mkdir()
    (path / "keep").write_text("mine")
    with pytest.raises(UsageError, match="not a regular file"):
        _load(path)
    assert (path / "keep").read_text() == "mine"
    assert not path.with_suffix(".json.corrupt").exists()

    conf = tmp_path / "cruxd.toml"
    conf.write_text(f'[daemon]\nroles = ["leader"]\nstate_dir = "{tmp_path}"\n'
                    f'runtime_dir = "{tmp_path / "run"}"\n[metrics]\nlisten = ""\n'
                    f'[leader]\nlisten = "127.0.0.1:0"\nstate_file = "{path}"\n')
    run = subprocess.run([str(BIN / "cruxd"), "--config", str(conf)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert "Traceback" not in run.stderr and last.startswith("cruxd: error: leader.state_file")
    assert (path / "keep").read_text() == "mine"


@pytest.mark.root
def test_full_disk_leaves_no_temp_file_and_keeps_the_old_state(tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    try:
        path = mnt / "leader-state.json"
        old = _good_state(path, 7)
        with pytest.raises(OSError):
            write_atomic(path, {**old, "pad": "x" * 200_000})
        assert sorted(p.name for p in mnt.iterdir()) == ["leader-state.json"]
        assert json.loads(path.read_text()) == old
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


# --- a decision table shrunk or overwritten while mapped ----------------------------------

def _table_with_entry(path: Path) -> None:
    """A table whose entry for ("job", 10.0.0.2) lies past the first page, which a file
    shrunk to 64 bytes still backs."""
    fill = [Decision(f"other{i}", None, level=1, dscp=0, traffic_class=0, sport=0,
                     plan_generation=5) for i in range(40)]
    with TableWriter.open(path, capacity=64) as w:
        w.apply([*fill, Decision("job", "10.0.0.2", level=3, dscp=26, traffic_class=104,
                                 sport=0, plan_generation=5)], plan_generation=5)


@pytest.mark.parametrize("size", [0, 64])
def test_c_reader_survives_its_table_shrinking_and_fails_open(tmp_path: Path,
                                                              size: int) -> None:
    prog = build(tmp_path, "table_shrink", ["tests/c/table_shrink.c"], verbs=False)
    path = tmp_path / "decisions"
    _table_with_entry(path)
    p = subprocess.Popen([prog, path, "job", "10.0.0.2"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdin is not None
    assert p.stdout.readline().strip() == "before found"
    os.truncate(path, size)
    out, _ = p.communicate("go\n", timeout=30)
    assert p.returncode == 0, f"reader died with {p.returncode}"
    raw, refreshed = out.splitlines()
    assert raw.startswith("raw miss") and refreshed == "refreshed miss"
    if size == 0:  # even the header's page is gone: read as unusable, not as a crash
        assert raw == "raw miss gen=0 retired=1"


_PY_READER = """
import os, sys
from transport.decision_table import TableError, TableReader
path, size = sys.argv[1], int(sys.argv[2])
with TableReader(path) as r:
    assert r.lookup("job", "10.0.0.2") is not None
    if size >= 0:
        os.truncate(path, size)
    else:  # in place: a header that no longer describes a table
        with open(path, "r+b") as f:
            f.write(b"garbage!")
    try:
        r.header()
        print("header kept")
    except TableError as e:
        print("header refused", "truncated or overwritten" in str(e))
    print(r.lookup("job", "10.0.0.2"), r.decision_for("job", "10.0.0.2"), r.snapshot(),
          r.retired)
"""


@pytest.mark.parametrize("size", [0, 64, -1])
def test_python_reader_rechecks_the_file_and_fails_open(tmp_path: Path, size: int) -> None:
    path = tmp_path / "decisions"
    _table_with_entry(path)
    run = subprocess.run([sys.executable, "-c", _PY_READER, str(path), str(size)],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert run.returncode == 0, f"reader died with {run.returncode}: {run.stderr}"
    assert run.stdout.splitlines() == ["header refused True", "None None [] True"]


@pytest.mark.root
def test_runtime_fs_smaller_than_the_table_is_one_clear_error(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(run_dir)],
                   check=True)
    try:
        conf = tmp_path / "cruxd.toml"
        conf.write_text(f'[daemon]\nroles = ["agent"]\nstate_dir = "{tmp_path / "state"}"\n'
                        f'runtime_dir = "{run_dir}"\n[metrics]\nlisten = ""\n')
        run = subprocess.run([str(BIN / "cruxd"), "--config", str(conf)], capture_output=True,
                             text=True, timeout=60)
        assert run.returncode in (1, 2), run.stderr  # not 135: SIGBUS
        last = run.stderr.strip().splitlines()[-1]
        assert "Traceback" not in run.stderr
        assert "decisions" in last and "No space left on device" in last, last
        assert not (run_dir / "decisions").exists()
        assert not (run_dir / "decisions.tmp").exists()
    finally:
        subprocess.run(["umount", str(run_dir)], check=True)
