"""`cruxctl table`: the host's decision table as the job-side libraries read it.

What the agent wrote for each local job (job-wide, and per peer): level, DSCP, traffic
class, the UDP source port of the route and the TCP ports. Read straight from the file
(transport/decision_table.py, read-only; the seqlock protocol of docs/decision-table.md), so
it shows what a job connecting now would get, even while the agent is down.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cruxd.cli.live_cmd import add_target_args
from cruxd.errors import CruxError, UsageError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "table", help="dump this host's decision table (what the job-side libraries apply)",
        description="Print the decision table the local agent writes and the wrapper "
                    "libibverbs and the socket interposer read: per job, its job-wide entry "
                    "and one per peer (level, DSCP, traffic class, UDP source port, TCP "
                    "ports, plan generation). Read from the file itself, so it works while "
                    "the agent is down. docs/decision-table.md describes the file.")
    p.add_argument("--table", metavar="PATH", type=Path,
                   help="the table file (default: the one the local agent names, else "
                        "/run/crux/decisions)")
    p.add_argument("--job", metavar="ID", help="only this job's entries")
    add_target_args(p, leader=False)  # --socket, --config: the agent that names the table


def table_path(args: argparse.Namespace) -> Path:
    """--table, else the local agent's decision_table, else the default path."""
    if args.table is not None:
        return Path(args.table)
    from cruxd.cli.live_cmd import Unreachable, local
    from transport.table_format import DEFAULT_PATH

    try:
        named = local(args, "status", local_only=True).status.agent.decision_table
    except (Unreachable, CruxError):
        named = ""
    return Path(named or DEFAULT_PATH)


def cmd_table(args: argparse.Namespace) -> int:
    from transport.decision_table import TableError, TableReader

    path = table_path(args)
    if not path.exists():
        raise UsageError(f"no decision table at {path} (is the agent running? --table PATH)",
                         where="table")
    try:
        with TableReader(path) as reader:
            header = reader.header()
            entries = reader.snapshot()
    except (TableError, OSError) as exc:
        raise CruxError(str(exc), where="table") from None
    if args.job is not None:
        entries = [d for d in entries if d.job_id == args.job]
    entries.sort(key=lambda d: (d.job_id, d.peer is not None, d.peer or ""))
    doc = {"path": str(path), "generation": header.generation,
           "plan_generation": header.plan_generation, "capacity": header.capacity,
           "writer_pid": header.writer_pid, "entries": [_entry(d) for d in entries]}
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    _print(doc)
    return 0


def _entry(d: Any) -> dict[str, Any]:
    return {"job_id": d.job_id, "peer": d.peer, "level": d.level, "dscp": d.dscp,
            "traffic_class": d.traffic_class, "sport": d.sport, "tcp_dport": d.tcp_dport,
            "tcp_sports": list(d.tcp_sports), "plan_generation": d.plan_generation,
            "provisional": d.provisional}


def _print(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from cruxd.cli.common import console
    from cruxd.cli.safe_text import safe

    out = console()
    out.print(f"decision table {doc['path']}: generation {doc['generation']}, plan "
              f"{doc['plan_generation']}, {len(doc['entries'])} of {doc['capacity']} entries "
              f"live, written by pid {doc['writer_pid']}")
    t = Table(title_justify="left")
    for col in ("job", "peer", "level", "DSCP", "TC", "UDP sport", "TCP dport", "TCP sports",
                "plan"):
        t.add_column(col)
    for e in doc["entries"]:
        sports = e["tcp_sports"]
        # job ids are the jobs' own words (cruxd/cli/safe_text.py)
        t.add_row(safe(e["job_id"]), safe(e["peer"] or "(job-wide)"), str(e["level"]),
                  str(e["dscp"]),
                  str(e["traffic_class"]), str(e["sport"] or "-"), str(e["tcp_dport"] or "-"),
                  (",".join(map(str, sports[:4])) + (f" +{len(sports) - 4}" if len(sports) > 4
                                                     else "")) or "-",
                  str(e["plan_generation"]) + (" (provisional)" if e["provisional"] else ""))
    out.print(t)
