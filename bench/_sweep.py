"""bench/simulate.py's fabric knobs and its sensitivity sweep (issue 32, "Crux at the
fabric's real limits").

--oversubscription R and --levels K set the trace fabric's ToR-up oversubscription
(every builder's `oversubscription`) and the priority levels it offers
(`SimConfig.levels`). With --sweep both take comma lists, and every policy runs on
every (fabric, R, K) cell, all cells' runs in one process pool (--procs): a table of
GPU utilisation per cell and policy, crux-full's gain over the best non-crux policy,
over taccl* and over spray, --plot F.png a heat map of those two gains per (R, K),
--json PATH the numbers.

The trace is drawn once per fabric and R (the capacities change, the jobs do not),
and K is the fabric's only change between the cells of one trace.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from _sim_run import run_one
from tables import table

from cruxd.errors import CruxError
from cruxd.model.topology import Topology
from cruxd.sim.trace import trace_jobs, trace_stats

SWEEP_POLICIES = ("ecmp", "spray", "taccl*", "crux-ps-pa", "crux-full", "spray+crux-pa")
# what crux-full is measured against: every policy without crux's priorities
NON_CRUX = ("ecmp", "spray", "taccl*", "sincronia", "cassini")
VERSUS = ("taccl*", "spray")  # the two heat maps

Cell = tuple[str, float, int]  # fabric, R, K


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--oversubscription", default="1", metavar="R",
                    help="ToR uplink oversubscription of the trace fabrics (default 1: 1:1); "
                         "with --sweep a comma list")
    ap.add_argument("--levels", default="8", metavar="K",
                    help="priority levels the fabric offers (default 8); with --sweep a "
                         "comma list")
    ap.add_argument("--sweep", action="store_true",
                    help="run every policy on every R x K cell (default policies: "
                         f"{','.join(SWEEP_POLICIES)}; default fabric: clos)")
    ap.add_argument("--plot", metavar="F.png",
                    help="with --sweep: heat maps of crux-full's gain over taccl* and spray")
    ap.add_argument("--json", metavar="PATH", help="with --sweep: also write the table as JSON")


def _numbers(text: str, flag: str, cast: Callable[[str], Any]) -> list[Any]:
    out = []
    for part in (p.strip() for p in text.split(",")):
        try:
            out.append(cast(part))
        except ValueError:
            raise ValueError(f"{flag}: {part!r} is not a number") from None
    return out


def parse_grid(args: argparse.Namespace) -> tuple[list[float], list[int]]:
    """The R and K values asked for; ValueError (for `ap.error`) on bad input."""
    ratios = _numbers(args.oversubscription, "--oversubscription", float)
    levels = _numbers(args.levels, "--levels", int)
    if any(not r > 0 or r == float("inf") for r in ratios):
        raise ValueError("--oversubscription: every R must be a finite number > 0")
    if any(k < 1 for k in levels):
        raise ValueError("--levels: every K must be an integer >= 1")
    if len(set(ratios)) != len(ratios) or len(set(levels)) != len(levels):
        raise ValueError("--oversubscription and --levels: each value once")
    if not args.sweep:
        if len(ratios) > 1 or len(levels) > 1:
            raise ValueError("several values of --oversubscription or --levels need --sweep")
        if args.plot or args.json:
            raise ValueError("--plot and --json go with --sweep")
    if args.plot:
        from cruxd.cli.plots import need_matplotlib  # optional extra: fail before any run

        try:
            need_matplotlib()
        except CruxError as exc:
            raise ValueError(str(exc)) from None
    return ratios, levels


def run_sweep(args: argparse.Namespace, policies: list[str], tnames: list[str],
              fabrics: dict[str, Callable[..., Topology]], ratios: list[float],
              levels: list[int]) -> None:
    """Every policy on every cell, `args.procs` runs at a time; prints the table."""
    start = time.perf_counter()
    todo: list[tuple[Cell, str, tuple[Any, ...]]] = []
    for tname in tnames:
        for r in ratios:
            topo = fabrics[tname](oversubscription=r)
            jobs = trace_jobs(topo, jobs=args.jobs, days=args.days, seed=args.seed,
                              bytes_scale=args.bytes_scale, compute_scale=args.compute_scale,
                              placement="none", min_period_s=args.min_period_s)
            st = trace_stats(jobs, topo)
            print(f"[{tname}, R={r:g}] {topo.name}: {len(topo.hosts)} hosts; trace "
                  f"{st['jobs']} jobs, peak {st.get('peak_jobs')} jobs", flush=True)
            for k in levels:
                cell_args = argparse.Namespace(**{**vars(args), "levels": k})
                todo += [((tname, r, k), p, (jobs, topo, p, tname, cell_args))
                         for p in policies]
    print(f"# {len(todo)} runs on {args.procs} processes", flush=True)
    util: dict[Cell, dict[str, float | None]] = {}
    wall: dict[Cell, dict[str, float]] = {}
    if args.procs > 1:
        with ProcessPoolExecutor(args.procs) as pool:
            futures: list[Future[Any]] = [pool.submit(run_one, *a) for _, _, a in todo]
            done = [f.result() for f in futures]
    else:
        done = [run_one(*a) for _, _, a in todo]
    for (cell, p, _), run in zip(todo, done, strict=True):
        u = run.summary["gpu_utilization"] if run.summary else None
        util.setdefault(cell, {})[p] = u if isinstance(u, float) else None
        wall.setdefault(cell, {})[p] = run.wall_s
    rows = [cell_row(cell, policies, util[cell]) for cell in util]
    print(f"\n(d) sensitivity: GPU utilisation per fabric, oversubscription R and levels K; "
          f"{args.days:g} days, {args.jobs} jobs, seed {args.seed}")
    print(table(["fabric", "R", "K", *policies, "best non-crux", "crux-full gain",
                 *(f"vs {v}" for v in VERSUS)], [r["cells"] for r in rows]))
    print("    crux-full gain: over the best of the non-crux policies run "
          f"({', '.join(p for p in NON_CRUX if p in policies)}) in the same cell.")
    slowest = max(((w, p) for c in wall for p, w in wall[c].items()), default=(0.0, "-"))
    print(f"    slowest run {slowest[0]:.1f} s ({slowest[1]}); sweep wall time "
          f"{time.perf_counter() - start:.1f} s")
    if args.json:
        doc = {"command": shlex.join(sys.orig_argv), "days": args.days, "jobs": args.jobs,
               "seed": args.seed, "policies": policies,
               "cells": [{**r["doc"], "wall_s": wall[r["cell"]]} for r in rows]}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    if args.plot:
        heat_map(Path(args.plot), tnames, ratios, levels, util)


def gain(util: dict[str, float | None], over: Sequence[str]) -> tuple[str | None, float | None]:
    """crux-full's utilisation over the best of `over` in one cell, minus 1."""
    full = util.get("crux-full")
    base = {p: u for p in over if (u := util.get(p)) is not None}
    if full is None or not base:
        return None, None
    best = max(base, key=lambda p: base[p])
    return best, full / base[best] - 1.0


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def cell_row(cell: Cell, policies: list[str], util: dict[str, float | None]
             ) -> dict[str, Any]:
    best, g = gain(util, NON_CRUX)
    vs = {v: gain(util, [v])[1] for v in VERSUS}
    return {"cell": cell,
            "cells": [cell[0], f"{cell[1]:g}", str(cell[2]),
                      *("-" if util.get(p) is None else f"{util[p]:.3f}" for p in policies),
                      best or "-", pct(g), *(pct(vs[v]) for v in VERSUS)],
            "doc": {"fabric": cell[0], "oversubscription": cell[1], "levels": cell[2],
                    "gpu_utilization": util, "best_non_crux": best,
                    "crux_full_gain": g, **{f"crux_full_vs_{v}": vs[v] for v in VERSUS}}}


def heat_map(path: Path, tnames: list[str], ratios: list[float], levels: list[int],
             util: dict[Cell, dict[str, float | None]]) -> None:
    """One row of panels per fabric, one panel per VERSUS policy: R down, K across,
    each square crux-full's gain over it (red: crux behind)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(len(tnames), len(VERSUS), squeeze=False,
                             figsize=(4.2 * len(VERSUS), 0.6 * len(ratios) * len(tnames) + 2))
    for row, tname in enumerate(tnames):
        for col, v in enumerate(VERSUS):
            ax = axes[row][col]
            g = np.array([[gain(util.get((tname, r, k), {}), [v])[1] for k in levels]
                          for r in ratios], dtype=float)  # None -> nan: no square
            lim = max(float(np.nanmax(np.abs(g))) if np.isfinite(g).any() else 0.0, 0.01)
            im = ax.imshow(g * 100, cmap="RdYlGn", vmin=-lim * 100, vmax=lim * 100)
            for (i, j), x in np.ndenumerate(g):
                ax.text(j, i, "-" if np.isnan(x) else f"{x:+.1%}", ha="center", va="center")
            ax.set_xticks(range(len(levels)), [str(k) for k in levels])
            ax.set_yticks(range(len(ratios)), [f"{r:g}" for r in ratios])
            ax.set_xlabel("priority levels K")
            ax.set_ylabel("oversubscription R")
            ax.set_title(f"{tname}: crux-full over {v}")
            fig.colorbar(im, ax=ax, label="GPU utilisation gain (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
