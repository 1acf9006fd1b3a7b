"""Levels given by hand (what-if, and the seed's forced orders in Figs. 11-12)."""

from __future__ import annotations

from collections.abc import Mapping

from cruxd.sim.policies.base import Context, Decisions


class Fixed:
    def __init__(self, levels: Mapping[str, int], name: str = "fixed") -> None:
        self.name = name
        self.levels = dict(levels)
        self.ideal_levels = True  # given by hand: applied as written

    def decide(self, ctx: Context) -> Decisions:
        return Decisions(level={j.id: self.levels.get(j.id, 0) for j in ctx.jobs})
