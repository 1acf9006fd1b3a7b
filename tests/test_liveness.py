"""Liveness without periodic reports (issue 34), on real processes: a leader-only and an
agent-only `cruxd` over loopback gRPC. The agent reports only on change; its open plan
stream is its liveness, kept by gRPC keepalive on both ends ([control] keepalive_s)."""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cruxd.testing.rig import Daemon, crux_run, cruxctl, free_port, wait_for

# a periodic report would come every 300 s: anything sooner came from the change itself
TICK_S = 300.0
TIMEOUT_S = 2.0
KEEPALIVE_S = 1.0


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Daemon, Daemon]]:
    port = free_port()
    leader = Daemon(tmp_path, "leader", {
        "daemon": {"roles": ["leader"]},
        "leader": {"listen": f"127.0.0.1:{port}", "profiling_s": 0, "debounce_ms": 0,
                   "agent_timeout_s": TIMEOUT_S},
        "control": {"keepalive_s": KEEPALIVE_S}})
    agent = Daemon(tmp_path, "h0", {
        "daemon": {"roles": ["agent"]},
        "agent": {"leader": f"127.0.0.1:{port}", "addresses": ["10.0.0.1"], "gpus": 8,
                  "leader_token": str(leader.root / "state" / "leader.token"),
                  "report_interval_s": TICK_S, "refresh_s": TICK_S, "reconnect_max_s": 0.5},
        "control": {"keepalive_s": KEEPALIVE_S}})
    leader.start()
    leader.wait_log("leader listening")
    agent.start()
    try:
        agent.wait_log(" applied: ")
        yield leader, agent
    finally:
        if agent.proc is not None:
            agent.send(signal.SIGCONT)
        agent.stop()
        leader.stop()


def cluster(leader: Daemon) -> dict[str, Any]:
    port = re.search(r'listen = "([^"]+)"', leader.config.read_text())
    assert port is not None
    run = cruxctl("status", "--json", "--leader", port[1], "--config", str(leader.config))
    assert run.returncode == 0, run.stderr
    doc: dict[str, Any] = json.loads(run.stdout)["cluster"]
    return doc


def h0(leader: Daemon) -> dict[str, Any]:
    (a,) = [a for a in cluster(leader)["agents"] if a["host_id"] == "h0"]
    return a


def planned(leader: Daemon, job: str) -> bool:
    return any(j["job_id"] == job and j["state"] not in ("expired",
                                                          "queued")
               for j in cluster(leader).get("jobs", []))


def reports(agent: Daemon) -> list[str]:
    """Why each report the agent sent went (its debug log)."""
    return re.findall(r"report \d+ sent: (.*)", agent.log_text())


def test_a_job_reaches_the_leader_at_once_and_a_quiet_agent_sends_nothing(
        pair: tuple[Daemon, Daemon]) -> None:
    leader, agent = pair
    wait_for("h0 connected", lambda: h0(leader).get("connected"))
    sent = len(reports(agent))
    time.sleep(3 * KEEPALIVE_S)  # quiet: pings only
    assert len(reports(agent)) == sent
    assert not h0(leader).get("expired")
    t0 = time.monotonic()
    job = crux_run(agent.socket, "j1")
    try:
        wait_for("j1 at the leader", lambda: any(
            j["job_id"] == "j1" for j in cluster(leader).get("jobs", [])), timeout=10)
        took = time.monotonic() - t0
        assert took < TICK_S / 10, took  # the change sent it, not a tick
        assert "jobs changed" in reports(agent)[sent:]
    finally:
        job.kill()
        job.wait()


def test_a_stopped_agent_expires_by_keepalive_and_comes_back(
        pair: tuple[Daemon, Daemon]) -> None:
    """SIGSTOP keeps the agent's TCP connection up (the kernel still acks): only the
    leader's keepalive pings, unanswered, end its stream; then the grace runs out."""
    leader, agent = pair
    job = crux_run(agent.socket, "j1")
    try:
        wait_for("j1 planned", lambda: planned(leader, "j1"))
        agent.send(signal.SIGSTOP)
        expired = wait_for("h0 expired", lambda: h0(leader).get("expired"),
                           timeout=1.5 * KEEPALIVE_S + TIMEOUT_S + 10)
        assert expired
        states = {j["job_id"]: j["state"] for j in cluster(leader)["jobs"]}
        assert states["j1"] == "expired"
        agent.send(signal.SIGCONT)  # its stream failed: it reports on a new one
        wait_for("h0 back", lambda: (a := h0(leader)).get("connected")
                 and not a.get("expired"), timeout=20)
        wait_for("j1 back in the plan", lambda: planned(leader, "j1"), timeout=20)
    finally:
        agent.send(signal.SIGCONT)
        job.kill()
        job.wait()


def test_a_killed_agent_expires_after_the_grace(pair: tuple[Daemon, Daemon]) -> None:
    leader, agent = pair
    wait_for("h0 connected", lambda: h0(leader).get("connected"))
    agent.stop(signal.SIGKILL)  # its connection closes: the stream ends at once

    def gone() -> dict[str, Any] | None:
        a = h0(leader)
        return None if a.get("connected") else a

    a = wait_for("h0 without a stream", gone)
    assert not a.get("expired")  # the grace runs from the stream's end
    wait_for("h0 expired", lambda: h0(leader).get("expired"), timeout=TIMEOUT_S + 10)
