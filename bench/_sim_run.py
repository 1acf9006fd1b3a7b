"""One trace-driven run of one policy for bench/simulate.py and its sweep
(bench/_sweep.py): in a module of its own so that the process pool pickles it by
name, whichever script started the pool."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from cruxd.model.topology import Topology
from cruxd.sim.policies import make_policy
from cruxd.sim.run import SimConfig, SimJob, simulate
from cruxd.sim.trace import DAY_S

FAIR_REPLAN_S = 300.0  # crux-fair looks at every job at least this often (its guard_s)
# candidate paths kept per host pair: every one of a rail-pinned pair's on the
# double-sided fabric (128 with its two ToR cables), where 64 strided would skip a
# cable for every flow (docs/topologies.md)
MAX_PATHS = {"double-sided": 128}


class _OverBudget(Exception):
    pass


@dataclass
class Run:
    policy: str
    topo: str
    wall_s: float
    sim_s: float
    epochs: int
    summary: dict[str, object] | None  # None: stopped at the wall budget
    placement: str = "none"


def run_one(jobs: list[SimJob], topo: Topology, name: str, tname: str, args: argparse.Namespace
            ) -> Run:
    config = SimConfig(horizon_s=args.days * DAY_S, seed=args.seed, window_s=args.window_s,
                       window_periods=args.window_periods, levels=args.levels,
                       max_paths=MAX_PATHS.get(tname, SimConfig.max_paths),
                       replan_every_s=FAIR_REPLAN_S if name == "crux-fair" else None)
    epochs = 0
    reached = 0.0
    start = shown = time.perf_counter()

    def progress(now: float) -> None:
        nonlocal epochs, reached, shown
        epochs += 1
        reached = now
        wall = time.perf_counter()
        if wall - shown > 60:  # a heartbeat for long runs
            shown = wall
            print(f"    ... {name}: {wall - start:.0f} s wall, simulated {now / 3600:.1f} h, "
                  f"{epochs} epochs", flush=True)
        if args.budget_s and wall - start > args.budget_s:
            raise _OverBudget

    try:
        res = simulate(jobs, topo, make_policy(name), config, progress)
        summary: dict[str, object] | None = res.summary()
        sim_s = res.horizon_s
    except _OverBudget:
        summary, sim_s = None, reached
    wall = time.perf_counter() - start
    origin = min((s.arrival_s for s in jobs), default=0.0)
    u = summary["gpu_utilization"] if summary else "stopped at budget"
    print(f"    ... {name} ({tname}): {wall:.1f} s wall, {epochs} epochs, util {u}", flush=True)
    return Run(name, tname, wall, max(0.0, sim_s - origin), epochs, summary)
