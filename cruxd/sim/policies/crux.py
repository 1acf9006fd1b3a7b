"""Crux and its ablations (seed §6.3), on top of the planner.

crux-pa:    priority assignment only (unique P_j = k_j I_j), ECMP paths;
crux-ps-pa: path selection + priority assignment, unique priorities;
crux-full:  path selection + priority assignment + compression to the levels;
crux-fair:  crux-full with a throughput floor (beyond the seed, §7.2): a job whose
            recent throughput fell below `floor` x standalone is lifted to the top
            level until it recovers.
"""

from __future__ import annotations

import numpy as np

from cruxd.model.view import ClusterView
from cruxd.scheduler.incremental import IncrementalPlanner
from cruxd.scheduler.planner import PlanConfig
from cruxd.sim.policies.base import Context, Decisions


class Crux:
    def __init__(self, name: str = "crux-full", *, paths: bool = True, compress: bool = True,
                 floor: float | None = None, replan_every_s: float | None = None) -> None:
        self.name = name
        self.paths, self.compress, self.floor = paths, compress, floor
        # the uncompressed ablations keep one level per job (an ideal fabric)
        self.ideal_levels = not compress
        # the floor needs fresh throughput: re-plan on a clock, not only on arrivals
        self.replan_every_s = replan_every_s
        # re-plans differ by an arrival or a departure: plan() exactly, at a fraction
        self.planner = IncrementalPlanner()

    def decide(self, ctx: Context) -> Decisions:
        if not ctx.jobs:
            return Decisions()
        n = len(ctx.jobs)
        # unique priorities need no compression: plan on one level, use the ranks
        levels = ctx.levels if self.compress else 1
        p = self.planner.plan(ClusterView(ctx.topology, ctx.jobs),
                              PlanConfig(levels=levels, dscp=tuple(range(levels)),
                                         seed=ctx.seed))
        if self.compress:
            level = {d.job: d.level for d in p.jobs}
        else:
            level = {d.job: n - 1 - d.rank for d in p.jobs}
        if self.floor is not None:
            # stay inside the fabric's levels: share the top one with the most intensive
            top = ctx.levels - 1 if self.compress else n
            for job, ratio in ctx.throughput.items():
                if job in level and ratio < self.floor:
                    level[job] = top
        if not self.paths:
            return Decisions(level=level)
        chosen: dict[str, list[np.ndarray]] = {j.id: [] for j in ctx.jobs}
        for f in p.flows:
            chosen[f.job].append(np.array(f.path, dtype=np.int64))
        return Decisions(level=level, paths={k: tuple(v) for k, v in chosen.items()})


def crux_pa() -> Crux:
    return Crux("crux-pa", paths=False, compress=False)


def crux_ps_pa() -> Crux:
    return Crux("crux-ps-pa", compress=False)


def crux_full() -> Crux:
    return Crux("crux-full")


def crux_fair(floor: float = 0.5, replan_every_s: float = 60.0) -> Crux:
    return Crux("crux-fair", floor=floor, replan_every_s=replan_every_s)
