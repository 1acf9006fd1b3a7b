"""bench/testbed.py's figures of one rig run beyond utilisation: the churn as it happened,
the link-down timings, and each job's live measurement against its own alone."""

from __future__ import annotations

from typing import Any

from tests.rig.testbed import Layout
from tests.rig.testbed_churn import LinkDown, cluster_recovery, recovery
from tests.rig.testbed_crux import comm_s, standalone_period
from tests.rig.testbed_metrics import cluster_utilization, job_stats
from tests.rig.testbed_run import Logs


def churn_as_run(layout: Layout, logs: Logs, lo: float,
                 hi: float) -> dict[str, tuple[float, float | None]]:
    """Each arriving or leaving job's timing as it happened in the window, for the
    simulator: its arrival from the window's start, and for a leaver the iterations it
    did in the window."""
    out: dict[str, tuple[float, float | None]] = {}
    for job in layout.jobs:
        if not job.churns:
            continue
        ranks = logs.get(job.id) or [[]]
        first = min((r[0]["t0"] for r in ranks if r), default=hi)
        inside = sum(1 for it in ranks[0] if it["t0"] >= lo)
        out[job.id] = (max(0.0, first - lo) if job.arrival_s > 0 else 0.0,
                       float(max(1, inside)) if job.iterations is not None else None)
    return out


def measured_vs_alone(layout: Layout, plan: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per job, t_j and the period the leader planned with (measured live, profiled) and
    the job's own alone (its hop's bytes at its slowest link; compute plus what the overlap
    does not hide), with the relative errors."""
    out = {}
    for job in layout.jobs:
        m = (plan.get(job.id) or {}).get("measurement") or {}
        t, p = float(m.get("comm_s") or 0.0), float(m.get("period_s") or 0.0)
        t0, p0 = comm_s(layout, job), standalone_period(layout, job)
        out[job.id] = {"comm_s": t, "alone_comm_s": t0, "comm_error": t / t0 - 1 if t0 else 0.0,
                       "period_s": p, "alone_period_s": p0,
                       "period_error": p / p0 - 1 if p0 else 0.0,
                       "source": str(m.get("source", ""))}
    return out


def link_down_result(logs: dict[str, Any], gpus: dict[str, int], down: LinkDown,
                     churn: dict[str, float | None], lo: float, hi: float,
                     bins: list[tuple[float, float]]) -> dict[str, Any]:
    """When the cable went, when the leader re-planned, when each job's iterations were
    back to their steady state, and the cluster's utilisation before and after."""
    t = churn["t_down"]
    assert t is not None
    jobs = {jid: recovery(ranks, t) for jid, ranks in logs.items()}
    rec = [j["recovered_s"] for j in jobs.values()]
    return {"leaf": down.leaf, "spine": down.spine, "at_s": t - lo,
            "decided_s": churn["decided_s"],
            "recovered_s": cluster_recovery(bins, t - lo),
            "jobs_recovered_s": None if None in rec else max(r for r in rec
                                                              if r is not None),
            "utilization_before": cluster_utilization(
                {j: job_stats(r, lo, t) for j, r in logs.items()}, gpus),
            "utilization_after": cluster_utilization(
                {j: job_stats(r, t, hi) for j, r in logs.items()}, gpus),
            "jobs": jobs}
