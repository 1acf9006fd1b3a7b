"""Priority assignment with correction factors (seed §4.2, Eq. 3): P_j = k_j * I_j.

The reference job r (k_r = 1) is the one with the most network traffic per
iteration. For every other job j we put the pair (r, j) on one link and play both
priority orders (`pairwise`): gain_j is the link time j wins when it goes first,
loss_r what r loses then. By Theorem 1 the cluster computes I * S more when a job
transmits S more, so j should go first iff I_j * gain_j > I_r * loss_r, which is
k_j * I_j > I_r with

    k_j = gain_j / loss_r.

In the seed's Fig. 11 (job 1 reference) this gives 3 s / 2 s = 1.5. Degenerate
cases: neither job hurts the other in the window -> k_j = 1 (intensity decides);
only r is unaffected -> k_j = K_MAX; the ratio is clamped to [K_MIN, K_MAX].
The derivation is in docs/priority.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cruxd.errors import PlanningError
from cruxd.scheduler.pairwise import pair_gains, timing

K_MIN, K_MAX = 1e-3, 1e3
_EPS = 1e-9


@dataclass(frozen=True)
class Priorities:
    k: np.ndarray
    priority: np.ndarray
    rank: np.ndarray  # rank[i] = 0 for the highest priority
    reference: int | None
    # jobs with one tie number are ordered by id alone: their priorities tie (within the
    # tolerance), so their order must not constrain compression (compression.py `free`)
    tie: np.ndarray | None = None


def tie_groups(values: np.ndarray, tolerance: float = 0.0) -> np.ndarray:
    """Per value, its group number (0 for the largest): walking down from the largest,
    a value within `tolerance` (relative) of the first value of the current group joins
    it. Measured figures differ by noise; jobs in one group are ordered by id, so noise
    does not decide their order, and re-plans do not swap them back and forth."""
    group = np.zeros(len(values), dtype=np.int64)
    order = np.argsort(-np.asarray(values, dtype=np.float64), kind="stable")
    g, head, out = -1, 0.0, []
    for v in np.asarray(values, dtype=np.float64)[order].tolist():
        if g < 0 or not v >= head * (1.0 - tolerance):
            g, head = g + 1, v
        out.append(g)
    group[order] = out
    return group


def reference_job(traffic: np.ndarray, period: np.ndarray, ids: Sequence[str]) -> int | None:
    """Most bytes per iteration; ties by bytes per second, then by id."""
    candidates = [i for i in range(len(ids)) if traffic[i] > 0]
    if not candidates:
        return None
    return min(candidates, key=lambda i: (-traffic[i], -traffic[i] / period[i], ids[i]))


def assign(ids: Sequence[str], intensity: np.ndarray, compute_s: np.ndarray,
           overlap: np.ndarray, comm_s: np.ndarray, traffic: np.ndarray, *,
           reference: str | None = None, window_periods: float = 3.0,
           declared: np.ndarray | None = None, tie_tolerance: float = 0.0) -> Priorities:
    """k_j, P_j and unique ranks; P_j within `tie_tolerance` of each other tie, and
    ties go by id (`tie_groups`). Jobs without network traffic (comm_s == 0) keep
    k = 1 and infinite intensity: nothing of theirs can contend on the fabric. Jobs whose
    figures are only `declared` rank after every measured job, in their own P_j order."""
    n = len(ids)
    k = np.ones(n)
    period = np.maximum(compute_s, (1.0 - overlap) * compute_s + comm_s)
    if reference is not None:
        if reference not in ids:
            raise PlanningError(f"reference job {reference!r} is not among the jobs")
        ref: int | None = list(ids).index(reference)
        if traffic[ref] <= 0:
            raise PlanningError(f"reference job {reference!r} has no network traffic")
    else:
        ref = reference_job(traffic, period, ids)
    net = np.flatnonzero(comm_s > 0)
    if ref is not None and len(net):
        r = timing(compute_s[ref], overlap[ref], comm_s[ref])
        jt = timing(compute_s[net], overlap[net], comm_s[net])
        gain, loss = pair_gains(r, jt, window_periods)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(loss > _EPS, gain / loss, np.where(gain > _EPS, K_MAX, 1.0))
        k[net] = np.clip(ratio, K_MIN, K_MAX)
        k[ref] = 1.0
    prio = k * intensity
    unverified = declared if declared is not None else np.zeros(n, dtype=bool)
    tied, by_intensity = tie_groups(prio, tie_tolerance), tie_groups(intensity, tie_tolerance)
    keys = list(zip(unverified.tolist(), tied.tolist(), by_intensity.tolist(), ids, strict=True))
    order = sorted(range(n), key=keys.__getitem__)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    tie = np.unique([key[:3] for key in keys], axis=0, return_inverse=True)[1] if n else rank
    return Priorities(k=k, priority=prio, rank=rank, reference=ref,
                      tie=np.asarray(tie, dtype=np.int64).reshape(n))
