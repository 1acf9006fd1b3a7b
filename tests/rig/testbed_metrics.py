"""GPU utilisation from the emulated jobs' iteration logs (tests/rig/ringjob.py).

A rank's GPUs are busy during each iteration's compute, [t0, t0 + compute_s]. A job is
present from its first iteration's start to its last iteration's end (a job that
arrives or leaves mid-run is present for part of the window). A job's utilisation over
a window is its ranks' mean busy time over the time it was present in the window, and
the cluster's is busy GPU-seconds over allocated (present) GPU-seconds: the seed's §2.3
goal and what `cruxd/sim` reports.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection
from dataclasses import dataclass

Logs = list[list[dict[str, float]]]  # per rank, its iterations


@dataclass(frozen=True)
class JobStats:
    utilization: float
    iteration_s: float  # median over the window's whole iterations, rank 0
    iterations: int
    present_s: float = 0.0  # seconds of the window the job held its GPUs


def window_of(logs: dict[str, Logs], warmup_s: float,
              churn: Collection[str] = ()) -> tuple[float, float]:
    """From `warmup_s` after the last job's first iteration to the first job's last end,
    leaving out the jobs in `churn` (those that arrive or leave mid-run)."""
    steady = {j: ranks for j, ranks in logs.items() if j not in churn}
    starts = [ranks[0][0]["t0"] for ranks in steady.values() if ranks and ranks[0]]
    ends = [min(r[-1]["end"] for r in ranks if r) for ranks in steady.values()
            if ranks and all(ranks)]
    if not starts or not ends:
        return (0.0, 0.0)
    return (max(starts) + warmup_s, min(ends))


def presence(ranks: Logs, lo: float, hi: float) -> tuple[float, float]:
    """The part of [lo, hi] in which the job held its GPUs (empty: hi <= lo)."""
    if not ranks or not all(ranks):
        return (lo, lo)
    first = min(r[0]["t0"] for r in ranks)
    last = max(r[-1]["end"] for r in ranks)
    return (max(lo, first), min(hi, last))


def busy(iterations: list[dict[str, float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(hi, it["t0"] + it["compute_s"]) - max(lo, it["t0"]))
               for it in iterations)


def iteration_times(its: list[dict[str, float]], lo: float, hi: float) -> list[float]:
    """Lengths of the iterations that started at or after lo and ended by hi."""
    return [it["end"] - it["t0"] for it in its if it["t0"] >= lo and it["end"] <= hi]


def job_stats(ranks: Logs, lo: float, hi: float) -> JobStats:
    p_lo, p_hi = presence(ranks, lo, hi)
    if p_hi <= p_lo:
        return JobStats(0.0, float("nan"), 0)
    util = statistics.fmean(busy(r, p_lo, p_hi) / (p_hi - p_lo) for r in ranks)
    inside = iteration_times(ranks[0], lo, hi)
    return JobStats(util, statistics.median(inside) if inside else float("nan"), len(inside),
                    p_hi - p_lo)


def cluster_utilization(stats: dict[str, JobStats], gpus: dict[str, int]) -> float:
    """Busy over allocated GPU-seconds: each job weighs its GPUs times its presence."""
    total = sum(gpus[j] * s.present_s for j, s in stats.items())
    return (sum(s.utilization * gpus[j] * s.present_s for j, s in stats.items()) / total
            if total else 0.0)


def timeline(logs: dict[str, Logs], gpus: dict[str, int], lo: float, hi: float,
             bin_s: float = 2.0) -> list[tuple[float, float]]:
    """Cluster utilisation per `bin_s` bin of the window: (seconds from `lo`, util)."""
    out = []
    t = lo
    while t + bin_s <= hi + 1e-9:
        out.append((t - lo, cluster_utilization(
            {j: job_stats(r, t, t + bin_s) for j, r in logs.items()}, gpus)))
        t += bin_s
    return out
