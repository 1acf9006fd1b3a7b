"""Paths given by hand, through named switches: what a real fabric did, replayed.

The emulated testbed (bench/testbed.py) counts which spine each ring hop of an ECMP run
took. Hashing in the simulator draws other collisions than the kernel did, so to compare
the two models of the network, and not two draws of the hash, the simulator is given the
paths that were taken. `via[job][(src, dst)]` names a switch the flow from src to dst
crossed; flows not named are left to ECMP. Every job stays on one level unless `levels`
gives the levels a live plan put them on (larger = higher priority): then a crux run's
decisions are replayed as they ran, whatever the simulator's own planner would choose.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cruxd.errors import PlanningError
from cruxd.sim.policies.base import Context, Decisions, network_flows


class Pinned:
    def __init__(self, via: Mapping[str, Mapping[tuple[str, str], str]],
                 name: str = "pinned", levels: Mapping[str, int] | None = None) -> None:
        self.name = name
        self.via = {j: dict(v) for j, v in via.items()}
        self.levels = dict(levels or {})
        self.ideal_levels = True  # the levels that ran, applied as written

    def decide(self, ctx: Context) -> Decisions:
        paths: dict[str, tuple[np.ndarray | None, ...]] = {}
        for job in ctx.jobs:
            pins = self.via.get(job.id, {})
            out: list[np.ndarray | None] = []
            for fi in network_flows(job):
                f = job.flows[fi]
                switch = pins.get((f.src, f.dst))
                out.append(None if switch is None else _through(ctx, f.src, f.dst, switch))
            paths[job.id] = tuple(out)
        return Decisions(level={j.id: self.levels.get(j.id, 0) for j in ctx.jobs},
                         paths=paths)


def _through(ctx: Context, src: str, dst: str, switch: str) -> np.ndarray:
    """The candidate path from src to dst that crosses `switch`."""
    links = ctx.topology.links
    for path in ctx.finder.candidates(src, dst):
        if any(links[i].dst == switch for i in path):
            return np.asarray(path)
    raise PlanningError(f"no shortest path from {src} to {dst} crosses {switch}")
