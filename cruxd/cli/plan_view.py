"""Plans for people (rich tables) and for scripts (stable JSON)."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from cruxd.model.plan import Plan
from cruxd.model.topology import Topology
from cruxd.scenario import Scenario

_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(x: float, unit: str = "") -> str:
    if not math.isfinite(x):
        return "∞"
    for scale, p in _PREFIXES:
        if abs(x) >= scale:
            return f"{x / scale:.3g}{p}{unit}"
    return f"{x:.3g}{unit}"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def topology_summary(topo: Topology) -> dict[str, Any]:
    return {"name": topo.name, "hosts": len(topo.hosts), "gpus": topo.total_gpus(),
            "switches": len(topo.switches), "links": len(topo.links)}


def plan_json(sc: Scenario, plan: Plan, latency_s: float) -> dict[str, Any]:
    return {"version": 1, "scenario": sc.name, "source": sc.source,
            "topology": topology_summary(sc.view.topology),
            "plan_latency_ms": round(latency_s * 1e3, 3),
            "mechanisms": "paths" if plan.levels == 1 else "paths+levels",
            "plan": plan.to_dict()}


# With one lossless class there is nothing to order: crux only chooses the paths.
PATHS_ONLY = ("one level: crux chooses paths only; every job shares the one lossless class "
              "fairly, and priorities (k_j, P_j) order nothing on the fabric")


def print_plan(console: Console, sc: Scenario, plan: Plan, latency_s: float,
               max_flows: int = 20) -> None:
    topo = sc.view.topology
    t = topology_summary(topo)
    console.print(f"[bold]{sc.name}[/]: {t['hosts']} hosts, {t['gpus']} GPUs, "
                  f"{t['switches']} switches, {t['links']} links ({topo.name})")
    if sc.description:
        console.print(sc.description, style="dim")
    console.print(f"{len(plan.jobs)} jobs onto {plan.levels} levels; reference job "
                  f"{plan.reference_job or '-'}; contention kept apart "
                  f"{_share(plan.cut_weight, plan.contention_weight)}; "
                  f"planned in {latency_s * 1e3:.1f} ms")
    if plan.levels == 1:
        console.print(PATHS_ONLY, style="yellow")

    jobs = Table(title="Jobs by priority", title_justify="left",
                 caption="I_j = W_j / t_j (FLOP per second on the wire); P_j = k_j I_j; "
                         "level 0 is the lowest", caption_justify="left")
    for col in ("rank", "job", "GPUs", "I_j", "t_j ms", "iter ms", "k_j", "P_j", "level", "DSCP"):
        jobs.add_column(col, justify="left" if col == "job" else "right", no_wrap=True)
    gpus = {j.id: j.gpus for j in sc.view.jobs}
    for d in plan.jobs:
        jobs.add_row(str(d.rank), d.job, str(gpus[d.job]), si(d.intensity),
                     ms(d.comm_s) if d.network else "-", ms(d.period_s), f"{d.k:.3g}",
                     si(d.priority), str(d.level), str(d.dscp))
    console.print(jobs)

    if plan.flows:
        flows = Table(title="Flows and chosen paths", title_justify="left")
        for col in ("job", "flow", "bytes/iter", "path", "sport", "of"):
            flows.add_column(col, justify="right" if col in ("bytes/iter", "of") else "left",
                             no_wrap=col != "path")
        for f in plan.flows[:max_flows]:
            port = f"#{f.src_port}" if f.src_port is not None else ""
            flows.add_row(f.job, f"{f.src}{port} -> {f.dst}", si(f.bytes, "B"),
                          " > ".join(f.hops) or "-", str(f.sport) if f.sport else "-",
                          str(f.candidates))
        console.print(flows)
        if len(plan.flows) > max_flows:
            console.print(f"... {len(plan.flows) - max_flows} more flows (--flows N, or --json)",
                          style="dim")

    if plan.links:
        links = Table(title="Busiest links (mean offered load at standalone rates)",
                      title_justify="left")
        for col in ("link", "Gbit/s", "load", "util", "jobs"):
            links.add_column(col, justify="left" if col in ("link", "jobs") else "right")
        for lk in plan.links:
            links.add_row(lk.link, f"{lk.capacity_gbps:g}", f"{lk.demand_gbps:.3g}",
                          f"{lk.utilization:.0%}", ", ".join(lk.jobs))
        console.print(links)


def _share(part: float, whole: float) -> str:
    return "100%" if whole <= 0 else f"{part / whole:.1%}"
