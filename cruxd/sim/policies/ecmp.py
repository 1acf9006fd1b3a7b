"""No scheduling: every flow hashed by ECMP, every job on one level."""

from __future__ import annotations

from cruxd.sim.policies.base import Context, Decisions


class Ecmp:
    name = "ecmp"

    def decide(self, ctx: Context) -> Decisions:
        return Decisions()
