"""What bench/control_plane.py prints, for either cluster shape (bench/_cluster_shapes.py):
the command and machine first, then tables (a) to (e) with their notes and the shape's
targets. The /proc readings and the table cells come from bench/_cp_stats.py.
"""

from __future__ import annotations

import argparse
import math
import os
from collections import Counter
from typing import Any

import grpc
import numpy as np
from _cluster_shapes import (  # bench/ is on sys.path
    REAL_AGGS_PER_POD,
    REAL_HOSTS_PER_TOR,
    REAL_NIC_GBPS,
    REAL_NICS,
    REAL_SPINES_PER_PLANE,
    REAL_TORS_PER_POD,
    TARGETS,
    clos3_pods,
)
from _cp_stats import TICK, dist_row, ms
from _leader_rig import AGGS, HOSTS_PER_TOR
from _workload import NIC_GBPS, NICS_PER_HOST, JobSpec, host_id
from tables import preamble, table


def print_header(args: argparse.Namespace, arrivals: int, nofile: int) -> None:
    """The command line, the software and the machine, before anything runs."""
    preamble(f"grpcio {grpc.__version__}", f"RLIMIT_NOFILE {nofile}")
    print(f"# NOTE: the leader, {args.workers} agent worker processes and the real agent "
          f"share {os.cpu_count()} CPU cores: client-side load competes with the leader.",
          flush=True)
    if args.quick:
        full = ("10,000 agents, up to 2,000 jobs" if args.shape == "real" else "5,000 jobs")
        print(f"# --quick: {args.jobs} jobs asked, {arrivals} arrivals, shorter windows: a "
              f"smoke run (the full run: {full}, 12 arrivals).", flush=True)


def fabric_line(args: argparse.Namespace) -> tuple[str, int]:
    """The fabric in words, and its host count."""
    if args.shape == "real":
        pods = clos3_pods(args.agents + 1)
        n = pods * REAL_TORS_PER_POD * REAL_HOSTS_PER_TOR
        return (f"clos3 fat tree, 1:1: {pods} pods x ({REAL_TORS_PER_POD} ToRs + "
                f"{REAL_AGGS_PER_POD} aggs), {REAL_HOSTS_PER_TOR} hosts/ToR, "
                f"{REAL_AGGS_PER_POD} spine planes x {REAL_SPINES_PER_PLANE} "
                f"({n} hosts, {REAL_NICS} x {REAL_NIC_GBPS:g} Gbps NICs)", n)
    n = math.ceil((args.agents + 1) / HOSTS_PER_TOR) * HOSTS_PER_TOR
    return (f"clos2 {n // HOSTS_PER_TOR} ToRs x {AGGS} aggs, {HOSTS_PER_TOR} hosts/ToR "
            f"({n} hosts, {NICS_PER_HOST} x {NIC_GBPS:g} Gbps NICs)", n)


def _mix(specs: list[JobSpec]) -> str:
    sizes = Counter(len(s.hosts) * s.gpus for s in specs)
    return ", ".join(f"{g}: {c}" for g, c in sorted(sizes.items()))


def print_report(args: argparse.Namespace, specs: list[JobSpec], *, arrivals: list[JobSpec],
                 s: dict[str, Any], idle: dict[str, Any], ing: dict[str, Any],
                 lat: list[dict[str, Any]],
                 alone: float, lat_errors: str, plans: list[int],
                 mem_loaded: dict[str, float], mem_end: dict[str, float],
                 agent: list[dict[str, Any]], flood_s: float, window_s: float, gap_s: float,
                 errors_logged: str) -> None:
    """Tables (a) to (e). s: the steady state; idle: the steady state, quiet; ing:
    ingestion; lat: the arrivals timed; alone: planning on its own; plans: (full,
    unchanged) HostPlans during the arrivals; agent: the real agent's windows."""
    real = args.shape == "real"
    tg = TARGETS[args.shape]
    parts = sum(len(sp.hosts) for sp in specs)
    gpus = sum(len(sp.hosts) * sp.gpus for sp in specs)
    fabric, n_hosts = fabric_line(args)
    conns = (f", {args.agents_per_channel} per connection" if real and
             args.agents_per_channel > 1 else "")
    print()
    print(f"(a) Setup: {fabric}; seed {args.seed}")
    rows: list[list[Any]] = [
        ["simulated agents (WatchPlan streams)",
         f"{args.agents} in {args.workers} processes{conns}"],
        ["jobs (host parts reported)", f"{len(specs)} ({parts})"
         + (f" of {args.jobs} asked" if len(specs) < args.jobs else "")],
        ["GPUs the jobs declare (fabric has)",
         f"{gpus} ({8 * n_hosts})" + ("" if real else " *")],
    ]
    if real:
        rows += [["  job sizes, GPUs: count", _mix(specs)],
                 ["  arrivals' GPUs (hosts kept free for them)",
                  f"{sum(len(a.hosts) * a.gpus for a in arrivals)} "
                  f"({sum(len(a.hosts) for a in arrivals)} hosts)"]]
    rows += [
        ["inter-host ring flows", s["flows"]],
        ["agents / jobs in the leader's status", f"{s['agents']} / {s['plan_jobs']}"],
        ["all Reports acked after", f"{s['connected_s']:.1f} s"],
        ["steady state (every agent on the last plan) after", f"{s['steady_s']:.1f} s"],
        ["plans (generations) until then", s["generation"]],
        ["last plan's planning latency", f"{1e3 * s['plan_latency_s']:.0f} ms"],
        ["leader CPU during start-up", f"{s['leader_cpu']['pct']:.0f} % of a core"],
        ["agents' failed RPCs during start-up", s["errors"]],
        [f"(a2) idle {window_s:g} s: leader CPU / RSS",
         f"{idle['leader']['pct']:.1f} % of a core / {idle['mem']['VmRSS']:.0f} MB"],
        ["  simulated agents' workers' CPU (the box has "
         f"{os.cpu_count()} cores)", f"{idle['worker_pct']:.1f} % of a core"],
        ["  plans / failed RPCs meanwhile", f"{idle['plans']} / {idle['errors']}"],
    ]
    print(table(["quantity", "value"], rows))
    if real:
        print("    No GPU is in two jobs: jobs of the trace's mix (cruxd.workload: 8..512 GPUs)")
        print("    on whole free hosts (8-GPU jobs: one host, or 4 + 4 on two), until the fabric")
        print("    is full; the mix averages 53.7 GPUs, so 80,000 GPUs hold ~1,500 of its jobs.")
    else:
        print("    * single-host jobs share hosts freely: GPUs are oversubscribed; the leader does")
        print("      not check GPU capacity, and its cost depends on jobs and flows, not GPUs.")
    print()
    print(f"(b) Report ingestion: {args.agents} agents calling Report back to back "
          f"(one in flight each) for {flood_s:g} s")
    print(table(["reports acked", "failed", "elapsed s", "reports/s", "leader CPU",
                 "leader CPU ms/report", "agent workers CPU", "re-plans"], [[
        ing["acks"], ing["errors"], f"{ing['seconds']:.2f}", f"{ing['rate']:.0f}",
        f"{ing['leader_pct']:.0f} %", f"{ing['ms_per_ack']:.2f}", f"{ing['worker_pct']:.0f} %",
        ing["replans"]]]))
    print(f"    failed: {ing['why']}")
    print(f"    CPU as % of one core (the box has {os.cpu_count()}); the leader's loop is one "
          "thread. Elapsed runs until the last Report in flight is answered.")
    print(f"    steady-state load for comparison: {args.agents} agents / "
          f"{args.report_interval:g} s = {args.agents / args.report_interval:.0f} reports/s, "
          "plus one per host that a change concerns (agents report only on change).")
    print()
    what = ("jobs of the trace's mix on free hosts" if real else "1/2/4/8 hosts in turn")
    print(f"(c) Job arrival -> plan delivered: {len(lat)} arrivals ({what}) on {args.agents} "
          f"agents, {len(specs)}+ jobs; ms")
    target_all = f"median <= {ms(tg.all_median_s)}" + (
        f", p99 <= {ms(tg.all_p99_s)}" if tg.all_p99_s is not None else "")
    print(table(["", "median", "p99", "max", "min", "target"], [
        dist_row("Report acked (arriving hosts)", [r["ack_s"] for r in lat]),
        dist_row("leader planning (plan_latency_s)", [r["plan_s"] for r in lat]),
        ["  planning alone (make_plan, no load)", ms(alone), "", "", "", ""],
        dist_row("delivered to the first agent", [r["first_s"] for r in lat]),
        dist_row("delivered to the job's hosts", [r["hosts_s"] for r in lat]),
        dist_row("delivered to half of the agents", [r["half_s"] for r in lat]),
        dist_row(f"delivered to all {args.agents} agents", [r["all_s"] for r in lat],
                 target_all),
        dist_row("fan-out (all agents - first agent)", [r["fanout_s"] for r in lat]),
        dist_row("  leader CPU meanwhile (to all agents)", [r["leader_cpu_s"] for r in lat]),
        dist_row("  agents' workers' CPU meanwhile", [r["workers_cpu_s"] for r in lat]),
    ]))
    all_s = np.array([r["all_s"] for r in lat])
    if len(all_s):
        med, p99 = float(np.median(all_s)), float(np.percentile(all_s, 99))
        verdict = [f"median {ms(med)} ms {'<=' if med <= tg.all_median_s else '>'} "
                   f"{ms(tg.all_median_s)}"]
        if tg.all_p99_s is not None:
            verdict.append(f"p99 {ms(p99)} ms {'<=' if p99 <= tg.all_p99_s else '>'} "
                           f"{ms(tg.all_p99_s)}")
        met = med <= tg.all_median_s and (tg.all_p99_s is None or p99 <= tg.all_p99_s)
        print(f"    target ({args.shape}: plan at all {args.agents} agents, {target_all} ms): "
              f"{'met' if met else 'NOT met'} ({'; '.join(verdict)}).")
    if real:
        print("    arrivals: " + ", ".join(f"{r['job']} {r['gpus']} GPUs" for r in lat))
    print(f"    HostPlans the agents received meanwhile: {plans[0]} full, {plans[1]} unchanged "
          "(delta fan-out).")
    print("    time zero: just before the first of the job's Reports; each arrival after every")
    print(f"    agent's Report following the previous plan was acked, plus {gap_s:g} s. planning:")
    print("    the leader's first event -> publication (debounce_ms 50 included). planning alone:")
    print(f"    plan_inputs + make_plan on the steady state's {len(specs):,} jobs in the benchmark")
    print("    process after every other process stopped (best of 2); the rest of the leader's")
    print("    planning time is waiting for the GIL and a core. p99 of so few samples ~ the max.")
    print("    CPU meanwhile: from just before the job's Reports until every agent held its plan,")
    print("    ms of CPU (all threads; the workers' summed); more than the wall time: the other")
    print("    core helped.")
    print(f"    Agents' failed RPCs meanwhile: {lat_errors}.")
    print()
    print(f"(d) Leader memory ({args.agents} agents, {len(specs)}+ jobs; /proc/PID/status); "
          f"target VmRSS <= {tg.leader_rss_mb:g} MB")
    print(table(["when", "VmRSS MB", "VmHWM (peak) MB", "target"], [
        [when, f"{m['VmRSS']:.0f}", f"{m['VmHWM']:.0f}",
         "met" if m["VmRSS"] <= tg.leader_rss_mb else "NOT met"]
        for when, m in (("steady state", s["mem"]), ("after the arrivals", mem_loaded),
                        ("end of run", mem_end))]))
    print()
    print(f"(e) Idle real agent (cruxd, agent role, {host_id(args.agents)}) on the loaded "
          f"leader; CPU over {window_s:g} s")
    print(table(["registered jobs", "CPU % of a core", "CPU s", "CPU % (schedstat)",
                 "VmRSS MB", "VmHWM MB", "target"], [[
        r["jobs"], f"{r['pct']:.2f}", f"{r['cpu_s']:.2f}", f"{r['sched_pct']:.3f}",
        f"{r['rss']:.1f}", f"{r['hwm']:.1f}",
        f"< {tg.agent_cpu_pct:g} %, < {tg.agent_rss_mb:g} MB: "
        + ("met" if r["pct"] < tg.agent_cpu_pct and r["rss"] < tg.agent_rss_mb else "NOT met")]
        for r in agent]))
    print(f"    CPU: utime+stime of /proc/PID/stat (resolution 1/{TICK} s: "
          f"{100 / TICK / window_s:.2f} % over the window) and,")
    print("    finer, the sum of /proc/PID/task/*/schedstat. The agent looks every 5 s")
    print("    (agent.report_interval_s) and reports on change; its job: crux-run ... --")
    print("    sleep 600.")
    print("    Measured from 2 s after its latest plan arrived.")
    if errors_logged.strip():
        print(f"    leader log (last lines): {errors_logged}")
