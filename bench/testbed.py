"""The emulated testbed: a scenario's jobs run for real on the namespace Clos, per mode,
beside the simulator's prediction for the same file (seed §6.2, Figs. 19-20).

    sudo .venv/bin/python bench/testbed.py examples/testbed-fig19-rig.json \\
        [--mode standalone,ecmp,crux,crux-hints,paths-only,levels-only]
        [--duration 60] [--scale 1e-3]
        [--link-down LEAF:SPINE@S] [--plot F.png] [--json]

The fabric is the scenario's, built from network namespaces with the kernel's ECMP and
HTB strict-priority queues on every switch port; link rates and the jobs' bytes are
scaled by `--scale` together, compute times are not (tests/rig/testbed.py). Each job is
one `tests/rig/ringjob.py` process per host: compute, then a ring all-reduce over TCP.

Modes: `standalone` (each job alone: the ideal), `ecmp` (no cruxd), `crux` (cruxd on every
host measuring every job live, W_j from replayed GPUs) and `crux-hints` (jobs declare their
profiles); see tests/rig/testbed_crux.py. `--link-down` fails a cable in those two
(tests/rig/testbed_churn.py); `--plot` draws utilisation over time per mode. A job with
`arrival_s` starts that long into the measured window, and one with `iterations` leaves
after that many iterations in it; the simulator then replays both as they happened.
For the crux modes the simulator also replays the plan that ran (its paths and levels).

Each of crux's two mechanisms alone, to measure its share on the kernel's queues: both are
`crux` (live, the same agents and leader) with the other mechanism taken away on the rig,
so the plan is made as crux makes it and nothing in cruxd changes.
    paths-only   crux's paths, no priorities: once every job is planned (after the
                 profiling windows, which need the top level to themselves), every switch
                 port puts all the levels' DSCPs in one class (`Fabric.one_class`), as a
                 fabric with one queue would. Not `[leader] levels = 1`, which config
                 accepts: with one level there is no profiling window (can_profile), so
                 live t_j would be measured under contention and could order, and so
                 route, the jobs differently from crux's plan; with K = 1 the planner's
                 paths are otherwise the same (path selection does not look at levels).
                 The simulator replays the paths that ran, every job on one level, and
                 predicts crux-full's plan at one level.
    levels-only  crux's levels, the kernel's ports and ECMP: the agents probe toward a
                 port the rings do not use, so the socket interposer gives each ring
                 connection its level's DSCP (its accepted end too) and leaves its source
                 port to the kernel, since a decided port selects a path toward the port
                 it was probed with only. The leader still plans paths (toward that other
                 port) and sets levels from them, as crux would; it does not know where
                 the kernel put the rings. The simulator replays the paths the kernel took
                 (counted per spine, as in ecmp mode) at the plan's levels, and predicts
                 crux's levels on its own ECMP hash (crux-pa's paths with compression).
                 `[leader] path_selection = "fabric"` (for adaptive-routing fabrics) is
                 the product's way to the same table entries (DSCP, no ports), but its
                 leader plans on leader.topology or else a star of the hosts, where rings
                 on distinct hosts never contend: the rig's leader has no topology file,
                 so its levels would not be crux's. Probing elsewhere keeps the leader's
                 plan, and with it the levels, exactly crux's.
Jobs arriving mid-window in paths-only profile in the one class.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from tables import preamble  # bench/ is on sys.path when run as a script

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.rig

from _testbed_figures import churn_as_run, link_down_result, measured_vs_alone
from _testbed_repeat import control_in_window, print_summary
from _testbed_report import plot, print_tables
from _testbed_sim import (
    hash_draws,
    replayed_levels,
    simulated,
    simulated_degraded,
    simulated_on,
)

from cruxd.cli.plots import need_matplotlib
from cruxd.errors import CruxError, UsageError
from cruxd.scenario import Scenario, load_scenario
from tests.rig.fabric import can_build
from tests.rig.testbed import Layout
from tests.rig.testbed_churn import (
    LinkDown,
    around,
)
from tests.rig.testbed_crux import run_crux
from tests.rig.testbed_metrics import (
    JobStats,
    cluster_utilization,
    job_stats,
    timeline,
    window_of,
)
from tests.rig.testbed_run import run_mode

MODES = ("standalone", "ecmp", "crux", "crux-hints", "paths-only", "levels-only")
SIM_POLICY = {"standalone": "standalone", "ecmp": "ecmp", "crux": "crux-full",
              "crux-hints": "crux-full", "paths-only": "paths-only",
              "levels-only": "levels-only"}
STEER = {"paths-only": "paths", "levels-only": "levels"}  # tests/rig/testbed_crux.py


def measure(layout: Layout, mode: str, workdir: Path, duration_s: float,
            warmup_s: float, levels: int, link_down: LinkDown | None) -> dict[str, Any]:
    if mode in ("crux", "crux-hints"):
        run = run_crux(layout, workdir, duration_s, levels, live=mode == "crux",
                       warmup_s=warmup_s, link_down=link_down)
    elif mode in STEER:  # live crux with one mechanism taken away
        run = run_crux(layout, workdir, duration_s, levels, live=True, warmup_s=warmup_s,
                       steer=STEER[mode])
    else:
        run = run_mode(layout, mode, workdir, duration_s, warmup_s)
    logs, carried, plan = run.logs, run.carried, run.plan
    gpus = {j.id: j.gpus for j in layout.jobs}
    stats: dict[str, JobStats] = {}
    if mode == "standalone":  # each job's own window
        for jid, ranks in logs.items():
            lo, hi = window_of({jid: ranks}, warmup_s)
            stats[jid] = job_stats(ranks, lo, hi)
    else:
        lo, hi = window_of(logs, warmup_s, {j.id for j in layout.jobs if j.churns})
        stats = {jid: job_stats(ranks, lo, hi) for jid, ranks in logs.items()}
    out: dict[str, Any] = {}
    if run.control[1]:
        out["control"] = control_in_window(*run.control)
    if mode in ("crux", *STEER):  # live: what the leader planned with, against the truth
        out["measured"] = measured_vs_alone(layout, plan)
    if mode != "standalone":  # the jobs ran one after another there: no common clock
        out["timeline"] = timeline(logs, gpus, lo, hi)
        out["window_s"] = hi - lo
        if any(j.churns for j in layout.jobs):
            out["churn"] = churn_as_run(layout, logs, lo, hi)
            out["events"] = around(logs, run.events, lo, hi)
    if run.link and link_down is not None:
        out["link_down"] = link_down_result(logs, gpus, link_down, run.link, lo, hi,
                                            out["timeline"])
        out["link_down"]["levels_after"] = {j: d.get("level", 0)
                                            for j, d in sorted(run.plan_end.items())}
        out["link_down"]["paths_after"] = layout.planned_paths(run.plan_end)
    return {"utilization": cluster_utilization(stats, gpus), **out,
            "paths": layout.observed_paths(carried),
            "jobs": {jid: {"utilization": s.utilization, "iteration_s": s.iteration_s,
                           "iterations": s.iterations, "gpus": gpus[jid],
                           "present_s": s.present_s,
                           **({k: plan[jid].get(k, 0) for k in ("level", "rank", "k",
                                                                 "intensity")}
                              if jid in plan else {}),
                           "spine_bytes": {f"{a}->{b}": c for (a, b), c in
                                           carried.get(jid, {}).items()}}
                     for jid, s in stats.items()}}


def run_modes(args: argparse.Namespace, sc: Scenario, layout: Layout, modes: list[str],
              down: LinkDown | None, sim: dict[str, dict[str, Any]],
              reuse: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every mode once, with the simulator's figures beside each; modes in `reuse` (an
    earlier run's standalone: the jobs alone do not vary) are taken from there."""
    result: dict[str, Any] = {"scenario": args.scenario, "scale": args.scale,
                              "modes": copy.deepcopy(reuse or {})}
    with (contextlib.nullcontext(args.workdir) if args.workdir
          else tempfile.TemporaryDirectory(prefix="crux-testbed-")) as tmp:
        for mode in modes:
            if mode in result["modes"]:
                continue
            m = measure(layout, mode, Path(tmp), args.duration, args.warmup, sc.config.levels,
                        down)
            # with jobs arriving or leaving, the simulator replays them as they happened
            churn = m.get("churn")
            horizon = m["window_s"] if churn else args.duration
            on = simulated(sc, horizon, churn) if churn else sim
            m["simulated"] = {"utilization": on[SIM_POLICY[mode]]["utilization"],
                              "jobs": on[SIM_POLICY[mode]]["jobs"]}
            if "link_down" in m and down is not None:
                cable = layout.leaf_ids[down.leaf], layout.spine_ids[down.spine]
                d = m["link_down"]
                d["simulated_after"] = simulated_degraded(sc, args.duration, *cable)
                if d["paths_after"]:
                    d["simulated_as_planned_after"] = simulated_degraded(
                        sc, args.duration, *cable, d["paths_after"], d["levels_after"])
                    d["paths_after"] = {j: {f"{a}->{b}": sp for (a, b), sp in v.items()}
                                        for j, v in d["paths_after"].items()}
            if mode == "ecmp":
                m["simulated"]["hash_draws"] = hash_draws(sc, horizon, churn=churn)
            if mode == "ecmp" and m["paths"]:
                m["simulated"]["observed_paths"] = simulated_on(sc, horizon, m["paths"],
                                                                churn)
            if mode not in ("standalone", "ecmp") and m["paths"]:  # what ran, replayed
                m["simulated"]["as_planned"] = simulated_on(
                    sc, horizon, m["paths"], churn, replayed_levels(mode, m["jobs"]))
            if mode == "levels-only" and m["paths"]:  # each mode draws its own ECMP
                # collisions: the levels' share on this run's draw is against these
                m["simulated"]["one_level"] = simulated_on(sc, horizon, m["paths"], churn)
            m["paths"] = {j: {f"{a}->{b}": sp for (a, b), sp in v.items()}
                          for j, v in m["paths"].items()}
            result["modes"][mode] = m
    base = result["modes"].get("ecmp", {}).get("utilization")
    alone = result["modes"].get("standalone", {}).get("utilization")
    for m in result["modes"].values():
        m["gain_over_ecmp"] = m["utilization"] / base - 1 if base else None
        m["fraction_of_standalone"] = m["utilization"] / alone if alone else None
        for sim_m in (m["simulated"], m["simulated"].get("observed_paths", {}),
                      m["simulated"].get("as_planned", {})):
            sim_u = sim_m.get("utilization")
            if sim_u is not None:
                sim_m["error"] = m["utilization"] / sim_u - 1 if sim_u else None
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", help="a scenario file (docs/scenario.md)")
    p.add_argument("--mode", default="standalone,ecmp,crux",
                   help=f"comma list of {', '.join(MODES)} (standalone,ecmp,crux); "
                        "paths-only and levels-only are live crux with only its paths "
                        "(switches: one class) or only its levels (the kernel's ports)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds per mode (60)")
    p.add_argument("--warmup", type=float, default=10.0,
                   help="seconds left out at the start of each window (10)")
    p.add_argument("--scale", type=float, default=1e-3,
                   help="link rates and bytes x this (1e-3: Gbit/s to Mbit/s)")
    p.add_argument("--workdir", metavar="DIR",
                   help="keep the jobs' logs and the daemons' configs and logs here "
                        "(default: a temporary directory, removed)")
    p.add_argument("--link-down", metavar="LEAF:SPINE@S",
                   help="crux, crux-hints: take the cable between LEAF and SPINE down S "
                        "seconds "
                        "into the measured window, and report the times to new decisions "
                        "and to settled utilisation (agents re-verify paths every "
                        "5 s in such a run)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="cluster GPU utilisation over the window, one line per mode "
                        "(needs matplotlib), with standalone's as a level")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run every mode N times (standalone once: the jobs alone do not "
                        "vary) and report each figure's median and spread (1)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    args = p.parse_args()
    modes = [m for m in args.mode.split(",") if m]
    if args.repeat < 1:
        p.error("--repeat: at least 1")
    bad = [m for m in modes if m not in MODES]
    if bad:
        p.error(f"--mode: unknown {', '.join(bad)} (built: {', '.join(MODES)})")
    if args.plot:
        try:
            need_matplotlib()
        except CruxError as exc:
            p.error(str(exc))
    if (why := can_build()) is not None:
        print(f"testbed: cannot build the fabric: {why}", file=sys.stderr)
        return 2
    try:
        sc = load_scenario(args.scenario)
        layout = Layout.of(sc, args.scale)
        down = LinkDown.parse(args.link_down) if args.link_down else None
        if down is not None:
            down.check(layout.leaves, layout.spines, args.duration)
        late = [j.id for j in layout.jobs if j.arrival_s >= args.duration - args.warmup]
        if late:
            raise UsageError(f"{', '.join(late)} would arrive after the measured window "
                             f"(arrival_s counts from its start, which is --warmup "
                             f"{args.warmup:g} s into the --duration {args.duration:g} s)")
        sim = simulated(sc, args.duration)
    except CruxError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 2
    if not args.json:
        preamble()
        print(f"# fabric: {layout.leaves} leaves x {layout.hosts_per_leaf} hosts, "
              f"{layout.spines} spines; host links {layout.host_mbit:g} Mbit/s, uplinks "
              f"{layout.uplink_mbit:g} Mbit/s (scale {args.scale:g})", flush=True)
    runs: list[dict[str, Any]] = []
    failed: list[str] = []
    workdir = args.workdir
    for k in range(args.repeat):
        if args.repeat > 1:
            print(f"[testbed] run {k + 1} of {args.repeat}", file=sys.stderr, flush=True)
            if workdir:  # each run's logs kept apart
                args.workdir = str(Path(workdir) / f"run{k + 1}")
        reuse = ({"standalone": runs[0]["modes"]["standalone"]}
                 if runs and "standalone" in modes else None)
        try:
            runs.append(run_modes(args, sc, layout, modes, down, sim, reuse))
        except AssertionError as exc:  # a mode that never got going: said, and counted
            if args.repeat == 1:
                raise
            failed.append(f"run {k + 1}: {exc}")
            print(f"[testbed] run {k + 1} failed: {exc}", file=sys.stderr, flush=True)
            continue
        if args.repeat > 1 and not args.json:
            print(f"\n# run {k + 1} of {args.repeat}")
            print_tables(runs[-1])
    if not runs:
        print("testbed: every run failed:\n" + "\n".join(failed), file=sys.stderr)
        return 1
    result = runs[-1]
    if args.plot:
        plot(Path(args.plot), result)
    if args.json:
        print(json.dumps(result if args.repeat == 1 else {"runs": runs, "failed": failed},
                         indent=1))
        return 0
    if args.repeat == 1:
        print_tables(result)
    else:
        print_summary(runs)
        for why in failed:
            print(f"failed, left out above: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
