"""One cruxd per state directory (issue 31): a second daemon is refused before it reads or
writes anything, the lock goes with its holder (SIGKILL too), a daemon that never started
saves no state, and the demo runs beside a cruxd that is already running.

Real processes throughout: daemons from cruxd.testing, the demo as `bash .ci/demo-daemon`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cruxd.testing import BIN, Daemon, cruxctl, free_port, status, wait_for

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
# what a file is: kind and permissions, inode, modification and change times, contents
Fingerprint = tuple[int, int, int, int, bytes | None]


def _fingerprints(*roots: Path) -> dict[str, Fingerprint]:
    """Every file and directory under `roots` (the roots too: a file created and removed
    again, or renamed over another, changes its directory's times)."""
    out: dict[str, Fingerprint] = {}
    for root in roots:
        for p in sorted([root, *root.rglob("*")]):
            st = p.lstat()
            data = p.read_bytes() if stat.S_ISREG(st.st_mode) else None
            out[str(p)] = (st.st_mode, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, data)
    return out


def _first(tmp_path: Path, listen: str = "127.0.0.1:0") -> Daemon:
    """A running cruxd (agent + leader, info logs) whose state is on disk and settled: the
    first plan applied and saved; with no jobs nothing changes after that."""
    d = Daemon(tmp_path, "h0", {
        "daemon": {"log_level": "info"},
        "leader": {"listen": listen, "debounce_ms": 10},
        "agent": {"addresses": ["10.1.0.1"], "gpus": 0}})
    d.start()
    d.wait_log(" applied: ")
    state = d.root / "state"
    wait_for("the leader's state file", lambda: (state / "leader-state.json").exists())
    return d


def _leader_port(d: Daemon) -> int:
    m = re.search(r"leader listening on 127\.0\.0\.1:(\d+)", d.wait_log("leader listening"))
    assert m, d.log_text()
    return int(m.group(1))


@pytest.fixture
def first(tmp_path: Path) -> Iterator[Daemon]:
    d = _first(tmp_path)
    yield d
    assert d.stop() == 0, d.log_text()[-2000:]


@pytest.mark.parametrize("port", ["kernel's", "fixed"])
def test_a_second_cruxd_on_the_same_state_dir_exits_2_and_touches_nothing(
        tmp_path: Path, port: str) -> None:
    """The same configuration file. With a fixed leader port (the embedded default's
    7470) the second would also fail on the port; with port 0 it would get one, and then
    the decision table another writer holds: either way, the lock refuses it first."""
    listen = f"127.0.0.1:{free_port()}" if port == "fixed" else "127.0.0.1:0"
    first = _first(tmp_path, listen)
    try:
        _refused_beside(first)
    finally:
        assert first.stop() == 0, first.log_text()[-2000:]


def _refused_beside(first: Daemon) -> None:
    dirs = (first.root / "state", first.root / "run")
    lock = first.root / "state" / "cruxd.lock"
    assert first.proc is not None
    assert lock.read_text() == f"{first.proc.pid}\n"
    before = _fingerprints(*dirs)

    second = subprocess.run([str(BIN / "cruxd"), "--config", str(first.config)],
                            capture_output=True, text=True, timeout=60)

    assert second.returncode == 2, second.stderr
    assert second.stdout == ""
    assert second.stderr.splitlines() == [
        f"cruxd: error: another cruxd (pid {first.proc.pid}) holds {lock}; stop it first, "
        "or give this one its own daemon.state_dir"]
    assert _fingerprints(*dirs) == before
    assert first.proc.poll() is None
    assert status(first.socket)["agent"]["host_id"] == "h0"  # the first still serves


def test_check_config_takes_no_lock(first: Daemon) -> None:
    """--check-config only validates: it runs beside the daemon and writes nothing."""
    dirs = (first.root / "state", first.root / "run")
    before = _fingerprints(*dirs)
    run = subprocess.run([str(BIN / "cruxd"), "--config", str(first.config), "--check-config"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert '"host_id": "h0"' in run.stdout
    assert _fingerprints(*dirs) == before


def test_the_lock_goes_with_a_killed_holder(tmp_path: Path) -> None:
    """SIGKILL runs no clean-up: the kernel drops the flock with the process, and the next
    cruxd on the same directories starts and resumes the state the killed one saved."""
    d = _first(tmp_path)
    lock = d.root / "state" / "cruxd.lock"
    try:
        assert d.stop(signal.SIGKILL) == -signal.SIGKILL
        d.start()
        assert d.proc is not None
        pid = d.proc.pid
        wait_for("the new daemon's pid in the lock", lambda: lock.read_text() == f"{pid}\n")
        d.wait_log("resumed plan generation 1")
        # the leader resumes before the agent opens its socket: wait for that, then ask
        wait_for("the new daemon's agent answering",
                 lambda: cruxctl("status", "--json", socket_path=d.socket).returncode == 0)
        assert status(d.socket)["agent"]["host_id"] == "h0"
    finally:
        assert d.stop() == 0, d.log_text()[-2000:]


def test_a_leader_that_cannot_listen_leaves_its_state_alone(first: Daemon,
                                                            tmp_path: Path) -> None:
    """Its own state_dir (so the lock is free), the first's leader port: one line, exit 2,
    and the state file it would have restored is not rewritten on the way out. gRPC's own
    bind error line is not printed ahead of it."""
    port = _leader_port(first)
    other = Daemon(tmp_path, "other", {"daemon": {"roles": ["leader"], "log_level": "info"},
                                       "leader": {"listen": f"127.0.0.1:{port}"}})
    state = other.root / "state"
    state.mkdir(mode=0o750)
    shutil.copy2(first.root / "state" / "leader-state.json", state)
    before = _fingerprints(state / "leader-state.json")

    run = subprocess.run([str(BIN / "cruxd"), "--config", str(other.config)],
                         capture_output=True, text=True, timeout=60)

    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [
        f"cruxd: error: {other.config}: leader.listen: cannot listen on 127.0.0.1:{port}: "
        "Address already in use"]
    assert _fingerprints(state / "leader-state.json") == before
    assert first.proc is not None and first.proc.poll() is None


def test_a_released_lock_file_keeps_the_last_pid(tmp_path: Path) -> None:
    """The file is not removed at a clean stop (removing it would let a racing daemon lock
    a file the next one no longer sees); the next holder overwrites the pid."""
    d = _first(tmp_path)
    assert d.proc is not None
    pid = d.proc.pid
    assert d.stop() == 0, d.log_text()[-2000:]
    assert (d.root / "state" / "cruxd.lock").read_text() == f"{pid}\n"


def _demo(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if not (REPO / ".venv" / "bin" / "cruxd").exists():
        pytest.skip("the demo runs the commands in .venv/bin (bash .ci/bootstrap setup)")
    return subprocess.run(["bash", str(REPO / ".ci" / "demo-daemon")], capture_output=True,
                          text=True, timeout=180, env={**os.environ, **env})


def test_the_demo_runs_beside_a_running_cruxd(first: Daemon) -> None:
    """The whole demo, with CRUX_SOCKET naming the running daemon's agent: a cruxctl or
    crux-run the demo did not point at its own daemon would talk to that one instead."""
    dirs = (first.root / "state", first.root / "run")
    before = _fingerprints(*dirs)
    # a short TMPDIR: under pytest-xdist, tmp_path plus the demo's own directory and
    # run/agent.sock reached 108 bytes once the base was pytest-100 or above
    tmp = Path(tempfile.mkdtemp(prefix="crux-t-"))
    try:
        run = _demo({"CRUX_SOCKET": str(first.socket), "TMPDIR": str(tmp)})
        leftover = list(tmp.iterdir())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for heading in ("== cruxctl status", "== cruxctl jobs"):
        assert heading in run.stdout
    jobs = run.stdout.split("== cruxctl jobs", 1)[1]
    assert "demo-gpt" in jobs and "sleep 120" in jobs
    assert "cruxd exit status: 0" in run.stdout
    assert leftover == []  # its directory is removed after a clean run
    assert status(first.socket)["cluster"]["jobs"] == []  # the job was not registered here
    assert _fingerprints(*dirs) == before


def test_the_demo_says_why_cruxd_did_not_start(tmp_path: Path) -> None:
    """A temporary directory so deep the agent socket's path passes the 107-byte limit:
    the demo's cruxd refuses it, and the demo prints that line, not just a status."""
    tmp = tmp_path / ("d" * 100)
    tmp.mkdir()
    run = _demo({"TMPDIR": str(tmp)})
    assert run.returncode == 2, run.stdout + run.stderr
    assert "demo: cruxd could not start (exit status 2)" in run.stderr
    assert re.search(r"cruxd: error: \S+cruxd\.toml: daemon\.runtime_dir: the agent socket "
                     r"\S+ is \d+ bytes", run.stderr), run.stderr
