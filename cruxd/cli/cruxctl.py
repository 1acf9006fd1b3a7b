"""cruxctl: operate and ask crux what it would do.

Exit status: 0 success; 1 an unexpected internal error; 2 bad input (a scenario
or topology file, an argument) reported as one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console

from cruxd import __version__
from cruxd.errors import CruxError, ScenarioError, UsageError
from cruxd.scenario import bundled, bundled_names, load_scenario

DEFAULT_SCENARIO = "testbed96"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cruxctl", description="Operate crux and ask what it would do.",
        epilog="Exit status: 0 ok, 1 internal error, 2 bad input.")
    p.add_argument("--version", action="version", version=f"cruxctl {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    pl = sub.add_parser(
        "plan", help="plan paths, priorities and levels for a scenario (what-if)",
        description="Plan a scenario: GPU intensity, path selection, priority assignment "
                    "with correction factors, compression to the switch levels, DSCP. "
                    "The scenario format is in docs/scenario.md.",
        epilog=f"Bundled scenarios: {', '.join(bundled_names())}. "
               "Exit status: 0 ok, 1 internal error, 2 bad input.")
    pl.add_argument("scenario", nargs="?", metavar="SCENARIO",
                    help=f"a scenario file (.json/.yaml) or a bundled name "
                         f"(default: {DEFAULT_SCENARIO})")
    pl.add_argument("--levels", type=int, metavar="K",
                    help="priority levels to compress to (overrides the scenario's)")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.add_argument("--flows", type=int, default=20, metavar="N",
                    help="flows to list in the table (default 20)")
    return p


def _resolve(arg: str | None) -> Path:
    if arg is None:
        print(f"cruxctl: no scenario given, planning the bundled '{DEFAULT_SCENARIO}'",
              file=sys.stderr)
        arg = DEFAULT_SCENARIO
    path = Path(arg)
    if path.exists():
        return path
    found = bundled(arg)
    if found is not None:
        return found
    raise UsageError(f"{arg}: no such file, nor a bundled scenario "
                     f"(bundled: {', '.join(bundled_names())})")


def cmd_plan(args: argparse.Namespace) -> int:
    from cruxd.cli.render import plan_json, print_plan
    from cruxd.scheduler import plan

    if args.levels is not None and args.levels < 1:
        raise UsageError("--levels must be >= 1")
    path = _resolve(args.scenario)
    sc = load_scenario(path, levels=args.levels)
    start = time.perf_counter()
    try:
        result = plan(sc.view, sc.config)
    except ValueError as exc:  # e.g. hosts with no path between them
        raise ScenarioError(f"cannot plan: {exc}", where=str(path)) from None
    latency = time.perf_counter() - start
    if args.json:
        json.dump(plan_json(sc, result, latency), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        console = Console()
        if not console.is_terminal:  # pipes and logs: wide enough that no number is cut
            console = Console(width=120)
        print_plan(console, sc, result, latency, max_flows=max(0, args.flows))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"plan": cmd_plan}[args.command](args)
    except CruxError as exc:
        print(f"cruxctl: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
