"""bench/testbed.py's view across repeated runs, and of the control plane within one.

`control_in_window`: what the leader and the rings did from the moment the leader had
profiled and planned every job (the settling before the measured window included, in which
the rings take that plan, and the window): re-plans (plans that changed some job's
decision), also by kind of cause, plans that changed none, each job's decision changes, and
each job's ring rebuilds (the most any of its ranks made: all of them rebuild together).
A rebuild with no decision change behind it is what the issue's floor forbids: a rebuild
that took the decision the leader held for that hop when every job was planned is that plan
taken an iteration late (a ring notices a new decision at its next all-reduce); only
rebuilds to other decisions have to be matched by decision changes.

`summarise`: per mode, the median and the spread (min-max) over runs of each figure."""

from __future__ import annotations

import statistics
from typing import Any

from tables import table  # bench/ is on sys.path when run as a script


def control_in_window(start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    replans = {k: n - start.get("replans", {}).get(k, 0)
               for k, n in end.get("replans", {}).items()}
    # a job that left is forgotten by the leader's count (0 at the end): not negative
    changes = {j: max(0, n - start.get("changes", {}).get(j, 0))
               for j, n in end.get("changes", {}).items()}
    # counted from when the leader had planned every job: (all, not the planned decision)
    counted = end["rebuilds"]
    rebuilds = {job: all_ for job, (all_, _) in counted.items()}
    newer = {job: n for job, (_, n) in counted.items()}
    unchanged = end.get("unchanged", 0) - start.get("unchanged", 0)
    # every published plan is counted once, as a re-plan or as unchanged; the kinds count a
    # plan once per kind of cause it carried ("job arrived" and "profiling" at once)
    total = (end["generation"] - start["generation"] - unchanged
             if "generation" in end and "generation" in start else sum(replans.values()))
    # a job that arrived in the window rebuilds to its first decision, which is no change
    first = {j: 0 if j in start.get("changes", {}) else 1 for j in newer}
    return {"replans": {k: n for k, n in replans.items() if n},
            "replans_total": total, "unchanged": unchanged,
            "decision_changes": changes, "ring_rebuilds": rebuilds,
            "rebuilds_without_change": sum(max(0, n - changes.get(j, 0) - first[j])
                                           for j, n in newer.items())}


def _spread(xs: list[float], fmt: str) -> str:
    if not xs:
        return "-"
    med = statistics.median(xs)
    return (f"{med:{fmt}}" if len(xs) == 1
            else f"{med:{fmt}} [{min(xs):{fmt}}, {max(xs):{fmt}}]")


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Per mode, each figure's values over the runs (None left out)."""
    out: dict[str, dict[str, list[float]]] = {}
    for res in runs:
        for mode, m in res["modes"].items():
            row = out.setdefault(mode, {})
            sim = m["simulated"].get("as_planned") or m["simulated"]
            ctl = m.get("control") or {}
            figures = {"utilization": m["utilization"], "gain": m.get("gain_over_ecmp"),
                       "standalone": m.get("fraction_of_standalone"),
                       "error": sim.get("error"),
                       "replans": ctl.get("replans_total"),
                       "rebuilds": sum(ctl["ring_rebuilds"].values()) if ctl else None,
                       "unexplained": ctl.get("rebuilds_without_change")}
            if meas := m.get("measured"):
                figures["t_j error"] = max(abs(x["comm_error"]) for x in meas.values())
            if "link_down" in m:
                figures["decided_s"] = m["link_down"]["decided_s"]
                figures["after"] = m["link_down"]["utilization_after"]
            for k, v in figures.items():
                if v is not None:
                    row.setdefault(k, []).append(float(v))
    return out


def print_summary(runs: list[dict[str, Any]]) -> None:
    s = summarise(runs)
    print(f"\n# {len(runs)} runs: median [min, max]; re-plans and rebuilds inside the "
          "measured window (after profiling)")
    rows = [[mode, _spread(f.get("utilization", []), ".3f"), _spread(f.get("gain", []), "+.1%"),
             _spread(f.get("standalone", []), ".3f"), _spread(f.get("error", []), "+.1%"),
             _spread(f.get("replans", []), ".0f"), _spread(f.get("rebuilds", []), ".0f"),
             _spread(f.get("unexplained", []), ".0f"), _spread(f.get("t_j error", []), ".1%")]
            for mode, f in s.items()]
    print(table(["mode", "GPU util", "vs ecmp", "of standalone", "sim error (as run)",
                 "re-plans", "ring rebuilds", "without a decision change",
                 "worst |t_j error|"], rows))
    down = [[mode, _spread(f["decided_s"], ".1f"), _spread(f.get("after", []), ".3f"),
             f"{len(f['decided_s'])} of {len(runs)}"]
            for mode, f in s.items() if "decided_s" in f]
    if down:
        print(table(["mode (link down)", "new decisions after s", "util after",
                     "decided within the window"], down))
