"""A restarted leader whose saved view holds an agent's latest report gets no report from
it on the new plan stream (the stream's metadata says the view is current); an agent whose
latest report the view lacks reports again, and the leader's view gets it back. Real
processes: a leader and two agents on loopback (issue 34: a failover at 10,000 hosts was
mostly 10,000 re-reports)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from cruxd.control.cluster import ClusterState
from cruxd.control.records import AgentReport, HostInventory
from cruxd.testing import Daemon, crux_run, free_port, status, wait_for

pytestmark = pytest.mark.slow

HOSTS = ["h0", "h1"]
SENT = re.compile(r"report (\d+) sent")
SKIPPED = "holds this host's report"


def sent(d: Daemon) -> list[int]:
    return [int(m) for m in SENT.findall(d.log_text())]


def saved_seqs(leader: Daemon) -> dict[str, int]:
    try:
        doc = json.loads((leader.root / "state" / "leader-state.json").read_text())
    except (OSError, ValueError):
        return {}
    return {h: a.get("seq", 0) for h, a in doc.get("agents", {}).items()}


@pytest.fixture
def rig(tmp_path: Path):
    port = free_port()
    leader = Daemon(tmp_path, "leader", {
        "daemon": {"roles": ["leader"]},
        "leader": {"listen": f"127.0.0.1:{port}", "profiling_s": 0, "agent_timeout_s": 30.0,
                   "debounce_ms": 20}})
    agents = {h: Daemon(tmp_path, h, {
        "daemon": {"roles": ["agent"]},
        "agent": {"leader": f"127.0.0.1:{port}", "addresses": [f"10.0.0.{i + 1}"], "gpus": 8,
                  "leader_token": str(leader.root / "state" / "leader.token"),
                  "reconnect_max_s": 1.0}}) for i, h in enumerate(HOSTS)}
    jobs: list[Any] = []
    try:
        leader.start().wait_log("leader listening")
        for a in agents.values():
            a.start()
        for a in agents.values():
            a.wait_log(" applied: ")
        yield leader, agents, jobs
    finally:
        for j in jobs:
            if j.poll() is None:
                j.kill()
                j.wait()
        codes = {n: d.stop() for n, d in [*agents.items(), ("leader", leader)]}
        assert all(rc == 0 for rc in codes.values()), codes


def restart(leader: Daemon) -> None:
    leader.stop(signal.SIGKILL)
    leader.start().wait_log("leader listening")


def test_current_view_takes_no_report_and_a_stale_one_gets_it_back(rig) -> None:
    leader, agents, jobs = rig
    # the view on disk holds each agent's latest acked report
    wait_for("both agents' latest reports saved", lambda: saved_seqs(leader) == {
        h: max(sent(a), default=-1) for h, a in agents.items()})
    before = {h: sent(a) for h, a in agents.items()}
    restart(leader)
    for h, a in agents.items():
        wait_for(f"{h} to skip its report", lambda a=a: SKIPPED in a.log_text())
        wait_for(f"{h} to report to the restarted leader",
                 lambda a=a: status(a.socket)["cluster"] is not None)
    # a report owed on the new stream goes within REPORT_JITTER_S (1 s): none went
    time.sleep(1.5)
    assert {h: sent(a) for h, a in agents.items()} == before

    # h1's job arrives after the view below was saved: a leader restored from that view
    # lacks h1's latest report, and says so; h0's is still current
    old = leader.root / "old-state.json"
    shutil.copy(leader.root / "state" / "leader-state.json", old)
    jobs.append(crux_run(agents["h1"].socket, "late", "--gpus", "8", "--nnodes", "1",
                         "--flops-per-iter", "1e14", "--compute-s", "0.5",
                         "--allreduce-bytes", "1e9"))
    wait_for("the job in the leader's view", lambda: "late" in {
        j["job_id"] for j in status(agents["h0"].socket)["cluster"]["jobs"]})
    h1_sent = sent(agents["h1"])
    leader.stop(signal.SIGKILL)
    shutil.copy(old, leader.root / "state" / "leader-state.json")
    skipped = {h: a.log_text().count(SKIPPED) for h, a in agents.items()}
    leader.start().wait_log("leader listening")
    wait_for("h1 to report again", lambda: len(sent(agents["h1"])) > len(h1_sent))
    assert agents["h1"].log_text().count(SKIPPED) == skipped["h1"]
    wait_for("h0 to skip again", lambda: agents["h0"].log_text().count(SKIPPED) > skipped["h0"])
    wait_for("the job back in the restored leader's view", lambda: "late" in {
        j["job_id"] for j in (status(agents["h0"].socket)["cluster"] or {}).get("jobs", [])})


def test_holds_report_names_one_report_of_one_process() -> None:
    state = ClusterState(30.0, 0.1, 0.0, 0.0)
    state.ingest(AgentReport(HostInventory("h0", "t", 8, ()), seq=3, incarnation=77), 0.0)
    assert state.holds_report("h0", 77, 3)
    assert not state.holds_report("h0", 77, 2)  # an older report: the view is newer
    assert not state.holds_report("h0", 78, 3)  # another process of the agent
    assert not state.holds_report("h0", 0, 0)  # an agent that never had a report acked
    assert not state.holds_report("h1", 77, 3)  # a host the view does not have
    state.agents["h0"].expired = True
    assert not state.holds_report("h0", 77, 3)
