"""What bench/control_plane.py reads and prints: CPU time and memory of its processes from
/proc, and the tables of measurements (a) to (e) with their notes."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from _workload import NICS_PER_HOST, JobSpec, host_id  # bench/ is on sys.path
from tables import preamble, table

TICK = os.sysconf("SC_CLK_TCK")
TARGET_ALL_S = 1.0
TARGET_AGENT_CPU = 1.0  # % of a core
TARGET_AGENT_RSS_MB = 60.0


# --- /proc ------------------------------------------------------------------------

def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


def sched_s(pid: int) -> float:
    """CPU time of all the process's threads in ns resolution (/proc/PID/task/*/schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def mem_mb(pid: int) -> dict[str, float]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) / 1024
    return out


@contextlib.contextmanager
def cpu_window(pids: Sequence[int]) -> Iterator[dict[str, float]]:
    """CPU seconds used by `pids` (summed) and wall seconds, over the with-block."""
    out: dict[str, float] = {}
    c0, t0 = sum(cpu_s(p) for p in pids), time.monotonic()
    yield out
    out["cpu_s"] = sum(cpu_s(p) for p in pids) - c0
    out["wall_s"] = time.monotonic() - t0
    out["pct"] = 100 * out["cpu_s"] / out["wall_s"]


# --- report ------------------------------------------------------------------------

def ms(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{1e3 * x:.0f}"


def dist_row(name: str, xs: Sequence[float], target: str = "") -> list[str]:
    a = np.array([x for x in xs if math.isfinite(x)])
    if len(a) == 0:
        return [name, "-", "-", "-", "-", target]
    return [name, ms(float(np.median(a))), ms(float(np.percentile(a, 99))), ms(float(a.max())),
            ms(float(a.min())), target]


def print_header(args: argparse.Namespace, arrivals: int) -> None:
    """The command line, the software and the machine, before anything runs."""
    preamble(f"grpcio {grpc.__version__}")
    print(f"# NOTE: the leader, {args.workers} agent worker processes and the real agent "
          f"share {os.cpu_count()} CPU cores: client-side load competes with the leader.",
          flush=True)
    if args.quick:
        print(f"# --quick: {args.jobs} jobs, {arrivals} arrivals, shorter windows: a smoke run "
              "(the full run: 5,000 jobs, 12 arrivals).", flush=True)


def print_report(args: argparse.Namespace, specs: list[JobSpec], *, aggs: int,
                 hosts_per_tor: int, s: dict[str, Any], ing: dict[str, Any],
                 lat: list[dict[str, Any]], alone: float, lat_errors: str,
                 mem_loaded: dict[str, float], mem_end: dict[str, float],
                 agent: list[dict[str, Any]], flood_s: float, window_s: float, gap_s: float,
                 errors_logged: str) -> None:
    """Tables (a) to (e). aggs, hosts_per_tor: the clos2 fabric's; s: the steady state; ing:
    ingestion; lat: the arrivals; alone: planning on its own; agent: the real agent's windows."""
    parts = sum(len(sp.hosts) for sp in specs)
    gpus = sum(len(sp.hosts) * sp.gpus for sp in specs)
    n_hosts = math.ceil((args.agents + 1) / hosts_per_tor) * hosts_per_tor
    print()
    print(f"(a) Setup: clos2 {n_hosts // hosts_per_tor} ToRs x {aggs} aggs, {hosts_per_tor} "
          f"hosts/ToR ({n_hosts} hosts, {NICS_PER_HOST} x 100 Gbps NICs); "
          f"seed {args.seed}")
    print(table(["quantity", "value"], [
        ["simulated agents (connections, WatchPlan streams)",
         f"{args.agents} in {args.workers} processes"],
        ["jobs (host parts reported)", f"{args.jobs} ({parts})"],
        ["GPUs the jobs declare (fabric has)", f"{gpus} ({8 * n_hosts}) *"],
        ["inter-host ring flows", s["flows"]],
        ["agents / jobs in the leader's status", f"{s['agents']} / {s['plan_jobs']}"],
        ["all Reports acked after", f"{s['connected_s']:.1f} s"],
        ["steady state (every agent on the last plan) after", f"{s['steady_s']:.1f} s"],
        ["plans (generations) until then", s["generation"]],
        ["last plan's planning latency", f"{1e3 * s['plan_latency_s']:.0f} ms"],
        ["leader CPU during start-up", f"{s['leader_cpu']['pct']:.0f} % of a core"],
        ["agents' failed RPCs during start-up", s["errors"]],
    ]))
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
          f"plus {args.agents} after every plan.")
    print()
    print(f"(c) Job arrival -> plan delivered: {len(lat)} arrivals (1/2/4/8 hosts in turn) "
          f"on {args.agents} agents, {args.jobs}+ jobs; ms")
    print(table(["", "median", "p99", "max", "min", "target"], [
        dist_row("Report acked (arriving hosts)", [r["ack_s"] for r in lat]),
        dist_row("leader planning (plan_latency_s)", [r["plan_s"] for r in lat]),
        ["  planning alone (make_plan, no load)", ms(alone), "", "", "", ""],
        dist_row("delivered to the first agent", [r["first_s"] for r in lat]),
        dist_row("delivered to the job's hosts", [r["hosts_s"] for r in lat]),
        dist_row("delivered to half of the agents", [r["half_s"] for r in lat]),
        dist_row(f"delivered to all {args.agents} agents", [r["all_s"] for r in lat],
                 f"<= {1e3 * TARGET_ALL_S:.0f}"),
        dist_row("fan-out (all agents - first agent)", [r["fanout_s"] for r in lat]),
    ]))
    met = sum(1 for r in lat if r["all_s"] <= TARGET_ALL_S)
    print(f"    target (all {args.agents} agents within {TARGET_ALL_S:g} s): met by {met} of "
          f"{len(lat)} arrivals.")
    print("    time zero: just before the first of the job's Reports; each arrival after every")
    print(f"    agent's Report following the previous plan was acked, plus {gap_s:g} s. planning:")
    print("    the leader's first event -> publication (debounce_ms 50 included). planning alone:")
    print(f"    plan_inputs + make_plan on the steady state's {args.jobs:,} jobs in the benchmark")
    print("    process after every other process stopped (best of 2); the rest of the leader's")
    print("    planning time is waiting for the GIL and a core. p99 of so few samples ~ the max.")
    print(f"    Agents' failed RPCs meanwhile: {lat_errors}.")
    print()
    print(f"(d) Leader memory ({args.agents} agents, {args.jobs}+ jobs; /proc/PID/status)")
    print(table(["when", "VmRSS MB", "VmHWM (peak) MB"], [
        ["steady state", f"{s['mem']['VmRSS']:.0f}", f"{s['mem']['VmHWM']:.0f}"],
        ["after the arrivals", f"{mem_loaded['VmRSS']:.0f}", f"{mem_loaded['VmHWM']:.0f}"],
        ["end of run", f"{mem_end['VmRSS']:.0f}", f"{mem_end['VmHWM']:.0f}"],
    ]))
    print()
    print(f"(e) Idle real agent (cruxd, agent role, {host_id(args.agents)}) on the loaded "
          f"leader; CPU over {window_s:g} s")
    print(table(["registered jobs", "CPU % of a core", "CPU s", "CPU % (schedstat)",
                 "VmRSS MB", "VmHWM MB", "target"], [[
        r["jobs"], f"{r['pct']:.2f}", f"{r['cpu_s']:.2f}", f"{r['sched_pct']:.3f}",
        f"{r['rss']:.1f}", f"{r['hwm']:.1f}",
        f"< {TARGET_AGENT_CPU:g} %, < {TARGET_AGENT_RSS_MB:g} MB"] for r in agent]))
    print(f"    CPU: utime+stime of /proc/PID/stat (resolution 1/{TICK} s: "
          f"{100 / TICK / window_s:.2f} % over the window) and,")
    print("    finer, the sum of /proc/PID/task/*/schedstat. The agent reports every 5 s")
    print("    (agent.report_interval_s default); its job: crux-run ... -- sleep 600.")
    print("    Measured from 2 s after its latest plan arrived.")
    if errors_logged.strip():
        print(f"    leader log (last lines): {errors_logged}")
