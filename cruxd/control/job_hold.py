"""Which multi-host jobs a re-plan waits for, so that a job event re-plans once (pure).

Each agent reports its own part of a job. A two-host job's arrival reached the leader as
"job arrived" from one host and "job grew" from the other, a second apart, and its
departure as "job left host" then "job ended": two re-plans per event, the first of them
for a job that was half there (the emulated testbed's churn run). A job says how many hosts
it spans (`LocalJob.nnodes`), so the leader holds such a re-plan until every host of an
arriving job reports it, and every host of a leaving job has stopped reporting it, or
until `job_settle_s` has passed since the first report of the event. Any other cause, and
a job that is whole, re-plans at once, taking the held causes with it: one incomplete job
must not hold up another job's first decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from cruxd.control.cluster import ClusterState
from cruxd.control.replan_stats import cause_kind

ARRIVING = ("job arrived", "job grew")
LEAVING = "job left host"
PROFILING = "profiling"  # an arriving job's window starts with its arrival


@dataclass(frozen=True)
class JobHold:
    start: float  # the event's first report (Unix s)
    until: float  # the longest the re-plan waits
    waiting: dict[str, str]  # job -> what it waits for ("1 of 2 hosts", ...)


def job_hold(state: ClusterState, causes: list[str], now: float, settle_s: float,
             since: float | None) -> JobHold | None:
    """The hold for these causes, or None: re-plan now. `since`: the start of the event
    already held for."""
    if settle_s <= 0 or not causes:
        return None
    start = since if since is not None else now
    if now >= start + settle_s:
        return None
    events = [(cause_kind(c), _job_of(c)) for c in causes]
    if any(kind not in (*ARRIVING, LEAVING, PROFILING) for kind, _ in events):
        return None
    hosts, nnodes = _reported(state, {jid for _, jid in events})
    # arriving jobs that lack reports from their other hosts (what comes by itself: not
    # probes toward a TCP job's ports, which agents learn from the plan's routes, so those
    # come after the arrival's plan and the plan after them moves the job once more)
    arriving = {jid: f"{hosts[jid]} of {nnodes[jid]} hosts reported" for kind, jid in events
                if kind in (*ARRIVING, PROFILING) and 0 < hosts[jid] < nnodes[jid]}
    waiting = {}
    for kind, jid in events:
        if kind in ARRIVING and jid in arriving:
            waiting[jid] = arriving[jid]
        elif kind in ARRIVING:
            return None  # a job that is whole now: plan it at once (it may be waiting to
            # start: crux-run gives its first decision agent.start_wait_s, 2 s)
        elif kind == LEAVING and hosts[jid]:
            waiting[jid] = f"{hosts[jid]} host(s) still report it"
        elif kind == PROFILING and jid not in arriving:
            return None  # the queue moved on to a job that is whole: plan its window now
    return JobHold(start, start + settle_s, waiting) if waiting else None


def _reported(state: ClusterState, jobs: set[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Per job, the live hosts reporting it and the most hosts any says it spans: a look at
    these jobs only (merging every job of 10,000 hosts took 60 ms, and the plan that
    follows merges them anyway)."""
    hosts, nnodes = dict.fromkeys(jobs, 0), dict.fromkeys(jobs, 0)
    for rec in state.agents.values():
        if rec.expired:
            continue
        for jid in jobs:
            if (part := rec.jobs.get(jid)) is not None:
                hosts[jid] += 1
                nnodes[jid] = max(nnodes[jid], part.nnodes)
    return hosts, nnodes


def _job_of(cause: str) -> str:
    """"job grew: J on H" -> J (a job id holds no spaces: validate.check_job_id)."""
    return cause.partition(":")[2].strip().split(" ", 1)[0]
