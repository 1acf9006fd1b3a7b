"""Trace-driven simulation benchmark (seed §6.3-6.4, Fig. 23 and Fig. 25).

(a) GPU utilisation per policy, fabric and placement on a trace from `cruxd.sim.trace`
    (Poisson arrivals, the trace's size mix, the §6.3 model profiles of
    `cruxd.sim.profiles` at real sizes, lognormal durations, the placement policies of
    `cruxd.sim.placement`), next to the seed's Fig. 23 bars, and crux-full's gain over
    the best baseline; per trace, the share of jobs spanning more than one ToR group
    and more than one pod.
(c) With several placements and ecmp and crux-full among the policies: Fig. 25, ecmp
    and crux-full per placement next to the seed's bars.
(b) Simulator speed: wall time per run, simulated seconds per wall second.

    .venv/bin/python bench/simulate.py [--days D] [--jobs N] [--quick] [--seed S]
        [--policies a,b] [--topologies clos,double-sided,lingjun] [--budget-s S]
        [--placement none,hived,muri,crux-hints,packed] [--procs N]
        [--bytes-scale X] [--compute-scale X] [--window-s S] [--window-periods N]
        [--oversubscription R] [--levels K]
        [--sweep --oversubscription R1,R2 --levels K1,K2 [--plot F.png] [--json PATH]]

Fig. 23: the defaults (14 days, 5,000 jobs, every policy, none placement, Clos and
double-sided). Fig. 25: --topologies clos --policies ecmp,crux-full
--placement none,hived,muri,crux-hints.

(d) With --sweep: GPU utilisation per (R, K) cell and policy, crux-full's gain (bench/_sweep.py).

Policies not registered in `cruxd.sim.policies.POLICIES` are skipped with a note.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from _sim_run import Run, run_one
from _sweep import SWEEP_POLICIES, add_arguments, parse_grid, run_sweep
from tables import preamble, table  # bench/ is on sys.path when run as a script

from cruxd.model.topology import Topology
from cruxd.sim.placement import PLACEMENTS
from cruxd.sim.policies import POLICIES
from cruxd.sim.rates import solver
from cruxd.sim.trace import COMPUTE_SCALE, DAY_S, trace_jobs, trace_stats
from cruxd.topo.builders import double_sided, trace_clos
from cruxd.topo.lingjun import lingjun

TOPOLOGIES: dict[str, Callable[..., Topology]] = {
    "clos": trace_clos, "double-sided": double_sided, "lingjun": lingjun}
BASELINES = ("sincronia", "taccl*", "cassini")
CRUX = ("crux-pa", "crux-ps-pa", "crux-full")
EXTRA = ("ecmp", "crux-fair")
# the seed's Fig. 23 bars, and the gain its text states for crux over the baselines
FIG23: dict[str, dict[str, float]] = {
    "clos": {"sincronia": 0.39, "taccl*": 0.49, "cassini": 0.48, "crux-pa": 0.51,
             "crux-ps-pa": 0.62, "crux-full": 0.62},
    "double-sided": {"sincronia": 0.43, "taccl*": 0.46, "cassini": 0.45, "crux-pa": 0.48,
                     "crux-ps-pa": 0.51, "crux-full": 0.50},
}
SEED_GAIN = {"clos": "+13 % to +23 %", "double-sided": "+4 % to +7 %"}
# the seed's Fig. 25 (Clos): GPU utilisation without and with Crux per job scheduler
FIG25: dict[str, tuple[float, float]] = {"none": (0.39, 0.62), "muri": (0.59, 0.73),
                                         "hived": (0.64, 0.75)}
# a trace window of 5 s or 3 iterations of the slowest job, and iterations shorter than
# 3 s merged (trace_jobs' min_period_s); what each costs in accuracy is measured in
# docs/evaluation.md, "Simulator speed"
TRACE_WINDOW_S, TRACE_WINDOW_PERIODS, MIN_PERIOD_S = 5.0, 3.0, 3.0
def registered(name: str) -> str | None:
    """The registry's name for a policy ("taccl*" may be registered as "taccl")."""
    for cand in (name, name.rstrip("*")):
        if cand in POLICIES:
            return cand
    return None


def fmt(x: object, spec: str = ".3f") -> str:
    if isinstance(x, (int, float)) and math.isfinite(float(x)):
        return format(float(x), spec)
    return "-"


def gain_line(tname: str, runs: dict[str, Run]) -> str:
    util = {p: r.summary["gpu_utilization"] for p, r in runs.items() if r.summary}
    base = {p: u for p, u in util.items() if p in BASELINES and isinstance(u, float)}
    full = util.get("crux-full")
    seed = FIG23.get(tname, {})
    seed_best = max((seed[b] for b in BASELINES if b in seed), default=None)
    seed_txt = (f"seed text {SEED_GAIN[tname]}, seed bars {seed['crux-full'] / seed_best - 1:+.0%}"
                if seed_best else "no seed numbers")
    if not isinstance(full, float):
        return f"    crux-full gain over best baseline: n/a (crux-full not run); {seed_txt}"
    parts = []
    if base:
        best = max(base, key=lambda p: base[p])
        parts.append(f"over best baseline ({best} {base[best]:.3f}): {full / base[best] - 1:+.1%}")
    else:
        parts.append("over best baseline: n/a (no baseline registered)")
    ecmp = util.get("ecmp")
    if isinstance(ecmp, float):
        parts.append(f"over ecmp: {full / ecmp - 1:+.1%}")
    return f"    crux-full gain {'; '.join(parts)}  [{seed_txt}]"


def run_trace(topo: Topology, tname: str, placement: str, policies: list[str],
              args: argparse.Namespace) -> list[Run]:
    """One trace on one fabric with one placement, every policy on it; prints (a)."""
    t0 = time.perf_counter()
    jobs = trace_jobs(topo, jobs=args.jobs, days=args.days, seed=args.seed,
                      bytes_scale=args.bytes_scale, compute_scale=args.compute_scale,
                      placement=placement, min_period_s=args.min_period_s)
    st = trace_stats(jobs, topo)
    print(f"[{tname}, {placement} placement] {topo.name}: {len(topo.hosts)} hosts, "
          f"{st['gpus']} GPUs; trace {time.perf_counter() - t0:.2f} s: {st['jobs']} jobs, "
          f">= 128 GPUs {fmt(st.get('share_ge_128'), '.1%')}, largest {st.get('largest')}, "
          f"multi-host {fmt(st.get('multi_host'), '.1%')}, peak {st.get('peak_jobs')} jobs "
          f"/ {st.get('peak_gpus')} GPUs, mean {fmt(st.get('mean_gpus'), '.0f')} GPUs in "
          f"use, median duration {fmt(st.get('median_duration_s', 0) / 60, '.0f')} min; "
          f"spanning > 1 ToR {fmt(st.get('span_tors'), '.1%')}, > 1 pod "
          f"{fmt(st.get('span_pods'), '.1%')}")
    if args.procs > 1:
        with ProcessPoolExecutor(args.procs) as pool:
            done = list(pool.map(run_one, *zip(*[(jobs, topo, p, tname, args)
                                                  for p in policies], strict=True)))
    else:
        done = [run_one(jobs, topo, p, tname, args) for p in policies]
    per: dict[str, Run] = {}
    for r in done:
        r.placement = placement
        per[r.policy] = r
    seed = dict(FIG23.get(tname, {})) if placement == "none" else {}
    if tname == "clos" and placement in FIG25:
        seed["ecmp"], seed["crux-full"] = FIG25[placement]
    rows = []
    for p, r in per.items():
        s = r.summary or {}
        key = "taccl*" if p.startswith("taccl") else p
        rows.append([p, fmt(s.get("gpu_utilization")), fmt(seed.get(key), ".2f"),
                     fmt(s.get("mean_slowdown")), fmt(s.get("worst_throughput_ratio")),
                     fmt(s.get("network_utilization"), ".4f")])
    print(f"(a) {tname}, {placement} placement: GPU utilisation (busy / allocated GPU-s) "
          "vs the seed (Fig. 23; ecmp and crux-full on the Clos: Fig. 25)")
    print(table(["policy", "GPU util", "seed", "mean slowdown", "worst thr ratio",
                 "net util"], rows))
    print(gain_line(tname, per))
    print()
    return list(per.values())


def fig25(runs: list[Run]) -> None:
    """(c): ecmp and crux-full per placement and fabric, with the seed's Fig. 25 bars."""
    util = {(r.topo, r.placement, r.policy): r.summary["gpu_utilization"]
            for r in runs if r.summary}
    cells = sorted({(t, pl) for t, pl, _ in util}, key=lambda k: (k[0], PLACEMENTS.index(k[1])))
    rows = []
    for t, pl in cells:
        e, c = util.get((t, pl, "ecmp")), util.get((t, pl, "crux-full"))
        if not isinstance(e, float) or not isinstance(c, float):
            continue
        se, sc = FIG25.get(pl, (None, None)) if t == "clos" else (None, None)
        rows.append([t, pl, fmt(e), fmt(se, ".2f"), fmt(c), fmt(sc, ".2f"), f"{c / e - 1:+.1%}",
                     f"{sc / se - 1:+.1%}" if se and sc else "-"])
    if len({pl for _, pl in cells}) < 2 or not rows:
        return
    print("(c) Fig. 25: ecmp and crux-full per job scheduler (placement)")
    print(table(["fabric", "placement", "ecmp", "seed", "crux-full", "seed", "crux adds",
                 "seed adds"], rows))
    print()


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--days", type=float, default=14.0)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--quick", action="store_true",
                    help="6 hours, 90 jobs (the full trace's arrival rate)")
    ap.add_argument("--policies", help="default: every one; with --sweep "
                                       f"{','.join(SWEEP_POLICIES)}")
    ap.add_argument("--topologies", help="default: every one; with --sweep clos")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--placement", default="none",
                    help=f"comma list of trace placements ({', '.join(PLACEMENTS)}); one "
                         "table per placement")
    ap.add_argument("--procs", type=int, default=1,
                    help="run a trace's policies in this many processes")
    ap.add_argument("--bytes-scale", type=float, default=1.0,
                    help="multiply the jobs' network bytes (a knob; 1 in the headline runs)")
    ap.add_argument("--compute-scale", type=float, default=COMPUTE_SCALE,
                    help="multiply the profiles' compute times (default: the calibration, "
                         "see docs/evaluation.md)")
    ap.add_argument("--min-period-s", type=float, default=MIN_PERIOD_S,
                    help="simulate shorter iterations merged k at a time (0: exact)")
    ap.add_argument("--window-s", type=float, default=TRACE_WINDOW_S)
    ap.add_argument("--window-periods", type=float, default=TRACE_WINDOW_PERIODS)
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="stop a run after this much wall time (0: never)")
    add_arguments(ap)
    args = ap.parse_args(argv)
    try:
        ratios, levels = parse_grid(args)
    except ValueError as exc:
        ap.error(str(exc))
    args.levels = levels[0]  # a run's; the sweep sets its own per cell
    if args.policies is None:
        args.policies = ",".join(SWEEP_POLICIES if args.sweep else BASELINES + CRUX + EXTRA)
    if args.topologies is None:
        args.topologies = "clos" if args.sweep else ",".join(TOPOLOGIES)
    if args.quick:
        args.days, args.jobs = 0.25, 90
    preamble(f"numpy {np.__version__}", f"rate solver {solver()}")
    if args.procs < 1:
        ap.error("--procs must be >= 1")
    print(f"# trace: {args.jobs} jobs over {args.days:g} days, seed {args.seed}, "
          f"bytes x{args.bytes_scale:g}, compute x{args.compute_scale:g}; "
          f"oversubscription {','.join(f'{r:g}' for r in ratios)}; SimConfig(levels="
          f"{','.join(map(str, levels))}, window_s={args.window_s:g}, "
          f"window_periods={args.window_periods:g}), min_period_s {args.min_period_s:g}")
    policies: list[str] = []
    for p in [x.strip() for x in args.policies.split(",") if x.strip()]:
        name = registered(p)
        if name is None:
            print(f"# note: policy {p!r} is not registered yet, skipped")
        else:
            policies.append(name)
    placements = [x.strip() for x in args.placement.split(",") if x.strip()]
    for pl in placements:
        if pl not in PLACEMENTS:
            ap.error(f"unknown placement {pl!r} (known: {', '.join(PLACEMENTS)})")
    tnames = [t.strip() for t in args.topologies.split(",") if t.strip()]
    for t in tnames:
        if t not in TOPOLOGIES:
            ap.error(f"unknown topology {t!r} (known: {', '.join(TOPOLOGIES)})")
    if args.sweep:
        run_sweep(args, policies, tnames, TOPOLOGIES, ratios, levels)
        return
    start = time.perf_counter()
    runs: list[Run] = []
    print()
    for tname in tnames:
        topo = TOPOLOGIES[tname](oversubscription=ratios[0])
        for placement in placements:
            runs.extend(run_trace(topo, tname, placement, policies, args))
    fig25(runs)
    print("(b) simulator speed")
    rows = []
    for r in runs:
        rate = r.sim_s / r.wall_s if r.wall_s > 0 else math.inf
        rows.append([r.policy, r.topo, r.placement, f"{r.wall_s:.1f}", f"{r.sim_s / 3600:.1f}",
                     f"{rate:,.0f}", str(r.epochs), fmt(1e3 * r.wall_s / max(r.epochs, 1), ".1f"),
                     "" if r.summary else "stopped at --budget-s"])
    print(table(["policy", "fabric", "placement", "wall s", "sim h", "sim-s / wall-s", "epochs",
                 "ms / epoch", ""], rows))
    print("    target: 14 days, 5,000 jobs on a 2,000-GPU fabric in <= 600 s per run "
          f"(needs >= {14 * DAY_S / 600:,.0f} sim-s / wall-s).")
    print("    sim h counts from the first arrival to the run's end (horizon or budget).")
    print(f"\n# total wall time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
