"""How one value reads in a `cruxctl status` table cell or line (status_view.py, the tables;
status_narrow.py, the lines for narrow terminals)."""

from __future__ import annotations

import math
from typing import Any

from cruxd.control.job_notes import ENDED_NOTE

STATES = {0: "?", 1: "profiling", 2: "scheduled", 3: "queued", 4: "expired", 5: "unmeasured"}


def age(seconds: float) -> str:
    if seconds < 0:
        return "never"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.0f} min"


def num(x: float) -> str:
    if math.isinf(x):
        return "∞"
    return f"{x:.3g}" if x else "-"


def routes(job: Any, fabric: bool) -> str:
    out = []
    for r in job.routes:
        port = f" sport {r.sport}" if r.sport else " fabric" if fabric else " ecmp"
        via = f" via {'>'.join(r.hops)}" if r.hops else ""
        out.append(f"{r.src_host}->{r.peer_host}{port}{via}")
    if len(out) > 3:
        out = [*out[:3], f"+{len(out) - 3} more"]
    return "\n".join(out) or "-"


def heard(a: Any) -> str:
    """A connected agent reports only on change: its last report's age says nothing."""
    return ("[red]expired[/]" if a.expired else "connected" if a.connected
            else f"{age(a.last_report_age_s)} ago, no stream")


def state(j: Any) -> str:
    if j.note == ENDED_NOTE:  # expired because it finished: say so, briefly
        return "ended"
    return STATES.get(j.state, str(j.state)) + (f" ({j.note})" if j.note else "")


def source_tag(source: str) -> str:
    """Where a job's t_j came from, in a word per host part: "nccl" (the profiler plugin),
    "nic", "sock" or "qp" (counters), "declared" (crux-run's hints), "replay"."""
    tags = []
    for part in source.split(","):
        word = part.split("+", 1)[-1].split(" ", 1)[0]
        tags.append(word + ("?" if "unprofiled" in part else ""))
    return ",".join(dict.fromkeys(tags))


def fabric_levels(cluster: Any) -> str:
    """The levels' DSCP and priorities (ClusterStatus.fabric_levels), and whether RoCE stays
    lossless on them."""
    levels = list(cluster.fabric_levels)
    dscp = "/".join(str(lv.dscp) for lv in levels)
    prio = "/".join(str(lv.priority) for lv in levels)
    where = f"DSCP {dscp} on priorit{'y' if len(levels) == 1 else 'ies'} {prio}"
    if cluster.lossless == "lossy":
        return f"{where}, lossy RoCE (lossless_priorities = [])"
    if cluster.lossless == "declared":
        off = sorted({str(lv.priority) for lv in levels if not lv.lossless})
        return f"{where}, lossless (PFC)" + (f" [red]except {', '.join(off)}[/]" if off else "")
    return (f"{where}; [yellow]whether they are lossless is not checked[/] (declare [leader] "
            "lossless_priorities: docs/operations.md)")
