"""`optimality.py --joint`: crux-full, TACCL* and crux-ps-pa against the joint brute-force
optimum over paths x levels (`_joint_case`), as a table, a CDF, JSON and the worst cases.

Levels as the trace simulation gives them (cruxd/sim/run.py `decide`): crux-full plans
with the fabric's K levels; TACCL*'s unique levels n-1..0 are squashed by `_fit_levels`
(its top K-1 jobs keep a level each, the others share the lowest), as the simulator does
for every policy without ideal levels; crux-ps-pa keeps one level per job (an ideal
fabric), so it may exceed the <= K-level optimum (a ratio above 1).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from typing import Any

import numpy as np
from _joint_case import run_joint
from tables import preamble, table  # bench/ is on sys.path when run as a script

from cruxd.sim.rates import solver

POLICIES = ("crux-full", "taccl*", "crux-ps-pa")
PCTS = (1, 5, 10, 25, 50)


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ratio = {p: np.array([r[f"u_{p}"] / r["optimum"] for r in rows]) for p in POLICIES}
    out: dict[str, Any] = {"cases": len(rows)}
    for p, r in ratio.items():
        out[p] = {"mean": float(r.mean()), "p5": float(np.percentile(r, 5)),
                  "min": float(r.min()), "optimal": float(np.mean(r >= 1 - 1e-9)),
                  "cdf": {str(q): float(np.percentile(r, q)) for q in PCTS}}
    full, taccl = ratio["crux-full"], ratio["taccl*"]
    out["crux_full_ge_taccl"] = float(np.mean(full >= taccl - 1e-12))
    out["crux_full_below_taccl_1pct"] = float(np.mean(full < taccl - 0.01))
    out["shared_host_cases"] = float(np.mean([r["shared_hosts"] > 0 for r in rows]))
    out["simulations_per_case"] = float(np.mean([r["simulations"] for r in rows]))
    return out


def report(args: argparse.Namespace, rows: list[dict[str, Any]], wall: float) -> None:
    s = summarise(rows)
    print(f"{len(rows)} cases (2-4 ToRs x 2 aggs, <= 20 hosts of 8 GPUs, one NIC each, "
          f"uplinks {args.oversubscription:g}:1, 5 ring all-reduce jobs, hosts shared in "
          f"{100 * s['shared_host_cases']:.0f} % of cases), utilisation / joint optimum "
          f"(every per-job spine choice and the policies' own paths x every assignment to "
          f"<= {args.levels} levels)")
    body = []
    for p in POLICIES:
        v = s[p]
        name = p + (" (1 level per job)" if p == "crux-ps-pa" else f" ({args.levels} levels)")
        body.append([name, f"{100 * v['mean']:.2f}%", f"{100 * v['p5']:.2f}%",
                     f"{100 * v['min']:.2f}%", f"{100 * v['optimal']:.1f}%",
                     *(f"{100 * v['cdf'][str(q)]:.2f}%" for q in PCTS)])
    print(table(["policy", "mean", "p5", "min", "optimal", *(f"p{q}" for q in PCTS)], body))
    print(f"crux-full >= taccl*: {100 * s['crux_full_ge_taccl']:.1f}% of cases; "
          f"crux-full < taccl* - 1 % of the optimum: "
          f"{100 * s['crux_full_below_taccl_1pct']:.1f}%")
    print(f"# {s['simulations_per_case']:.0f} component simulations per case (memoised), "
          f"rate solver {solver()}, wall time {wall:.1f} s with {args.workers} workers")
    if args.worst:
        worst(rows, args.worst)


def worst(rows: list[dict[str, Any]], n: int) -> None:
    ranked = sorted(rows, key=lambda r: r["u_crux-full"] / r["optimum"])[:n]
    print(f"\nthe {len(ranked)} worst cases for crux-full (re-run one with --only SEED); "
          "per job: level and the aggs its inter-ToR flows use ('-': within a ToR)")
    for r in ranked:
        print(f"seed {r['seed']}: {r['tors']} ToRs x {r['hosts_per_tor']} hosts, "
              f"{r['shared_hosts']} shared hosts; optimum {r['optimum']:.4f}, crux-full "
              f"{r['u_crux-full']:.4f} ({100 * r['u_crux-full'] / r['optimum']:.2f}%), "
              f"taccl* {r['u_taccl*']:.4f}, crux-ps-pa {r['u_crux-ps-pa']:.4f}")
        rows_ = [[j.split()[0], r["crux_full_decisions"][j.split()[0]],
                  r["optimum_decisions"][j.split()[0]], r["taccl_decisions"][j.split()[0]],
                  " ".join(j.split()[1:])] for j in r["jobs"]]
        print("  " + table(["job", "crux-full", "optimum", "taccl*", "hosts:GPUs, job"],
                           rows_).replace("\n", "\n  "))


def main_joint(args: argparse.Namespace) -> None:
    preamble(f"rate solver {solver()}")
    if not solver().startswith("C"):
        print("# warning: the numpy rate solver is ~10x slower", file=sys.stderr)
    seeds = args.only or [args.seed * 1_000_003 + i for i in range(args.cases)]
    tasks = [(s, args.levels, args.oversubscription) for s in seeds]
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with multiprocessing.Pool(args.workers) as pool:
        for i, row in enumerate(pool.imap_unordered(run_joint, tasks), 1):
            rows.append(row)
            el = time.perf_counter() - start
            print(f"[{i}/{len(tasks)}] seed {row['seed']}: crux-full "
                  f"{row['u_crux-full'] / row['optimum']:.4f} of the optimum, "
                  f"{row['simulations']} sims; {el:.0f} s, eta {el / i * (len(tasks) - i):.0f} s",
                  file=sys.stderr, flush=True)
    rows.sort(key=lambda r: seeds.index(r["seed"]))
    wall = time.perf_counter() - start
    report(args, rows, wall)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": sys.orig_argv, "levels": args.levels,
                       "oversubscription": args.oversubscription, "wall_s": wall,
                       "summary": summarise(rows), "cases": rows}, f, indent=1)
