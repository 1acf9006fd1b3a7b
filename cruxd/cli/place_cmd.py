"""`cruxctl place`: where should this job go? Arnold's MIP on crux's Arnold hints.

The job is given as Arnold's (DP, TP, PP) with whole-node tensor parallelism; the fabric is
the Arnold export (docs/hints/arnold.md) from the live leader, a scenario, or a saved file.
The answer is one host per job node with its minipod and pipeline stage (node
`stage * nodes_per_stage + i`, Megatron's rank order: TP, then DP, then PP), and how far the
DP and PP groups spread.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cruxd.cli.hints_cmd import add_source_args, fetch
from cruxd.errors import UsageError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "place", help="where a (DP, TP, PP) job should go: Arnold's MIP on crux's hints",
        description="Place a job on the free nodes of the fabric as crux sees it, with "
                    "Arnold's MIP (docs/hints.md): minimise how many minipods a scheduling "
                    "unit (a PP or DP group) spans, weighted by alpha (DP) and beta (PP), "
                    "preferring minipods with little high-priority load. Reads the Arnold "
                    "hints from the live leader, a scenario (--scenario) or a file (--hints).",
        epilog="Exit status: 0 ok, 1 internal error, 2 bad input or the job does not fit, "
               "3 agent/leader unreachable.")
    for name, what in (("dp", "data-parallel degree"), ("tp", "tensor-parallel degree (GPUs, "
                                                              "within a node)"),
                       ("pp", "pipeline stages")):
        p.add_argument(f"--{name}", type=int, required=True, metavar="N", help=what)
    p.add_argument("--unit", choices=("pp", "dp"), default="pp",
                   help="the scheduling unit kept together (default: pp, Arnold's choice "
                        "when PP traffic dominates)")
    p.add_argument("--alpha", type=float, default=0.0, metavar="A",
                   help="weight of DP-group spread (default 0)")
    p.add_argument("--beta", type=float, default=1.0, metavar="B",
                   help="weight of PP-group spread (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=8, metavar="G",
                   help="GPUs per node (default 8)")
    p.add_argument("--time-limit", type=float, default=30.0, metavar="S",
                   help="HiGHS time limit in seconds (default 30)")
    p.add_argument("--hints", type=Path, metavar="FILE",
                   help="an Arnold hints document saved with `cruxctl hints --format arnold`")
    add_source_args(p, json=True)


def _document(args: argparse.Namespace) -> dict[str, Any]:
    if args.hints is not None:
        if args.scenario or args.socket or args.leader or args.config:
            raise UsageError("--hints reads a file; it takes no --scenario, --socket, "
                             "--config, --leader")
        try:
            text = args.hints.read_text()
        except OSError as exc:
            raise UsageError(f"--hints {args.hints}: {exc.strerror}") from None
        where = str(args.hints)
    else:
        text, where = fetch(args, "arnold"), "the Arnold hints"
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    return doc


def cmd_place(args: argparse.Namespace) -> int:
    from cruxd.hints.arnold_mip import place, weighted_spread

    for name in ("dp", "tp", "pp", "gpus_per_node"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.time_limit <= 0:
        raise UsageError("--time-limit must be positive")
    doc = _document(args)
    try:
        p = place(doc, args.dp, args.tp, args.pp, alpha=args.alpha, beta=args.beta,
                  unit=args.unit, gpus_per_node=args.gpus_per_node,
                  time_limit_s=args.time_limit)
    except (KeyError, TypeError, ValueError) as exc:  # the shape the schema promises
        raise UsageError(f"not a usable Arnold hints document ({type(exc).__name__}: "
                         f"{exc}); see docs/hints/arnold.schema.json") from None
    out = p.to_dict()
    out["weighted_spread"] = weighted_spread(p, args.alpha, args.beta)
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from rich.table import Table

    from cruxd.cli.common import console as _console

    console = _console()
    console.print(f"job dp={args.dp} tp={args.tp} pp={args.pp} on {len(p.hosts)} node(s) "
                  f"in {len(p.minipods_used)} minipod(s) ({', '.join(p.minipods_used)}); "
                  f"unit {p.unit}; PP groups span up to {p.max_pp_spread}, DP groups up to "
                  f"{p.max_dp_spread} minipod(s); weighted spread {out['weighted_spread']:g}"
                  + ("" if p.optimal else " [yellow](not proven optimal in the time limit)[/]"))
    t = Table(title="placement", title_justify="left")
    for col in ("node", "host", "minipod", "stage"):
        t.add_column(col)
    for n in out["nodes"]:
        t.add_row(str(n["rank"]), n["host"], n["minipod"], str(n["stage"]))
    console.print(t)
    return 0
