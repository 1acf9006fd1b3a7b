"""One cruxd process (agent + leader): the embedded default, systemd notify, SIGHUP,
profiling, metrics and health, and what it does with bad input on each edge."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb
from cruxd.rpc.gen.crux.v1 import leader_pb2_grpc as lgrpc
from cruxd.rpc.local import LocalClient
from cruxd.testing import BIN, Daemon, crux_run, status, wait_for
from tests.nobody import as_nobody
from transport.decision_table import TableReader

pytestmark = pytest.mark.slow


def _port(d: Daemon, what: str) -> int:
    text = d.wait_log(what)
    m = re.search(re.escape(what) + r"[^\n]*?127\.0\.0\.1:(\d+)", text)
    assert m, text
    return int(m.group(1))


@pytest.fixture
def daemon(tmp_path: Path):
    d = Daemon(tmp_path, "h0", {
        "leader": {"listen": "127.0.0.1:0", "profiling_s": 0, "debounce_ms": 10},
        "agent": {"addresses": ["10.1.0.1"], "gpus": 8, "report_interval_s": 0.5},
        "metrics": {"listen": "127.0.0.1:0"}})
    d.start()
    d.wait_log(" applied: ")
    yield d
    assert d.stop() == 0, d.log_text()[-2000:]


def test_embedded_default_runs_a_job_and_stops_cleanly(tmp_path: Path) -> None:
    """No configuration at all: agent + leader on this host (directories from the
    environment systemd would set, so the test does not touch /run or /var/lib)."""
    env = {**os.environ, "RUNTIME_DIRECTORY": str(tmp_path / "run"),
           "STATE_DIRECTORY": str(tmp_path / "state")}
    env.pop("NOTIFY_SOCKET", None)
    log = tmp_path / "log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(BIN / "cruxd")], stdout=out, stderr=out, env=env)
    sock = tmp_path / "run" / "agent.sock"
    job = None
    try:
        wait_for("the embedded daemon's first plan", lambda: " applied: " in log.read_text()
                 or proc.poll() is not None)
        assert proc.poll() is None, log.read_text()
        assert "config: <embedded default>" in log.read_text()
        job = crux_run(sock, "demo", "--gpus", "8", "--flops-per-iter", "1e15",
                       "--compute-s", "1.2", "--comm-s", "0.31", "--period-s", "1.15")
        def in_table() -> bool:
            with TableReader(tmp_path / "run" / "decisions") as t:
                return any(d.job_id == "demo" for d in t.snapshot())
        wait_for("demo in the table", in_table)
        doc = status(sock)
        assert [j["job_id"] for j in doc["cluster"]["jobs"]] == ["demo"]
        declared = doc["agent"]["jobs"][0]["measurement"]
        assert declared["source"] == "hints"
        assert (declared["compute_s"], declared["comm_s"], declared["period_s"]) == (
            1.2, 0.31, 1.15)  # with the period, the leader derives the job's overlap
        assert (tmp_path / "state" / "leader-state.json").exists()
    finally:
        if job is not None:
            job.kill()
            job.wait()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0, log.read_text()
    assert "stopped" in log.read_text()
    assert not sock.exists(), "the socket is removed on a clean stop"


def test_systemd_notify_ready_watchdog_reload_stopping(tmp_path: Path) -> None:
    addr = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as nsock:
        nsock.bind(addr)
        nsock.settimeout(20)
        d = Daemon(tmp_path, "h0", {"leader": {"listen": "127.0.0.1:0"},
                                    "agent": {"addresses": ["10.1.0.1"], "gpus": 0}},
                   env={"NOTIFY_SOCKET": addr, "WATCHDOG_USEC": "200000"})
        d.start()
        try:
            got: list[str] = []

            def until(word: str, start: int = 0) -> None:
                while not any(word in m for m in got[start:]):
                    got.append(nsock.recv(4096).decode())

            until("READY=1")
            assert any("STATUS=agent h0" in m for m in got), got
            until("WATCHDOG=1")
            d.send(signal.SIGHUP)
            until("RELOADING=1")
            assert "MONOTONIC_USEC=" in got[-1]
            until("READY=1", start=len(got))
        finally:
            rc = d.stop()
        until("STOPPING=1")
    assert rc == 0


def test_sighup_with_a_bad_file_keeps_running_configuration(daemon: Daemon) -> None:
    good = daemon.config.read_text()
    daemon.config.write_text(good.replace("[leader]\n", "[leader]\nlevels = 99\n", 1))
    daemon.send(signal.SIGHUP)
    line = next(ln for ln in daemon.wait_log("keeping the running configuration").splitlines()
                if "keeping the running configuration" in ln)
    assert "leader.levels" in line, line
    assert status(daemon.socket)["cluster"]["levels"] == 1  # a stock fabric's one class
    daemon.config.write_text(good.replace("[leader]\n", "[leader]\nlevels = 3\n", 1))
    daemon.send(signal.SIGHUP)
    daemon.wait_log("configuration reloaded")
    wait_for("levels 3 in status", lambda: status(daemon.socket)["cluster"]["levels"] == 3)


def test_profiling_window_gives_the_new_job_the_top_level_alone(tmp_path: Path) -> None:
    d = Daemon(tmp_path, "h0", {
        "leader": {"listen": "127.0.0.1:0", "profiling_s": 1.5, "levels": 3, "debounce_ms": 10},
        "agent": {"addresses": ["10.1.0.1"], "gpus": 8, "report_interval_s": 0.3}})
    d.start().wait_log(" applied: ")
    jobs = [crux_run(d.socket, "old", "--flops-per-iter", "1e16")]
    try:
        wait_for("old scheduled", lambda: [j["state"] for j in status(d.socket)["cluster"]["jobs"]]
                 == ["scheduled"], timeout=30)
        jobs.append(crux_run(d.socket, "new", "--flops-per-iter", "1e12"))
        def profiling() -> dict[str, dict[str, object]] | None:
            js = {j["job_id"]: j for j in status(d.socket)["cluster"]["jobs"]}
            return js if js.get("new", {}).get("state") == "profiling" else None
        js = wait_for("new in profiling", profiling)
        assert js["new"]["level"] == 2 and js["old"]["level"] < 2
        wait_for("new scheduled after its window", lambda: {
            j["job_id"]: j["state"] for j in status(d.socket)["cluster"]["jobs"]}
            == {"old": "scheduled", "new": "scheduled"})
        assert "profiling done: new" in d.log_text()
    finally:
        for j in jobs:
            j.kill()
            j.wait()
        assert d.stop() == 0


def test_invalid_report_is_rejected_counted_and_not_applied(daemon: Daemon) -> None:
    port = _port(daemon, "leader listening on")
    metrics = _port(daemon, "metrics on http://")
    bad = lpb.AgentReport(host=lpb.HostInventory(host_id="evil"), jobs=[
        cpb.LocalJob(job_id="j", gpus=1, nnodes=1,
                     measurement=cpb.JobMeasurement(flops_per_iter=float("nan")))])
    auth = (("authorization", "Bearer " + (daemon.root / "state" / "leader.token").read_text()
             .strip()),)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = lgrpc.LeaderStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.Report(bad, timeout=5, metadata=auth)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "jobs[0].measurement.flops_per_iter" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            list(stub.WatchPlan(lpb.WatchRequest(host_id="bad host"), timeout=5,
                                metadata=auth))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        health = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="crux.v1.Leader"), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    st = status(daemon.socket)["cluster"]
    assert [a["host_id"] for a in st["agents"]] == ["h0"], "nothing of the bad report applied"
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read()
    line = next(ln for ln in text.decode().splitlines()
                if ln.startswith("crux_rpc_rejected_total{") and 'rpc="Report"' in ln)
    assert float(line.split()[-1]) == 1.0
    assert "crux_plan_generation" in text.decode()


def test_local_socket_rejects_bad_frames_and_bad_registrations(daemon: Daemon) -> None:
    with socket.socket(socket.AF_UNIX) as s:  # a length beyond the 4 MiB limit
        s.connect(str(daemon.socket))
        s.sendall((64 << 20).to_bytes(4, "big"))
        s.settimeout(5)
        assert s.recv(16) == b"", "the agent drops the connection"
    client = LocalClient(daemon.socket)
    bad = client.call(apb.LocalRequest(register=apb.RegisterJob(job_id="has space", gpus=1)))
    assert bad.error.code == 3 and "job_id" in bad.error.message
    nan = client.call(apb.LocalRequest(register=apb.RegisterJob(
        job_id="ok", gpus=1, hints=cpb.JobMeasurement(comm_s=-1.0))))
    assert nan.error.code == 3 and "comm_s" in nan.error.message
    gone = client.call(apb.LocalRequest(deregister=apb.DeregisterJob(job_id="nope")))
    assert gone.error.code == 5
    assert client.call(apb.LocalRequest()).error.code == 3
    doc = status(daemon.socket)
    assert doc["agent"]["jobs"] == [] and daemon.proc is not None and daemon.proc.poll() is None


@pytest.mark.root
def test_socket_checks_peer_credentials_even_when_the_file_is_open(tmp_path: Path) -> None:
    """With the file made world-writable, SO_PEERCRED still refuses another user.
    (A forked child drops to nobody: the venv's interpreter may not be executable by it,
    and the socket lives in a directory nobody can reach.)"""
    open_dir = Path(tempfile.mkdtemp(prefix="crux-peercred-"))
    open_dir.chmod(0o755)
    sock = open_dir / "agent.sock"
    d = Daemon(tmp_path, "h0", {"leader": {"listen": "127.0.0.1:0"},
                                "agent": {"addresses": ["10.1.0.1"], "gpus": 0,
                                          "socket": str(sock)}})
    try:
        d.start()
        wait_for("the agent socket", sock.exists)
        os.chmod(sock, 0o666)
        answer = _ask_as_nobody(sock)
    finally:
        assert d.stop() == 0
        shutil.rmtree(open_dir, ignore_errors=True)
    assert answer.startswith("7 "), answer


def _ask_as_nobody(sock: Path) -> str:
    def ask() -> str:
        r = LocalClient(sock).call(apb.LocalRequest(jobs=apb.ListJobsRequest()))
        return f"{r.error.code} {r.error.message}"
    return as_nobody(ask)


def test_cruxctl_reports_an_absent_agent_with_exit_3(tmp_path: Path) -> None:
    run = subprocess.run([str(BIN / "cruxctl"), "status", "--socket", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 3
    assert run.stderr.startswith("cruxctl: error: no crux agent at ")
    run = subprocess.run([str(BIN / "crux-run"), "--socket", str(tmp_path / "none"),
                          "--job-id", "x", "--", "sh", "-c", "echo $CRUX_JOB_ID; exit 7"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 7 and run.stdout == "x\n", "fails open, exit status passed on"
    assert "running without crux" in run.stderr


def test_plan_live_json(daemon: Daemon) -> None:
    job = crux_run(daemon.socket, "solo", "--flops-per-iter", "2e15")
    try:
        wait_for("solo planned", lambda: status(daemon.socket)["cluster"]["jobs"])
        run = subprocess.run([str(BIN / "cruxctl"), "plan", "--live", "--json", "--socket",
                              str(daemon.socket)], capture_output=True, text=True, timeout=30)
        assert run.returncode == 0, run.stderr
        doc = json.loads(run.stdout)
        assert doc["plan"]["jobs"][0]["job"] == "solo" and doc["generation"] >= 1
    finally:
        job.kill()
        job.wait()


@pytest.mark.parametrize("taken", ["leader.listen", "metrics.listen"])
def test_a_taken_port_is_one_line_and_exit_2(daemon: Daemon, tmp_path: Path,
                                             taken: str) -> None:
    """A second leader must not share the first's port (gRPC's default SO_REUSEPORT
    would split the agents between them), nor its metrics port."""
    ports = {"leader.listen": _port(daemon, "leader listening on"),
             "metrics.listen": _port(daemon, "metrics on")}
    listen = {k: f"127.0.0.1:{ports[k]}" if k == taken else "127.0.0.1:0" for k in ports}
    second = Daemon(tmp_path, "second", {
        "daemon": {"roles": ["leader"], "log_level": "info"},
        "leader": {"listen": listen["leader.listen"]},
        "metrics": {"listen": listen["metrics.listen"]}}).start()
    assert second.proc is not None
    assert second.proc.wait(20) == 2
    lines = second.log_text().strip().splitlines()
    assert "Traceback" not in second.log_text()
    assert lines[-1].startswith("cruxd: error: ") and f"{taken}: cannot listen on" in lines[-1]
    assert daemon.proc is not None and daemon.proc.poll() is None  # the first one keeps going
