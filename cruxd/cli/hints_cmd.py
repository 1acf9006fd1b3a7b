"""`cruxctl hints`: placement hints for topology-aware schedulers (docs/hints.md).

From the running leader (through the local agent, or --leader), or what-if from a scenario
(--scenario: its topology and jobs, planned here, no daemon needed).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from cruxd.cli import live_cmd
from cruxd.errors import PlanningError, ScenarioError, UsageError

# the renderer's list (cruxd.hints.formats.FORMATS), repeated so --help needs no numpy
FORMATS = ("spiderflow", "arnold", "volcano", "slurm", "labels", "bandwidth")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "hints", help="export placement hints for SpiderFlow, Arnold, Volcano, Slurm",
        description="The fabric as crux sees it (tiers from probed hop lists or the "
                    "configured topology, free GPUs per host, nominal and measured bandwidth, "
                    "planned load per priority level), in the format a topology-aware "
                    "scheduler consumes. Formats and their schemas: docs/hints.md.",
        epilog="Formats: spiderflow (state table, widest-path bandwidth, scores), arnold "
               "(minipods, capacity, high-priority load), volcano (HyperNode manifests, "
               "YAML), labels (Kubernetes node labels), slurm (topology.conf), bandwidth "
               "(measured per host pair and path). Exit status: 0 ok, 1 internal error, "
               "2 bad input, 3 agent/leader unreachable.")
    p.add_argument("--format", required=True, choices=FORMATS, metavar="FORMAT",
                   help=f"one of: {', '.join(FORMATS)}")
    p.add_argument("--out", type=Path, metavar="FILE", help="write here instead of stdout")
    add_source_args(p)


def _scenario_text(scenario: str, fmt: str) -> str:
    from cruxd.cli.common import resolve_scenario as _resolve
    from cruxd.hints.collect import level_loads, used_gpus
    from cruxd.hints.fabric_view import JobHint, build_view
    from cruxd.hints.formats import render
    from cruxd.scenario import load_scenario
    from cruxd.scheduler import plan

    path = _resolve(scenario)
    sc = load_scenario(path)
    try:
        result = plan(sc.view, sc.config)
    except PlanningError as exc:  # e.g. hosts with no path between them: blame the file
        raise ScenarioError(f"cannot plan: {exc}", where=str(path)) from None
    decided = {d.job: d for d in result.jobs}
    jobs = tuple(JobHint(j.id, tuple(h for h, _ in j.hosts), sum(n for _, n in j.hosts),
                         decided[j.id].intensity if j.id in decided else 0.0,
                         decided[j.id].level if j.id in decided else 0) for j in sc.view.jobs)
    view = build_view(sc.view.topology, used=used_gpus(j.hosts for j in sc.view.jobs),
                      load=level_loads(result, result.levels),
                      jobs=jobs, levels=result.levels, generated_unix_ms=int(time.time() * 1000))
    return render(fmt, view).text


def add_source_args(p: argparse.ArgumentParser, json: bool = False) -> None:
    """Where hints come from: a scenario (what-if), the local agent, or a leader."""
    p.add_argument("--scenario", metavar="SCENARIO",
                   help="what-if: a scenario file or bundled name instead of the live leader")
    live_cmd.add_target_args(p, json=json)


def fetch(args: argparse.Namespace, fmt: str) -> str:
    """The hints document in `fmt`, from the source the arguments name."""
    if args.scenario is not None:
        if args.socket or args.leader or args.config:
            raise UsageError("--scenario plans here; it takes no --socket, --config, --leader")
        return _scenario_text(args.scenario, fmt)
    from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb

    req = cpb.HintsRequest(format=fmt)
    doc = (live_cmd.leader_call(args, "GetHints", req) if args.leader
           else live_cmd.local(args, "hints", format=fmt).hints)
    return str(doc.text)


def cmd_hints(args: argparse.Namespace) -> int:
    text = fetch(args, args.format)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        args.out.write_text(text)
    except OSError as exc:
        raise UsageError(f"--out {args.out}: {exc.strerror}") from None
    print(f"{args.format} hints written to {args.out}", file=sys.stderr)
    return 0
