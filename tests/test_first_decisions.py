"""The agent's count of jobs that crux-run started before their first decision arrived
(cruxd/agent/first_decisions.py), on its own and in a real agent whose leader comes late."""

from __future__ import annotations

from pathlib import Path

import pytest

from cruxd.agent.first_decisions import FirstDecisions
from cruxd.control.records import JobAssignment, JobState
from cruxd.testing import Daemon, crux_run, cruxctl, free_port, status, wait_for


def job(jid: str, provisional: bool = False) -> JobAssignment:
    return JobAssignment(jid, JobState.UNMEASURED if provisional else JobState.SCHEDULED,
                         provisional=provisional)


def test_a_job_counts_once_when_its_first_whole_decision_is_late() -> None:
    f = FirstDecisions()
    f.registered("slow", 10.0)
    f.registered("fast", 10.0)
    assert f.applied([job("slow", provisional=True), job("fast")], 2.0, 10.5) == []
    assert f.applied([job("slow", provisional=True)], 2.0, 12.5) == []  # still provisional
    assert f.applied([job("slow"), job("fast")], 2.0, 13.0) == [("slow", 3.0)]
    assert f.applied([job("slow"), job("fast")], 2.0, 20.0) == []  # decided: counted once
    assert f.late == 1


def test_unknown_and_departed_jobs_never_count() -> None:
    f = FirstDecisions()
    f.registered("gone", 0.0)
    f.gone("gone")
    assert f.applied([job("gone"), job("kept-across-a-restart")], 1.0, 99.0) == []
    assert f.late == 0


@pytest.mark.slow
def test_an_agent_whose_leader_comes_late_counts_the_job_and_says_so(tmp_path: Path) -> None:
    listen = f"127.0.0.1:{free_port()}"
    agent = Daemon(tmp_path, "a", {
        "daemon": {"roles": ["agent"]},
        "agent": {"leader": listen, "gpus": 8, "start_wait_s": 0.2, "reconnect_max_s": 0.2,
                  "leader_token": str(tmp_path / "l" / "state" / "leader.token")}})
    leader = Daemon(tmp_path, "l", {"daemon": {"roles": ["leader"]},
                                    "leader": {"listen": listen, "profiling_s": 0}})
    agent.start()
    anchor = None
    try:
        agent.wait_log("agent a")
        anchor = crux_run(agent.socket, "early", "--gpus", "8", "--wait-s", "0.2")
        wait_for("the job registered", lambda: "job early registered" in agent.log_text())
        leader.start()
        wait_for("the late decision counted",
                 lambda: status(agent.socket)["agent"]["late_first_decisions"] == 1)
        assert "job early: first decision" in agent.log_text()
        text = cruxctl("status", "--local", socket_path=agent.socket)
        said = " ".join(text.stdout.split())
        assert "1 job(s) got their first decision after crux-run's start wait" in said
    finally:
        if anchor is not None:
            anchor.kill()
            anchor.wait()
        agent.stop()
        leader.stop()
