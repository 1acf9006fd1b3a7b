"""Adaptive routing / ideal per-packet spraying (Spectrum-X, InfiniBand AR, UEC):
the fabric splits every flow's bytes evenly over all its equal-cost paths, so no two
flows collide by a hash (`running.job_load`). See docs/baselines.md.

spray:          the fabric sprays, every job on one level (no scheduler).
spray+crux-pa:  the fabric sprays, crux sets the priorities only.

Which priorities for spray+crux-pa: crux-pa proper gives every job a level of its own
(unique P_j, `ideal_levels`), which no fabric has, so it would not feel the number
of levels K at all. On a real spraying fabric crux can only hand out DSCP levels, so
here they are what crux-full hands out: the planner's levels compressed to the
fabric's K, with the paths the planner chose left unused (the fabric routes). The
compression's contention graph comes from those planned paths, not the sprayed ones:
two jobs kept apart by crux's paths may share links once sprayed and still get
merged onto one level. That is what running crux's leader on such a fabric does today.
"""

from __future__ import annotations

from dataclasses import replace

from cruxd.sim.policies.base import Context, Decisions
from cruxd.sim.policies.crux import Crux


class Spray:
    name = "spray"

    def decide(self, ctx: Context) -> Decisions:
        return Decisions(spray=True)


class SprayCruxPa(Crux):
    """crux-full's compressed levels (paths dropped) on a spraying fabric."""

    def __init__(self) -> None:
        super().__init__("spray+crux-pa", paths=False, compress=True)

    def decide(self, ctx: Context) -> Decisions:
        return replace(super().decide(ctx), spray=True)
