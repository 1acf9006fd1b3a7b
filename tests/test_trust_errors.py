"""Clean errors at the trust boundary: a configuration cruxd cannot use ends in one line that
names the key and the cause, exit 2, never a traceback; bytes on the leader's port that are
no protobuf message are refused as INVALID_ARGUMENT and counted (issue 17)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cruxd.leader.handlers import METHODS
from cruxd.rpc.gen.crux.v1 import leader_pb2
from cruxd.testing import BIN, Daemon, toml, wait_for
from tests.tls_certs import CA

pytestmark = pytest.mark.slow


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something else is listening on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _garbage(path: Path) -> str:
    path.write_bytes(os.urandom(512))
    return str(path)


def _tls_with(tmp: Path, bad: str) -> dict[str, str]:
    """Real mutual-TLS material with the file for `bad` replaced by random bytes."""
    ca = CA(tmp / "ca")
    cert, key = ca.issue("leader", server=True)
    files = {"ca": str(ca.path), "cert": str(cert), "key": str(key)}
    files[bad] = _garbage(tmp / f"garbage-{bad}.pem")
    return files


def _other_key(tmp: Path) -> dict[str, str]:
    """A certificate with a key that is not its own."""
    ca = CA(tmp / "ca")
    cert, _ = ca.issue("leader", server=True)
    _, key = ca.issue("other", server=True)
    return {"ca": str(ca.path), "cert": str(cert), "key": str(key)}


Sections = dict[str, dict[str, Any]]
# (key named in the error, what it says, the bad sections given tmp_path and a busy port)
CASES: dict[str, tuple[str, str, Callable[[Path, int], Sections]]] = {
    "state_dir under a file": ("daemon.state_dir", "Not a directory", lambda t, _: {
        "daemon": {"state_dir": str(t / "afile" / "state")}}),
    "runtime_dir under a file": ("daemon.runtime_dir", "Not a directory", lambda t, _: {
        "daemon": {"runtime_dir": str(t / "afile" / "run")}}),
    "socket path too long": ("agent.socket", "at most 107 bytes", lambda t, _: {
        "agent": {"socket": str(t / ("s" * 120 + ".sock"))}}),
    "runtime_dir too long for the socket": ("daemon.runtime_dir", "at most 107 bytes",
                                             lambda t, _: {"daemon": {
                                                 "runtime_dir": str(t / ("r" * 110))}}),
    "decision table in /proc": ("agent.decision_table", "/proc", lambda t, _: {
        "agent": {"decision_table": "/proc/self/decisions"}}),
    "decision table in /sys": ("agent.decision_table", "/sys", lambda t, _: {
        "agent": {"decision_table": "/sys/../sys/kernel/decisions"}}),
    "metrics port in use": ("metrics.listen", "Address already in use", lambda t, port: {
        "metrics": {"listen": f"127.0.0.1:{port}"}}),
    "garbage TLS CA": ("tls.ca", "not a PEM", lambda t, _: {"tls": _tls_with(t, "ca")}),
    "garbage TLS cert": ("tls.cert", "not a PEM", lambda t, _: {"tls": _tls_with(t, "cert")}),
    "garbage TLS key": ("tls.key", "not a PEM", lambda t, _: {"tls": _tls_with(t, "key")}),
    "TLS key of another cert": ("tls.key", "tls.cert", lambda t, _: {"tls": _other_key(t)}),
}


def _config(tmp: Path, sections: Sections) -> Path:
    (tmp / "afile").write_text("a file, not a directory\n")
    doc: Sections = {
        "daemon": {"host_id": "h0", "state_dir": str(tmp / "state"),
                   "runtime_dir": str(tmp / "run"), **sections.get("daemon", {})},
        "leader": {"listen": "127.0.0.1:0"}, "metrics": {"listen": ""}}
    for name, keys in sections.items():
        if name != "daemon":
            doc[name] = {**doc.get(name, {}), **keys}
    path = tmp / "cruxd.toml"
    path.write_text(toml(doc))
    return path


def _cruxd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "cruxd"), *args], capture_output=True, text=True,
                          timeout=60)


def _one_line(run: subprocess.CompletedProcess[str], key: str, cause: str) -> None:
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("cruxd: error")]
    assert len(lines) == 1, run.stderr[-3000:]
    assert [ln for ln in run.stderr.splitlines() if key in ln] == lines
    assert lines[0].startswith("cruxd: error: ") and key in lines[0] and cause in lines[0], lines


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_config_cruxd_cannot_use_is_one_line_and_exit_2(case: str, tmp_path: Path,
                                                          busy_port: int) -> None:
    key, cause, sections = CASES[case]
    config = _config(tmp_path, sections(tmp_path, busy_port))
    run = _cruxd("--config", str(config))
    _one_line(run, key, cause)


@pytest.mark.parametrize("case", ["socket path too long", "runtime_dir too long for the socket",
                                  "decision table in /proc", "garbage TLS key"])
def test_check_config_catches_it_before_start(case: str, tmp_path: Path) -> None:
    key, cause, sections = CASES[case]
    run = _cruxd("--check-config", "--config", str(_config(tmp_path, sections(tmp_path, 0))))
    _one_line(run, key, cause)
    assert not (tmp_path / "run").exists()  # nothing was created: only checked


def test_toml_nested_5000_deep_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "cruxd.toml"
    config.write_text("[daemon]\nroles = " + "[" * 5000 + "]" * 5000 + "\n")
    for args in (["--config", str(config)], ["--check-config", "--config", str(config)]):
        run = _cruxd(*args)
        _one_line(run, "line 2", "nested")
        assert "roles" in run.stderr


def test_a_leader_port_that_is_taken_is_a_config_error(tmp_path: Path, busy_port: int) -> None:
    config = _config(tmp_path, {"daemon": {"roles": ["leader"]},
                                "leader": {"listen": f"127.0.0.1:{busy_port}"}})
    _one_line(_cruxd("--config", str(config)), "leader.listen", f"127.0.0.1:{busy_port}")


# --- garbage on the leader's gRPC port -------------------------------------------------------

@pytest.fixture
def leader(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(gRPC address, /metrics URL) of a real leader-only cruxd."""
    d = Daemon(tmp_path, "h0", {"daemon": {"roles": ["leader"]},
                                "leader": {"listen": "127.0.0.1:0"},
                                "metrics": {"listen": "127.0.0.1:0"}})
    d.start()
    try:
        text = d.wait_log(" running: ")
        grpc_port = re.search(r"leader listening on 127\.0\.0\.1:(\d+)", text)
        http_port = re.search(r"metrics on http://127\.0\.0\.1:(\d+)", text)
        assert grpc_port and http_port
        yield (f"127.0.0.1:{grpc_port.group(1)}",
               f"http://127.0.0.1:{http_port.group(1)}/metrics")
        d.check_alive("the end of the test")
    finally:
        assert d.stop() == 0, d.log_text()[-2000:]


def _rejected(url: str, rpc: str) -> float:
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read().decode()
    for labels, value in re.findall(r"^crux_rpc_rejected_total{(.*)} (\S+)$", body, re.M):
        if set(labels.split(",")) == {f'rpc="{rpc}"', 'field="message"'}:
            return float(value)
    return 0.0


def _counted(url: str, rpc: str, n: int) -> bool:
    return _rejected(url, rpc) == n


GARBAGE = b"\xff\xff\xff\xff\x0f" + bytes(range(256))


@pytest.mark.parametrize("rpc", ["Report", "WatchPlan", "Status", "GetPlan", "GetHints"])
def test_garbage_bytes_are_invalid_argument_and_counted(rpc: str,
                                                        leader: tuple[str, str]) -> None:
    address, url = leader
    with grpc.insecure_channel(address) as ch:
        path = f"/crux.v1.Leader/{rpc}"
        for n in (1, 2):
            with pytest.raises(grpc.RpcError) as err:
                if rpc == "WatchPlan":
                    stream: Any = ch.unary_stream(path)  # raw bytes: no serializer
                    list(stream(GARBAGE, timeout=10))
                else:
                    unary: Any = ch.unary_unary(path)
                    unary(GARBAGE, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
            assert "not a valid" in (err.value.details() or "")
            wait_for(f"{n} {rpc} rejection(s) counted", partial(_counted, url, rpc, n))
        # the leader still answers a well-formed call
        health = health_pb2_grpc.HealthStub(ch)
        answer = health.Check(health_pb2.HealthCheckRequest(service="crux.v1.Leader"), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_the_method_table_serves_every_method_of_the_service() -> None:
    service = leader_pb2.DESCRIPTOR.services_by_name["Leader"]
    assert {m.name: (m.input_type.full_name, m.output_type.full_name, m.server_streaming)
            for m in service.methods} == {
        rpc: (req.DESCRIPTOR.full_name, resp.DESCRIPTOR.full_name, streaming)
        for rpc, (req, resp, streaming) in METHODS.items()}
