"""Path selection again once the levels are known (issue 32): paths and levels together.

The first selection (`planner._select_paths`) weighs every job placed before by its
intensity, x = I * r (selection.py): right for jobs that end up on one level, where
they share a link fairly and a newcomer slows the intensive job down. But a fabric
has few levels, and compression decides who shares one. Once it has:

* jobs are placed again from the top level down (`by_level`), so a job is placed
  around every job that will take its share of a link first;
* a job i on a strictly higher level than j leaves j only what it does not use, and j
  cannot slow it down: i counts at its rate r_i, plus r_i * t_i / period_j for the
  bursts j must wait out (scaled by I_j, to compare with j's own weighted loads);
* a job on the same level counts as before, I_i * r_i: they will share fairly, so j
  keeps off the links of intensive jobs it would share with.

With one level this is the first selection; with a level per job (`ideal_levels`, the
simulator's uncompressed ablations) every earlier job is above. The planner alternates
this selection and compression a bounded number of rounds (`REFINE_ROUNDS`), stopping
once the paths repeat.

Why it matters: with the intensity weighting alone, a weak job steered all its flows
off the links an intensive job used, onto one uplink of its own, at half its rate,
where under strict priority it would have lost only the few percent the intensive
job sends (bench/optimality.py --joint, docs/scheduler.md "Level-aware planning").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cruxd.scheduler.flow_paths import FlowPaths
from cruxd.scheduler.selection import flow_loads, pick

REFINE_ROUNDS = 2  # re-selections after the first: the second rarely moves a path

Choices = list[tuple[int, ...]]  # per job, the chosen candidate of each flow


def by_level(order: Sequence[int], rank: np.ndarray, level: np.ndarray | None) -> list[int]:
    """The order of the level-aware selection: from the top level down, so that a job
    is placed around every job that will take its rate first; within a level, the
    first selection's `order` (the most intensive first). With a level per job
    (`level` None): by priority `rank`."""
    if level is None:
        return sorted(order, key=lambda ji: int(rank[ji]))
    pos = {ji: p for p, ji in enumerate(order)}
    return sorted(order, key=lambda ji: (-int(level[ji]), pos[ji]))


def reselect_by_level(order: Sequence[int], flows: Sequence[list[FlowPaths]],
                      nbytes: Sequence[list[float]], intensity: np.ndarray,
                      period: np.ndarray, comm: np.ndarray, level: np.ndarray | None,
                      n_links: int) -> Choices:
    """Each flow's candidate, jobs in `order` (`by_level`), knowing the jobs' levels
    (`level`; None: every job on a level of its own, in `order`; `nbytes` per flow):
    every job placed before is on the same level or above. Flows' `choice` is left alone: the
    incremental planner keeps the first selection there."""
    out: Choices = [() for _ in flows]
    weighted: dict[int, np.ndarray] = {}  # per level: sum of I_i r_i placed so far
    rate: dict[int, np.ndarray] = {}  # per level: sum of r_i
    burst: dict[int, np.ndarray] = {}  # per level: sum of r_i t_i
    seen = np.zeros(n_links)
    for ji in order:
        fl = flows[ji]
        if not fl:
            continue
        lv = 0 if level is None else int(level[ji])
        size = np.array(nbytes[ji])
        x = flow_loads(float(intensity[ji]), float(period[ji]), size)
        r = flow_loads(1.0, float(period[ji]), size)
        links = np.unique(np.concatenate([f.cands.ravel() for f in fl]))
        seen[links] = 0.0
        for other in weighted:
            if level is None or other > lv:  # above: it takes its rate first
                seen[links] += float(intensity[ji]) * (
                    rate[other][links] + burst[other][links] / float(period[ji]))
            else:
                seen[links] += weighted[other][links]
        if lv not in weighted:
            weighted[lv], rate[lv], burst[lv] = (np.zeros(n_links), np.zeros(n_links),
                                                 np.zeros(n_links))
        w_lv, r_lv, b_lv = weighted[lv], rate[lv], burst[lv]
        t_j = float(comm[ji])
        picked = []
        for f, xf, rf in zip(fl, x.tolist(), r.tolist(), strict=True):
            c = pick(f.cands, f.inv_cap, seen, xf)
            path = f.cands[c]
            seen[path] += xf
            w_lv[path] += xf
            r_lv[path] += rf
            b_lv[path] += rf * t_j
            picked.append(c)
        out[ji] = tuple(picked)
    return out
