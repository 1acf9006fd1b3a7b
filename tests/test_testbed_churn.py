"""The testbed's job churn (tests/rig/testbed_churn.JobChurn) against real log files: the
window opens from the jobs' own iteration logs, an arrival starts on time, a leaver is
stopped after its iterations inside the window, and each event is timed to the leader's
plan that took it in."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.rig.testbed import EmuJob
from tests.rig.testbed_churn import JobChurn, JobEvent


def _job(jid: str, arrival_s: float = 0.0, iterations: int | None = None) -> EmuJob:
    return EmuJob(jid, ("h0", "h1"), 8, 0.1, 0.0, 1000, arrival_s=arrival_s,
                  iterations=iterations)


def _log(logdir: Path, jid: str, t0s: list[float]) -> None:
    with (logdir / f"{jid}.0.jsonl").open("a") as f:
        for t0 in t0s:
            f.write(json.dumps({"t0": t0, "end": t0 + 0.1}) + "\n")


def test_arrivals_and_departures_follow_the_window_and_the_leader(tmp_path: Path) -> None:
    stay, late, leaver = _job("stay"), _job("late", arrival_s=0.3), _job("leaver", iterations=3)
    since = time.time()
    _log(tmp_path, "stay", [since - 5.0])  # before `since`: does not open the window
    started: list[tuple[str, float]] = []
    stopped: list[tuple[str, float]] = []
    plan: dict[str, Any] = {"scheduled": {"stay", "leaver"}}

    def decided(e: JobEvent, doc: dict[str, Any]) -> bool:
        return (e.job in doc["scheduled"]) == (e.kind == "arrive")

    churn = JobChurn((stay, late, leaver), tmp_path, since, 0.2,
                     lambda j: started.append((j.id, time.time())),
                     lambda j: stopped.append((j.id, time.time())),
                     lambda: plan, decided)
    with churn:
        time.sleep(0.3)
        assert churn.opened is None and not started  # "leaver" has no iteration yet
        first = time.time()
        _log(tmp_path, "stay", [first])
        _log(tmp_path, "leaver", [first - 0.05])
        time.sleep(0.3)
        assert churn.opened == first + 0.2  # the later first iteration, then the warmup
        _log(tmp_path, "leaver", [churn.opened + 0.01, churn.opened + 0.02])
        time.sleep(0.3)
        assert not stopped  # two of its three iterations inside the window
        _log(tmp_path, "leaver", [churn.opened + 0.03])
        deadline = time.time() + 2
        while (len(started) < 1 or not stopped) and time.time() < deadline:
            time.sleep(0.05)
        plan["scheduled"] = {"stay", "late"}  # the leader's next plan takes both in
        time.sleep(0.3)
    assert [j for j, _ in started] == ["late"] and [j for j, _ in stopped] == ["leaver"]
    assert started[0][1] >= churn.opened + 0.3
    kinds = {e.job: e for e in churn.events}
    assert kinds["late"].kind == "arrive" and kinds["leaver"].kind == "leave"
    assert all(e.decided_s is not None and e.decided_s > 0 for e in churn.events)


def test_no_churn_no_thread(tmp_path: Path) -> None:
    with JobChurn((_job("a"),), tmp_path, 0.0, 1.0, lambda j: None, lambda j: None) as c:
        pass
    assert c.events == [] and c.opened is None
