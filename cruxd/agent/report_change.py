"""Whether the agent owes the leader a Report, and why (pure).

Every agent used to report every 5 s: 10,000 hosts made 2,000 Reports/s, more than the
leader's Python gRPC server answers on a core (docs/benchmarks.md). A Report now goes only
when something the leader plans on changed since the last one it took:
- the host's inventory (NICs, GPUs, sources);
- its jobs, or anything the leader or status reads of them other than the measurement;
- a measurement figure moving by more than `tolerance` of the last one sent, a figure
  becoming known or unknown, or its source changing (the leader's own hysteresis,
  `change_threshold` and `change_hold_s`, judges the rest);
- its path tables' shapes (paths found or lost), or a sweep toward a peer the leader asked
  it to probe again (the failure hold waits for those sweeps, by their time);
- and, as a safety net, `refresh_s` after the last one.
Liveness is the agent's open plan stream (cruxd/leader/rpcs.py); NIC link utilisation and
re-verified paths ride along with the next report that goes.
"""

from __future__ import annotations

from dataclasses import fields

from cruxd.control.records import AgentReport, LocalJob, Measurement, PathTable

_JOB_FIELDS = tuple(f.name for f in fields(LocalJob) if f.name != "measurement")


def why_report(last: AgentReport | None, new: AgentReport, age_s: float, refresh_s: float,
               tolerance: float, reprobe: frozenset[str] = frozenset()) -> str | None:
    """Why `new` should go, given `last` went `age_s` ago; None: it need not."""
    if last is None:
        return "first report"
    if new.host != last.host:
        return "inventory changed"
    before = {j.job_id: j for j in last.jobs}
    now = {j.job_id: j for j in new.jobs}
    if before.keys() != now.keys():
        return "jobs changed"
    for jid, job in now.items():
        old = before[jid]
        if any(getattr(job, f) != getattr(old, f) for f in _JOB_FIELDS):
            return f"job {jid} changed"
        if _moved(old.measurement, job.measurement, tolerance):
            return f"measurement of {jid} moved"
    old_paths = {t.dst_host: t for t in last.paths}
    new_paths = {t.dst_host: t for t in new.paths}
    if {d: t.shape() for d, t in old_paths.items()} != {d: t.shape() for d, t in
                                                        new_paths.items()}:
        return "paths changed"
    for dst in sorted(reprobe):
        if _swept_since(old_paths.get(dst), new_paths.get(dst)):
            return f"probed {dst} again"
    if age_s >= refresh_s:
        return "refresh"
    return None


def _moved(a: Measurement, b: Measurement, tolerance: float) -> bool:
    return a.source != b.source or a.moved(b, tolerance)


def _swept_since(old: PathTable | None, new: PathTable | None) -> bool:
    return new is not None and (old is None or new.probed_unix_ms > old.probed_unix_ms)
