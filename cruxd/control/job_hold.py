"""Which multi-host jobs a re-plan waits for, so that a job event re-plans once (pure).

Each agent reports its own part of a job. A two-host job's arrival reached the leader as
"job arrived" from one host and "job grew" from the other, a second apart, and its
departure as "job left host" then "job ended": two re-plans per event, the first of them
for a job that was half there (the emulated testbed's churn run). A job says how many hosts
it spans (`LocalJob.nnodes`), so the leader holds such a re-plan until every host of an
arriving job reports it (and, for a TCP job, its hosts have probed toward its ports), and
every host of a leaving job has stopped reporting it, or until `job_settle_s` has passed
since the first report of the event. Any other cause re-plans at once, taking the held
causes with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cruxd.control.cluster import ClusterState, MergedJob
from cruxd.control.replan_stats import cause_kind

ARRIVING = ("job arrived", "job grew")
LEAVING = "job left host"
PROFILING = "profiling"  # an arriving job's window starts with its arrival
PATHS = "path table changed"  # an arriving job's hosts probe toward its ports


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
    merged = {m.job_id: m for m in state.merged_jobs()
              if m.job_id in {jid for _, jid in events}}
    arriving = {jid: why for kind, jid in events if kind in (*ARRIVING, PROFILING)
                and (why := _incomplete(state, merged.get(jid))) is not None}
    hosts = {h for jid in arriving for h, _ in merged[jid].hosts}
    failing = any(now - at < settle_s for at in state.down_hops.values())
    waiting = {}
    for kind, jid in events:
        if kind in ARRIVING and jid in arriving:
            waiting[jid] = arriving[jid]
        elif kind == LEAVING and jid in merged:
            waiting[jid] = f"{len(merged[jid].hosts)} host(s) still report it"
        elif kind == PROFILING and jid not in arriving:
            return None  # the queue moved on to a job that is whole: plan its window now
        elif kind == PATHS and (failing or jid not in hosts):
            return None  # a failure (failure_hold's), or not the held job's ports
        elif kind not in (*ARRIVING, LEAVING, PROFILING, PATHS):
            return None
    return JobHold(start, start + settle_s, waiting) if waiting else None


def _incomplete(state: ClusterState, m: MergedJob | None) -> str | None:
    """What an arriving job still lacks that comes by itself: reports from its other hosts,
    or probes toward its TCP ports along its ring (agents probe a new job's port at once;
    a plan before then gives it no source ports, and the next changes every job near it)."""
    if m is None:
        return None
    if len(m.hosts) < m.nnodes:
        return f"{len(m.hosts)} of {m.nnodes} hosts reported"
    ring = [h for h, _ in m.hosts]
    for src, dst in zip(ring, ring[1:] + ring[:1], strict=True):
        ports = m.ports_at(dst)
        rec = state.agents.get(src)
        if not ports or rec is None or src == dst or not rec.inventory.sweeps:
            continue
        table = rec.paths.get(dst)
        if table is None or not any(t.dport in ports for p in table.paths for t in p.tcp):
            return f"port {ports[0]} at {dst} not probed from {src} yet"
    return None


def _job_of(cause: str) -> str:
    """"job grew: J on H" -> J, "path table changed: H" -> H (job and host ids hold no
    spaces: validate.check_job_id, check_host_id)."""
    return cause.partition(":")[2].strip().split(" ", 1)[0]
