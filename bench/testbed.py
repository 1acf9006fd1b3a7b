"""The emulated testbed: a scenario's jobs run for real on the namespace Clos, per mode,
beside the simulator's prediction for the same file (seed §6.2, Figs. 19-20).

    sudo .venv/bin/python bench/testbed.py examples/testbed-fig19-rig.json \\
        [--mode standalone,ecmp,crux,crux-hints] [--duration 60] [--scale 1e-3] [--json]

The fabric is the scenario's, built from network namespaces with the kernel's ECMP and
HTB strict-priority queues on every switch port; link rates and the jobs' bytes are
scaled by `--scale` together, compute times are not (tests/rig/testbed.py). Each job is
one `tests/rig/ringjob.py` process per host: compute, then a ring all-reduce over TCP.

Modes: `standalone` (each job alone: the ideal), `ecmp` (no cruxd), `crux` (cruxd on every
host measuring every job live, W_j from replayed GPUs) and `crux-hints` (jobs declare their
profiles); see tests/rig/testbed_crux.py. Churn, link failure and --plot are not built yet.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from tables import preamble, table  # bench/ is on sys.path when run as a script

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.rig

from cruxd.errors import CruxError
from cruxd.scenario import load_scenario
from cruxd.scenario.simulation import simulation_of
from cruxd.sim.run import simulate
from tests.rig.fabric import can_build
from tests.rig.testbed import Layout, run_mode
from tests.rig.testbed_crux import run_crux
from tests.rig.testbed_metrics import (
    JobStats,
    cluster_utilization,
    job_stats,
    window_of,
)

MODES = ("standalone", "ecmp", "crux", "crux-hints")
SIM_POLICY = {"standalone": "standalone", "ecmp": "ecmp", "crux": "crux-full",
              "crux-hints": "crux-full"}


def simulated(path: str, duration_s: float) -> dict[str, dict[str, Any]]:
    """The simulator on the same file: per policy, cluster and per-job utilisation."""
    sc = load_scenario(path)
    jobs, settings = simulation_of(sc, policies=["ecmp", "crux-full"], horizon_s=duration_s)
    out: dict[str, dict[str, Any]] = {}
    for name, policy in settings.runs:
        res = simulate(jobs, sc.view.topology, policy, settings.config)
        out[name] = {"utilization": res.gpu_utilization,
                     "jobs": {r.job: r.busy_gpu_s / (r.gpus * r.active_s) if r.active_s else 0.0
                              for r in res.jobs}}
    # alone, a job computes compute_s of every standalone period (the same in every run)
    spec = {j.id: j for j in sc.view.jobs}
    alone = {r.job: spec[r.job].compute_s / r.standalone_period_s for r in res.jobs}
    gpus = {r.job: r.gpus for r in res.jobs}
    out["standalone"] = {"utilization": sum(alone[j] * gpus[j] for j in alone)
                         / sum(gpus.values()), "jobs": alone}
    return out


def measure(layout: Layout, mode: str, workdir: Path, duration_s: float,
            warmup_s: float, levels: int) -> dict[str, Any]:
    plan: dict[str, Any] = {}
    if mode in ("crux", "crux-hints"):
        logs, carried, plan = run_crux(layout, workdir, duration_s, levels, live=mode == "crux")
    else:
        logs, carried = run_mode(layout, mode, workdir, duration_s)
    gpus = {j.id: j.gpus for j in layout.jobs}
    stats: dict[str, JobStats] = {}
    if mode == "standalone":  # each job's own window
        for jid, ranks in logs.items():
            lo, hi = window_of({jid: ranks}, warmup_s)
            stats[jid] = job_stats(ranks, lo, hi)
    else:
        lo, hi = window_of(logs, warmup_s)
        stats = {jid: job_stats(ranks, lo, hi) for jid, ranks in logs.items()}
    return {"utilization": cluster_utilization(stats, gpus),
            "jobs": {jid: {"utilization": s.utilization, "iteration_s": s.iteration_s,
                           "iterations": s.iterations, "gpus": gpus[jid],
                           **({"level": plan[jid].get("level", 0)} if jid in plan else {}),
                           "spine_bytes": {f"{a}->{b}": c for (a, b), c in
                                           carried.get(jid, {}).items()}}
                     for jid, s in stats.items()}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", help="a scenario file (docs/scenario.md)")
    p.add_argument("--mode", default="standalone,ecmp,crux",
                   help=f"comma list of {', '.join(MODES)} (standalone,ecmp,crux)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds per mode (60)")
    p.add_argument("--warmup", type=float, default=10.0,
                   help="seconds left out at the start of each window (10)")
    p.add_argument("--scale", type=float, default=1e-3,
                   help="link rates and bytes x this (1e-3: Gbit/s to Mbit/s)")
    p.add_argument("--workdir", metavar="DIR",
                   help="keep the jobs' logs and the daemons' configs and logs here "
                        "(default: a temporary directory, removed)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    args = p.parse_args()
    modes = [m for m in args.mode.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        p.error(f"--mode: unknown {', '.join(bad)} (built: {', '.join(MODES)})")
    if (why := can_build()) is not None:
        print(f"testbed: cannot build the fabric: {why}", file=sys.stderr)
        return 2
    try:
        sc = load_scenario(args.scenario)
        layout = Layout.of(sc, args.scale)
        sim = simulated(args.scenario, args.duration)
    except CruxError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 2
    if not args.json:
        preamble()
        print(f"# fabric: {layout.leaves} leaves x {layout.hosts_per_leaf} hosts, "
              f"{layout.spines} spines; host links {layout.host_mbit:g} Mbit/s, uplinks "
              f"{layout.uplink_mbit:g} Mbit/s (scale {args.scale:g})", flush=True)
    result: dict[str, Any] = {"scenario": args.scenario, "scale": args.scale, "modes": {}}
    with (contextlib.nullcontext(args.workdir) if args.workdir
          else tempfile.TemporaryDirectory(prefix="crux-testbed-")) as tmp:
        for mode in modes:
            m = measure(layout, mode, Path(tmp), args.duration, args.warmup, sc.config.levels)
            m["simulated"] = {"utilization": sim[SIM_POLICY[mode]]["utilization"],
                              "jobs": sim[SIM_POLICY[mode]]["jobs"]}
            result["modes"][mode] = m
    base = result["modes"].get("ecmp", {}).get("utilization")
    alone = result["modes"].get("standalone", {}).get("utilization")
    for m in result["modes"].values():
        m["gain_over_ecmp"] = m["utilization"] / base - 1 if base else None
        m["fraction_of_standalone"] = m["utilization"] / alone if alone else None
        sim_u = m["simulated"]["utilization"]
        m["simulated"]["error"] = m["utilization"] / sim_u - 1 if sim_u else None
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    rows = [[mode, f"{m['utilization']:.3f}", _pct(m["gain_over_ecmp"]),
             _num(m["fraction_of_standalone"]), f"{m['simulated']['utilization']:.3f}",
             _pct(m["simulated"]["error"])] for mode, m in result["modes"].items()]
    print(table(["mode", "GPU util", "vs ecmp", "of standalone", "simulated", "error"], rows))
    for mode, m in result["modes"].items():
        print(f"\n{mode}")
        print(table(["job", "GPUs", "iteration s", "iterations", "utilisation"],
                    [[j, s["gpus"], f"{s['iteration_s']:.3f}", s["iterations"],
                      f"{s['utilization']:.3f}"] for j, s in m["jobs"].items()]))
    return 0


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


if __name__ == "__main__":
    sys.exit(main())
