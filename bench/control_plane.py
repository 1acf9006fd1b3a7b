"""Control-plane benchmark: one real leader, 1,000 simulated agents, 5,000 jobs.

Protocol
  * Leader: a real `cruxd` process, leader role only, on 127.0.0.1 with a clos2
    topology file (16 hosts per ToR, 16 aggregation switches, 4 x 100 Gbps NICs
    per host; hosts h0..h{N}: one more than the simulated agents, for the real
    agent of (e)), debounce_ms 50, profiling_s 0 (no profiling windows),
    agent_timeout_s 120, metrics off, log level warning.
  * Agents: N simulated agents (bench/_fake_agents.py) in W worker processes
    (multiprocessing, spawn), each on its own gRPC channel and TCP connection:
    one WatchPlan stream, a Report at start, every --report-interval s and right
    after each plan received (as a real agent does). The workload: J jobs
    spanning 1, 2, 4 or 8 consecutive hosts (55/20/15/10 %); single-host jobs
    1-8 GPUs, multi-host jobs 8 GPUs a host; declared W_j (30-60 % of 312
    TFLOP/s per GPU over compute_s 0.1-2 s) and all-reduce sizes 1e8-1e10 B,
    each host reporting its share with node_rank/nnodes.
  (a) Steady state: from the agents' first Reports until the leader's status shows
      every job scheduled and every agent holds that plan's generation.
  (b) Ingestion: every agent calls Report back to back (one in flight per agent)
      for 5 s (--quick 3 s); reports/s = ACKs / time until the last answer; leader
      CPU from /proc/PID/stat (utime+stime, all threads) over the same window.
      Failed calls are counted by status code (the leader rejects nothing, but
      gRPC may: see the output).
  (c) Event -> plan delivered: R job arrivals (default 12, fewer - not below 8 -
      once they have taken 170 s; cycling over 1, 2, 4, 8 consecutive hosts of one
      worker, all of them reporting the job at once).
      Each is isolated: it starts once every agent's Report sent after the
      previous plan was acked, plus 0.5 s. t0 = time.monotonic() just before the
      first of the job's Report calls; "job's hosts" = the last of its hosts to
      receive a HostPlan where the job is planned; "all agents" = the last of the
      N agents to receive that generation (CLOCK_MONOTONIC is system-wide on
      Linux, so times compare across processes). Planning = the leader's own
      plan_latency_s (its first event -> publication, debounce included: the field
      `cruxctl status --leader ... --json` prints, read with the same Status RPC);
      fan-out = all agents - first agent. For reference, plan_inputs + make_plan
      alone on the same jobs, in this process once everything else has stopped.
  (d) Leader memory: VmRSS and VmHWM of /proc/PID/status.
  (e) An idle real agent (`cruxd`, agent role only, host h{N}) connected to the
      loaded leader: CPU (utime+stime, and schedstat) over 20 s (--quick 10 s) as
      % of one core, and RSS; then the same with one job registered by
      `crux-run ... -- sleep 600`.

    --quick: 2,000 jobs, 5 arrivals, a 3 s flood, 10 s agent windows (under ~90 s).

    .venv/bin/python bench/control_plane.py [--quick] [--agents N] [--jobs J]
                                            [--workers W] [--arrivals R] [--seed S]
"""

from __future__ import annotations

import argparse
import math
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

# bench/ is on sys.path when run as a script
from _cp_stats import cpu_s, cpu_window, mem_mb, print_header, print_report, sched_s
from _leader_rig import AGGS, HOSTS_PER_TOR, Bench
from _workload import NICS_PER_HOST, JobSpec, make_job, make_jobs

from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb

# --- the measurements --------------------------------------------------------------

def phase_steady(b: Bench, specs: list[JobSpec]) -> dict[str, Any]:
    assert b.leader is not None
    t0 = time.monotonic()
    with cpu_window([b.leader.pid]) as lcpu:
        b.ask(b.all_workers(), "connect", timeout=150)
        connected = time.monotonic() - t0
        st = b.wait_steady()
        steady = time.monotonic() - t0
    flows = sum(len(s.hosts) * NICS_PER_HOST for s in specs if len(s.hosts) > 1)
    return {"connected_s": connected, "steady_s": steady, "generation": st.plan_generation,
            "leader_cpu": lcpu, "plan_jobs": len(st.jobs),
            "plan_latency_s": st.plan_latency_s, "agents": len(st.agents), "flows": flows,
            "mem": mem_mb(b.leader.pid), "errors": b.errors_since({})}


def phase_ingest(b: Bench, seconds: float) -> dict[str, Any]:
    assert b.leader is not None
    gen0 = b.status().plan_generation
    errs0 = b.errors()
    start = time.monotonic() + 0.5
    pids = [b.leader.pid]
    for w in b.all_workers():
        b.workers[w][1].send(("flood", (start, seconds)))
    time.sleep(max(0.0, start - time.monotonic()))
    c_start, w_start = sum(cpu_s(p) for p in pids), b.worker_cpu_s()
    res = []
    for w in b.all_workers():
        kind, r = b.workers[w][1].recv()
        if kind != "ok":
            raise RuntimeError(f"worker {w}: flood: {r}")
        res.append(r)
    end = max(r["end"] for r in res)
    wall = end - start
    leader_cpu = sum(cpu_s(p) for p in pids) - c_start
    worker_cpu = b.worker_cpu_s() - w_start
    acks = sum(r["acks"] for r in res)
    return {"seconds": wall, "acks": acks, "errors": sum(r["errors"] for r in res),
            "why": b.errors_since(errs0), "ms_per_ack": 1e3 * leader_cpu / max(acks, 1),
            "rate": acks / wall, "leader_pct": 100 * leader_cpu / wall,
            "worker_pct": 100 * worker_cpu / wall,
            "replans": b.status().plan_generation - gen0}


def phase_latency(b: Bench, ranges: list[list[int]], arrivals: int, seed: int,
                  gap_s: float, budget_s: float, at_least: int) -> list[dict[str, Any]]:
    import random

    rng = random.Random(seed + 1)
    spans = (1, 2, 4, 8)
    out = []
    n = sum(len(r) for r in ranges)
    end = time.monotonic() + budget_s
    for k in range(arrivals):
        if k >= at_least and time.monotonic() > end:
            print(f"    ... time budget of {budget_s:g} s spent: {k} arrivals", file=sys.stderr)
            break
        w = k % len(ranges)
        span = min(spans[k % len(spans)], len(ranges[w]))
        first = rng.randrange(len(ranges[w]) - span + 1)
        spec = make_job(rng, f"arrival{k}", tuple(ranges[w][first:first + span]))
        # an isolated event: the last plan's follow-up Reports are all in, then a gap
        if not all(b.ask(b.all_workers(), "wait_quiet", 120.0, timeout=150)):
            raise RuntimeError("agents' reports after the last plan not acked in 120 s")
        time.sleep(gap_s)
        (arr,) = b.ask([w], "arrive", spec)
        (hosts,) = b.ask([w], "wait_planned", (spec.job_id, list(spec.hosts), 120.0),
                         timeout=150)
        if hosts is None or not arr["ok"]:
            raise RuntimeError(f"{spec.job_id}: not planned on its hosts within 120 s")
        gen = max(g for g, _ in hosts)
        per_agent = [t for ts in b.ask(b.all_workers(), "wait_generation", (gen, 120.0),
                                       timeout=150) if ts is not None for t in ts]
        if len(per_agent) != n:
            raise RuntimeError(f"{spec.job_id}: generation {gen} not everywhere within 120 s")
        st = b.status()
        t0 = arr["t0"]
        lat = np.array(per_agent) - t0
        row = {"job": spec.job_id, "span": span, "generation": gen,
               "hosts_s": max(t for _, t in hosts) - t0, "first_s": float(lat.min()),
               "half_s": float(np.median(lat)), "all_s": float(lat.max()),
               "ack_s": arr["acked"] - t0,
               "plan_s": st.plan_latency_s if st.plan_generation == gen else float("nan"),
               "causes": list(st.plan_causes) if st.plan_generation == gen else ["?"]}
        row["fanout_s"] = row["all_s"] - row["first_s"]
        out.append(row)
        print(f"    ... {spec.job_id} ({span} host{'s' if span > 1 else ''}): gen {gen}, "
              f"planning {1e3 * row['plan_s']:.0f} ms, first agent {1e3 * row['first_s']:.0f}"
              f" ms, job's hosts {1e3 * row['hosts_s']:.0f} ms, all {1e3 * row['all_s']:.0f} "
              f"ms; causes {row['causes'][:2]}", file=sys.stderr, flush=True)
    return out


def phase_agent(b: Bench, window_s: float) -> list[dict[str, Any]]:
    before = max(b.generations())
    agent, sock = b.start_agent()
    out = []

    for jobs in (0, 1):
        if jobs:
            before = max(b.generations())
            b.start_job(sock)
        gen = b.wait_agent(agent, sock, jobs, before)
        time.sleep(2.0)  # its report after the plan, then quiet
        s0 = sched_s(agent.pid)
        with cpu_window([agent.pid]) as w:
            time.sleep(window_s)
        sched = sched_s(agent.pid) - s0
        m = mem_mb(agent.pid)
        out.append({"jobs": jobs, "generation": gen, "pct": w["pct"], "cpu_s": w["cpu_s"],
                    "wall_s": w["wall_s"], "sched_pct": 100 * sched / w["wall_s"],
                    "rss": m["VmRSS"], "hwm": m["VmHWM"]})
        print(f"    ... real agent, {jobs} job(s): {w['pct']:.2f} % of a core, "
              f"RSS {m['VmRSS']:.1f} MB", file=sys.stderr, flush=True)
    return out


def plan_alone(args: argparse.Namespace, specs: list[JobSpec]) -> float:
    """The leader's planning step (plan_inputs + make_plan) on the steady state's inputs, in
    this process with every other process stopped: what planning costs without contention."""
    from _workload import inventory_pb, local_job_pb

    from cruxd.control.cluster import ClusterState
    from cruxd.control.host_plans import LeaderPlanConfig, make_plan, plan_inputs
    from cruxd.control.validate import check_report
    from cruxd.rpc import convert
    from cruxd.topo.builders import clos2

    topo = clos2(math.ceil((args.agents + 1) / HOSTS_PER_TOR), AGGS, HOSTS_PER_TOR,
                 nics_per_host=NICS_PER_HOST)
    parts: dict[int, list[Any]] = {}
    for spec in specs:
        for h in spec.hosts:
            parts.setdefault(h, []).append(local_job_pb(spec, h, 0))
    state = ClusterState(120.0, 0.1, 0.0)
    for i in range(args.agents):
        report = lpb.AgentReport(schema=1, host=inventory_pb(i), jobs=parts.get(i, []))
        state.ingest(check_report(convert.report_from_pb(report)), time.time())
    state.advance_profiling(time.time(), False)
    best = math.inf
    for _ in range(2):
        t0 = time.perf_counter()
        make_plan(plan_inputs(state, time.time()), topo, LeaderPlanConfig(), 1, time.time())
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true",
                    help="2,000 jobs, 5 arrivals, shorter flood and agent windows (< 90 s)")
    ap.add_argument("--agents", type=int, default=1000, help="simulated agents (default 1000)")
    ap.add_argument("--jobs", type=int, default=None,
                    help="jobs over them (default 5000, --quick 2000)")
    ap.add_argument("--workers", type=int, default=4, help="agent worker processes (default 4)")
    ap.add_argument("--arrivals", type=int, default=None,
                    help="job arrivals timed (default 12, --quick 5); fewer (not below 8, "
                         "--quick 4) when they take over 170 s (--quick 45 s)")
    ap.add_argument("--report-interval", type=float, default=5.0, metavar="S",
                    help="seconds between a simulated agent's periodic reports (default 5, "
                         "agent.report_interval_s's default)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.jobs is None:
        args.jobs = 2000 if args.quick else 5000
    arrivals = args.arrivals if args.arrivals is not None else (5 if args.quick else 12)
    flood_s = 3.0 if args.quick else 5.0
    window_s = 10.0 if args.quick else 20.0
    gap_s = 0.5
    budget_s = 45.0 if args.quick else 170.0  # for the arrivals; the leader's speed varies

    print_header(args, arrivals)
    started = time.monotonic()
    specs = make_jobs(args.agents, args.jobs, args.seed)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    tmp = Path(tempfile.mkdtemp(prefix="crux-control-plane-"))
    b = Bench(tmp, args)
    try:
        b.start_leader()
        assert b.leader is not None
        ranges = b.start_workers()
        print(f"    ... leader {b.address} (pid {b.leader.pid}), {args.workers} workers, "
              "connecting", file=sys.stderr, flush=True)
        s = phase_steady(b, specs)
        print(f"    ... steady after {s['steady_s']:.1f} s (generation {s['generation']})",
              file=sys.stderr, flush=True)
        ing = phase_ingest(b, flood_s)
        print(f"    ... ingestion {ing['rate']:.0f} reports/s", file=sys.stderr, flush=True)
        b.wait_steady()
        errs0 = b.errors()
        lat = phase_latency(b, ranges, arrivals, args.seed, gap_s, budget_s,
                            min(arrivals, 4 if args.quick else 8))
        lat_errors = b.errors_since(errs0)
        mem_loaded = mem_mb(b.leader.pid)
        agent = phase_agent(b, window_s)
        mem_end = mem_mb(b.leader.pid)
        if b.leader.poll() is not None:
            raise RuntimeError(f"leader exited: {b.log_tail('leader.log')}")
    finally:
        b.stop()
    errors_logged = b.log_tail("leader.log", 5)
    shutil.rmtree(tmp, ignore_errors=True)
    print("    ... make_plan() alone on the same inputs", file=sys.stderr, flush=True)
    alone = plan_alone(args, specs)

    print_report(args, specs, aggs=AGGS, hosts_per_tor=HOSTS_PER_TOR, s=s, ing=ing, lat=lat,
                 alone=alone, lat_errors=lat_errors, mem_loaded=mem_loaded, mem_end=mem_end,
                 agent=agent, flood_s=flood_s, window_s=window_s, gap_s=gap_s,
                 errors_logged=errors_logged)
    print(f"\n# total {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted; every process started was stopped", file=sys.stderr)
        sys.exit(130)
