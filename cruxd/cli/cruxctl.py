"""cruxctl: operate and ask crux what it would do.

Exit status: 0 success; 1 an unexpected internal error; 2 bad input (a scenario
or topology file, an argument) reported as one line on stderr; 3 the agent or
leader did not answer (status, jobs, plan --live).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cruxd import __version__
from cruxd.cli import (
    completion_cmd,
    doctor_cmd,
    hints_cmd,
    live_cmd,
    measure_cmd,
    place_cmd,
    probe_cmd,
    table_cmd,
    unit_cmd,
)
from cruxd.cli.common import DEFAULT_SCENARIO
from cruxd.cli.common import console as _console
from cruxd.cli.common import resolve_scenario as _resolve
from cruxd.cli.exits import run_command
from cruxd.errors import PlanningError, ScenarioError, UsageError
from cruxd.scenario.shipped import bundled_names


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cruxctl", description="Operate crux and ask what it would do.",
        epilog="Exit status: 0 ok, 1 internal error, 2 bad input, 3 agent/leader unreachable.")
    p.add_argument("--version", action="version", version=f"cruxctl {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    pl = sub.add_parser(
        "plan", help="plan paths, priorities and levels for a scenario (what-if)",
        description="Plan a scenario: GPU intensity, path selection, priority assignment "
                    "with correction factors, compression to the switch levels, DSCP. "
                    "The scenario format is in docs/scenario.md.",
        epilog=f"Bundled scenarios: {', '.join(bundled_names())}. "
               "Exit status: 0 ok, 1 internal error, 2 bad input.")
    pl.add_argument("--live", action="store_true",
                    help="show the leader's current plan instead of planning a scenario")
    pl.add_argument("--socket", metavar="PATH", help="with --live: the agent's socket")
    pl.add_argument("--config", metavar="FILE", type=Path,
                    help="with --live: socket path and TLS files from this cruxd configuration")
    pl.add_argument("--leader", metavar="HOST:PORT", help="with --live: ask this leader")
    pl.add_argument("scenario", nargs="?", metavar="SCENARIO",
                    help=f"a scenario file (.json/.yaml) or a bundled name "
                         f"(default: {DEFAULT_SCENARIO})")
    pl.add_argument("--levels", type=int, metavar="K",
                    help="priority levels to compress to (overrides the scenario's)")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.add_argument("--flows", type=int, default=20, metavar="N",
                    help="flows to list in the table (default 20)")

    sm = sub.add_parser(
        "simulate", help="simulate the scenario's jobs under scheduling policies",
        description="Simulate the scenario's jobs iteration by iteration (compute, then "
                    "collectives sharing the fabric by priority and max-min fair share) under "
                    "each policy, and compare GPU utilisation and per-job slowdown. The "
                    "simulation fields of a scenario are in docs/scenario.md, 'Simulation'.",
        epilog="Policies: ecmp, crux-pa, crux-ps-pa, crux-full, crux-fair, fixed (levels from "
               "the scenario's simulate.fixed_levels) and the baselines registered in "
               "cruxd.sim.policies. Exit status: 0 ok, 1 internal error, 2 bad input.")
    sm.add_argument("scenario", metavar="SCENARIO",
                    help="a scenario file (.json/.yaml) or a bundled name")
    sm.add_argument("--policy", metavar="P[,P...]",
                    help="policies to compare, comma-separated (default: the scenario's "
                         "simulate.policies, else ecmp,crux-full)")
    sm.add_argument("--horizon", type=float, metavar="T",
                    help="seconds to simulate (overrides simulate.horizon_s; needed when a "
                         "job has no iteration budget and the scenario gives no horizon)")
    sm.add_argument("--seed", type=int, metavar="S",
                    help="seed of ECMP hashing and planning (default: the scenario's seed, 0)")
    sm.add_argument("--levels", type=int, metavar="K",
                    help="priority levels of the fabric (overrides simulate.levels; default 8)")
    sm.add_argument("--json", action="store_true", help="print the results as JSON")
    sm.add_argument("--plot", type=Path, metavar="FILE.png",
                    help="write a figure: utilisation over time and per-job slowdown (needs "
                         "matplotlib: pip install 'crux[plot]')")
    st = sub.add_parser(
        "status", help="the running system: leader, agents, jobs and the last plan",
        description="Ask the local agent (which asks the leader) or the leader directly for "
                    "the cluster's state: agents and whether they are connected, jobs with "
                    "their state, I_j, k_j, level, DSCP, chosen paths and what the shims "
                    "applied.",
        epilog="Exit status: 0 ok, 1 internal error, 2 bad input, 3 agent/leader unreachable.")
    live_cmd.add_target_args(st)
    st.add_argument("job", nargs="?", metavar="JOB",
                    help="explain one job: its level and why (I_j, k_j, the jobs it yields "
                         "to on which links), its paths and ports, and what is applied")
    st.add_argument("--local", action="store_true",
                    help="only the local agent's view (do not ask the leader)")
    jb = sub.add_parser(
        "jobs", help="jobs registered with the local agent",
        description="List the jobs registered on this host with their measured (or declared) "
                    "W_j, t_j and iteration period.",
        epilog="Exit status: 0 ok, 1 internal error, 2 bad input, 3 agent unreachable.")
    live_cmd.add_target_args(jb, leader=False)
    probe_cmd.add_parser(sub)
    measure_cmd.add_parser(sub)
    hints_cmd.add_parser(sub)
    place_cmd.add_parser(sub)
    table_cmd.add_parser(sub)
    completion_cmd.add_parser(sub, _parser)
    doctor_cmd.add_parser(sub)
    unit_cmd.add_parser(sub)
    return p


def cmd_plan(args: argparse.Namespace) -> int:
    from cruxd.cli.plan_view import plan_json, print_plan
    from cruxd.scheduler import plan

    if args.live:
        if args.scenario or args.levels is not None:
            raise UsageError("--live shows the running plan; it takes no SCENARIO or --levels")
        return live_cmd.cmd_plan_live(args)
    if args.socket or args.leader or args.config:
        raise UsageError("--socket, --config and --leader go with --live")

    if args.levels is not None and args.levels < 1:
        raise UsageError("--levels must be >= 1")
    from cruxd.scenario import load_scenario

    path = _resolve(args.scenario)
    sc = load_scenario(path, levels=args.levels)
    start = time.perf_counter()
    try:
        result = plan(sc.view, sc.config)
    except PlanningError as exc:  # e.g. hosts with no path between them: blame the file
        raise ScenarioError(f"cannot plan: {exc}", where=str(path)) from None
    latency = time.perf_counter() - start
    if args.json:
        json.dump(plan_json(sc, result, latency), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_plan(_console(), sc, result, latency, max_flows=max(0, args.flows))
    return 0


def _policy_list(arg: str | None) -> list[str] | None:
    if arg is None:
        return None
    names = [n.strip() for n in arg.split(",")]
    if not all(names):
        raise UsageError(f"--policy {arg!r}: expected names separated by commas")
    return names


def cmd_simulate(args: argparse.Namespace) -> int:
    from cruxd.cli.simulate_cmd import print_simulation, run_policies, simulate_json
    from cruxd.scenario import load_scenario
    from cruxd.scenario.simulation import simulation_of

    path = _resolve(args.scenario)
    if args.plot is not None:
        from cruxd.cli.plots import need_matplotlib

        need_matplotlib()  # before minutes of simulation, not after
        if not args.plot.parent.is_dir():
            raise UsageError(f"--plot {args.plot}: no such directory "
                             f"{str(args.plot.parent)!r}")
    sc = load_scenario(path)
    jobs, settings = simulation_of(sc, policies=_policy_list(args.policy),
                                   horizon_s=args.horizon, seed=args.seed, levels=args.levels)
    try:
        runs = run_policies(sc, jobs, settings)
    except PlanningError as exc:  # e.g. hosts with no path between them: blame the file
        raise ScenarioError(f"cannot simulate: {exc}", where=str(path)) from None
    if args.plot is not None:
        from cruxd.cli.plots import write_plot

        write_plot(args.plot, sc, runs)
    if args.json:
        json.dump(simulate_json(sc, settings, runs), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        console = _console()
        print_simulation(console, sc, settings, runs)
        if args.plot is not None:
            console.print(f"Plot written to {args.plot}")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "plan": cmd_plan, "simulate": cmd_simulate, "status": live_cmd.cmd_status,
    "jobs": live_cmd.cmd_jobs, "probe": probe_cmd.cmd_probe, "measure": measure_cmd.cmd_measure,
    "table": table_cmd.cmd_table, "completion": completion_cmd.cmd_completion,
    "doctor": doctor_cmd.cmd_doctor, "install-unit": unit_cmd.cmd_install_unit,
    "hints": hints_cmd.cmd_hints, "place": place_cmd.cmd_place}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run_command("cruxctl", lambda: COMMANDS[args.command](args))


if __name__ == "__main__":
    sys.exit(main())
