"""GPU-intensity-based path selection (seed §4.1).

Jobs go from most to least intensive; each flow takes the least congested of its
candidate paths given everything placed so far.

Congestion, precisely: every placed flow f of job j puts a weighted load
    x_f = I_j * r_f   on each link of its path (`flow_loads`),
where r_f = 8 * bytes_f / period_j (Gbit/s: the flow's mean rate at the job's
standalone iteration time). The congestion of a candidate path p for a flow with
load x is the bottleneck ratio  max_{e in p} (X_e + x) / B_e,  X_e the load already
on link e, B_e its capacity. Weighting by intensity makes a link that carries an
intensive job look busier, so later (less intensive) jobs steer away from it and
intensive jobs end up on disjoint paths. Ties (within 1e-9 relative): the smaller
sum of ratios along the path, then the first path in canonical order.

The same routine, with byte counts as loads, picks a job's own paths in isolation
to estimate its standalone t_j (Eq. 2) before intensities are known.
"""

from __future__ import annotations

import numpy as np


def pick(cands: np.ndarray, inv_cap: np.ndarray, load: np.ndarray, x: float) -> int:
    """Index (into `cands`) of the least congested candidate for a flow of load x.

    `inv_cap` is 1 / capacity of every link of `cands` (same shape), computed once
    per candidate set: this runs once per flow and per plan, so it stays lean.
    """
    if len(cands) == 1:
        return 0
    ratio = load[cands]
    ratio += x
    ratio *= inv_cap
    worst: list[float] = ratio.max(axis=1).tolist()
    limit = min(worst) * (1 + 1e-9)
    tied = [i for i, w in enumerate(worst) if w <= limit]
    if len(tied) == 1:
        return tied[0]
    sums: list[float] = ratio[tied].sum(axis=1).tolist()
    return tied[sums.index(min(sums))]


def flow_loads(intensity: float, period: float, nbytes: np.ndarray) -> np.ndarray:
    """x_f of a job's flows, elementwise in IEEE doubles (the same numbers for one job
    or many). Weighted by I_j itself, not I_j / I_max: pick() is invariant to a common
    positive scaling of the loads only up to rounding, so a normaliser shared by all
    jobs would make one job's arrival move the choices of jobs it never meets."""
    out: np.ndarray = intensity * 8.0 * nbytes / period / 1e9
    return out


def standalone_comm_time(flows: list[tuple[np.ndarray, np.ndarray, float]],
                         capacity: np.ndarray, scratch: np.ndarray) -> float:
    """t_j = max_e M_{j,e} / B_e with the job's flows placed alone.

    `flows` holds (candidates, their inverse capacities, bytes); `scratch` is a zero
    array as long as the link list, returned zeroed.
    """
    touched: list[np.ndarray] = []
    for cands, inv_cap, nbytes in flows:
        path = cands[pick(cands, inv_cap, scratch, nbytes)]
        scratch[path] += nbytes
        touched.append(path)
    if not touched:
        return 0.0
    links = np.unique(np.concatenate(touched))
    t = float((scratch[links] * 8.0 / (capacity[links] * 1e9)).max())
    scratch[links] = 0.0
    return t
