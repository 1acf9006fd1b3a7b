"""Control-plane benchmark: one real leader, simulated agents, jobs; two cluster shapes.

--shape stress (default): 1,000 agents, 5,000 jobs, GPUs oversubscribed ~10x: a load test.
--shape real: 10,000 agents (hosts of 8 GPUs, 8 x 200 Gbps NICs) on a three-tier fat tree,
  jobs of the trace's size mix on whole free hosts, no GPU oversubscription.
  The shapes' fabrics and workloads: bench/_cluster_shapes.py.

Protocol
  * Leader: a real `cruxd` process, leader role only, on 127.0.0.1 with a topology
    file (stress: clos2, 16 hosts per ToR, 16 aggregation switches, 4 x 100 Gbps NICs
    per host; real: clos3, see bench/_cluster_shapes.py; hosts h0..h{N} and more:
    one more than the simulated agents, for the real agent of (e)), debounce_ms 50,
    profiling_s 0 (no profiling windows), agent_timeout_s 120, metrics off, log
    level warning. The benchmark raises its RLIMIT_NOFILE soft limit to the hard one
    first (the leader, its children, holds one socket per connection).
  * Agents: N simulated agents (bench/_fake_agents.py) in W worker processes
    (multiprocessing, spawn), each on its own gRPC channel and TCP connection
    (real: --agents-per-channel K shares one channel, so one connection, among K
    agents): one WatchPlan stream (their liveness), a Report at start, right after each
    full plan received, when a plan stream comes back, and every --report-interval s
    (agent.refresh_s, 300): reports on change, as a real agent sends them. An agent holds a plan's
    generation on a full HostPlan or on an `unchanged` one (the leader's delta
    fan-out); a job is planned on a host only from a full plan that holds it.
    Stress workload: J jobs spanning 1, 2, 4 or 8 consecutive hosts (55/20/15/10 %);
    single-host jobs 1-8 GPUs, multi-host jobs 8 GPUs a host; declared W_j (30-60 %
    of 312 TFLOP/s per GPU over compute_s 0.1-2 s) and all-reduce sizes 1e8-1e10 B,
    each host reporting its share with node_rank/nnodes. Real workload: up to J jobs
    of the trace's size mix (8..512 GPUs) placed on free hosts until the fabric is
    full, hosts for the arrivals kept free (bench/_cluster_shapes.py).
  (a) Steady state: from the agents' first Reports until the leader's status shows
      every job scheduled and every agent holds that plan's generation.
  (a2) Idle: the steady state for the agent window's length (below), nothing happening:
      leader CPU (% of a core), the simulated agents' worker processes' CPU (% of a core,
      summed: how much of the box they take), leader RSS, plans and failed RPCs meanwhile.
      Target (real): leader <= 20 % of a core, RSS <= 1.5 GB.
  (b) Ingestion: every agent calls Report back to back (one in flight per agent)
      for 5 s (--quick 3 s); reports/s = ACKs / time until the last answer; leader
      CPU from /proc/PID/stat (utime+stime, all threads) over the same window.
      Failed calls are counted by status code (the leader rejects nothing, but
      gRPC may: see the output).
  (c) Event -> plan delivered: R job arrivals (default 12, fewer - not below 8 -
      once they have taken 170 s (real: 400 s); stress: cycling over 1, 2, 4, 8
      consecutive hosts of one worker; real: jobs of the trace's mix on free hosts
      of one worker; all of a job's hosts report it at once).
      Each is isolated: it starts once every agent's Report owed after its last full
      plan was acked, plus 0.5 s. t0 = time.monotonic() just before the
      first of the job's Report calls; "job's hosts" = the last of its hosts to
      receive a HostPlan where the job is planned; "all agents" = the last of the
      N agents to receive that generation (CLOCK_MONOTONIC is system-wide on
      Linux, so times compare across processes). Planning = the leader's own
      plan_latency_s (its first event -> publication, debounce included: the field
      `cruxctl status --leader ... --json` prints, read with the same Status RPC);
      fan-out = all agents - first agent. For reference, plan_inputs + make_plan
      alone on the same jobs, in this process once everything else has stopped.
      Targets (all agents, per arrival): stress median <= 500 ms and p99 <= 1 s; real
      median <= 1 s.
  (d) Leader memory: VmRSS and VmHWM of /proc/PID/status. Target: VmRSS <= 1 GB.
  (e) An idle real agent (`cruxd`, agent role only, host h{N}) connected to the
      loaded leader: CPU (utime+stime, and schedstat) over 20 s (--quick 10 s) as
      % of one core, and RSS; then the same with one job registered by
      `crux-run ... -- sleep 600`. Target: < 1 % of a core, < 60 MB RSS.

    --quick: 5 arrivals, a 3 s flood, 10 s agent windows; stress: 2,000 jobs (~90 s);
    real: still 10,000 agents and a full fabric (a few minutes).

    .venv/bin/python bench/control_plane.py [--shape stress|real] [--quick] [--agents N]
            [--jobs J] [--workers W] [--arrivals R] [--seed S] [--report-interval S]
            [--agents-per-channel K] [--max-gpus G]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import resource
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
from _cluster_shapes import (
    REAL_NIC_GBPS,
    REAL_NICS,
    clos3_pods,
    clos3_topology,
    inventory,
    real_workload,
    stress_arrivals,
)
from _cp_report import print_header, print_report
from _cp_stats import cpu_s, cpu_window, mem_mb, sched_s
from _leader_rig import AGGS, HOSTS_PER_TOR, Bench
from _real_rig import RealBench, worker_ranges
from _workload import NIC_GBPS, NICS_PER_HOST, JobSpec, make_jobs

from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb

# --- the measurements --------------------------------------------------------------

def phase_steady(b: Bench, specs: list[JobSpec], nics: int, timeout_s: float
                 ) -> dict[str, Any]:
    assert b.leader is not None
    t0 = time.monotonic()
    with cpu_window([b.leader.pid]) as lcpu:
        b.ask(b.all_workers(), "connect", (timeout_s - 30,), timeout=timeout_s)
        connected = time.monotonic() - t0
        st = b.wait_steady(timeout_s)
        steady = time.monotonic() - t0
    flows = sum(len(s.hosts) * nics for s in specs if len(s.hosts) > 1)
    return {"connected_s": connected, "steady_s": steady, "generation": st.plan_generation,
            "leader_cpu": lcpu, "plan_jobs": len(st.jobs),
            "plan_latency_s": st.plan_latency_s, "agents": len(st.agents), "flows": flows,
            "mem": mem_mb(b.leader.pid), "errors": b.errors_since({})}


def phase_idle(b: Bench, seconds: float) -> dict[str, Any]:
    """Steady state, nothing happening: what the leader and the simulated agents cost."""
    assert b.leader is not None
    errs0, gen0 = b.errors(), b.status().plan_generation
    w0, t0 = b.worker_cpu_s(), time.monotonic()
    with cpu_window([b.leader.pid]) as lcpu:
        time.sleep(seconds)
    wall = time.monotonic() - t0
    return {"leader": lcpu, "worker_pct": 100 * (b.worker_cpu_s() - w0) / wall,
            "mem": mem_mb(b.leader.pid), "errors": b.errors_since(errs0),
            "plans": b.status().plan_generation - gen0}


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


def phase_latency(b: Bench, n: int, arrivals: list[tuple[int, JobSpec]], gap_s: float,
                  budget_s: float, at_least: int) -> list[dict[str, Any]]:
    """arrivals: (worker, job) in turn; n: the simulated agents."""
    out = []
    end = time.monotonic() + budget_s
    for k, (w, spec) in enumerate(arrivals):
        if k >= at_least and time.monotonic() > end:
            print(f"    ... time budget of {budget_s:g} s spent: {k} arrivals", file=sys.stderr)
            break
        span = len(spec.hosts)
        # an isolated event: the last plan's follow-up Reports are all in, then a gap
        if not all(b.ask(b.all_workers(), "wait_quiet", 120.0, timeout=150)):
            raise RuntimeError("agents' reports after the last plan not acked in 120 s")
        time.sleep(gap_s)
        lcpu0, wcpu0 = cpu_s(b.leader.pid), b.worker_cpu_s()
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
        # CPU from just before the arrival until every agent held its plan (the wait's
        # polling, POLL_S, included): which side of the box the arrival kept busy
        lcpu, wcpu = cpu_s(b.leader.pid) - lcpu0, b.worker_cpu_s() - wcpu0
        st = b.status()
        t0 = arr["t0"]
        lat = np.array(per_agent) - t0
        row = {"job": spec.job_id, "span": span, "gpus": span * spec.gpus, "generation": gen,
               "hosts_s": max(t for _, t in hosts) - t0, "first_s": float(lat.min()),
               "half_s": float(np.median(lat)), "all_s": float(lat.max()),
               "ack_s": arr["acked"] - t0,
               "plan_s": st.plan_latency_s if st.plan_generation == gen else float("nan"),
               "causes": list(st.plan_causes) if st.plan_generation == gen else ["?"],
               "leader_cpu_s": lcpu, "workers_cpu_s": wcpu}
        row["fanout_s"] = row["all_s"] - row["first_s"]
        out.append(row)
        print(f"    ... {spec.job_id} ({span} host{'s' if span > 1 else ''}, "
              f"{span * spec.gpus} GPUs): gen {gen}, "
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
    from _workload import local_job_pb

    from cruxd.control.cluster import ClusterState
    from cruxd.control.host_plans import LeaderPlanConfig, make_plan, plan_inputs
    from cruxd.control.validate import check_report
    from cruxd.rpc import convert
    from cruxd.topo.builders import clos2

    if args.shape == "real":
        topo = clos3_topology(clos3_pods(args.agents + 1))
        nics, gbps = REAL_NICS, REAL_NIC_GBPS
    else:
        topo = clos2(math.ceil((args.agents + 1) / HOSTS_PER_TOR), AGGS, HOSTS_PER_TOR,
                     nics_per_host=NICS_PER_HOST)
        nics, gbps = NICS_PER_HOST, NIC_GBPS
    parts: dict[int, list[Any]] = {}
    for spec in specs:
        for h in spec.hosts:
            parts.setdefault(h, []).append(local_job_pb(spec, h, 0))
    state = ClusterState(120.0, 0.1, 0.0)
    for i in range(args.agents):
        report = lpb.AgentReport(schema=cpb.SCHEMA_REVISION_CURRENT,
                                 host=inventory(i, nics, gbps), jobs=parts.get(i, []))
        state.ingest(check_report(convert.report_from_pb(report)), time.time())
    state.advance_profiling(time.time(), False)
    best = math.inf
    for _ in range(2):
        t0 = time.perf_counter()
        make_plan(plan_inputs(state, time.time()), topo, LeaderPlanConfig(), 1, time.time())
        best = min(best, time.perf_counter() - t0)
    return best


def diagnose(b: Bench) -> None:
    """What the agents and the leader were doing when a phase gave up (stderr)."""
    from collections import Counter

    for _, conn in b.workers:  # answers still due to the command that gave up
        with contextlib.suppress(Exception):
            while conn.poll(5.0):
                conn.recv()
    with contextlib.suppress(Exception):
        print(f"    agents' failed RPCs so far: {b.errors_since({})}", file=sys.stderr)
        gens = b.generations()
        print(f"    generations the agents hold: {min(gens)}..{max(gens)}", file=sys.stderr)
    with contextlib.suppress(Exception):
        st = b.status()
        states = Counter(lpb_state_name(j.state) for j in st.jobs)
        print(f"    leader: plan {st.plan_generation} ({1e3 * st.plan_latency_s:.0f} ms), "
              f"{len(st.agents)} agents, jobs {dict(states)}, causes "
              f"{list(st.plan_causes)[:3]}", file=sys.stderr, flush=True)


def lpb_state_name(state: int) -> str:
    return cpb.JobState.Name(state).removeprefix("JOB_STATE_").lower()


def raise_nofile() -> int:
    """RLIMIT_NOFILE's soft limit up to the hard one (children inherit it); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--shape", choices=("stress", "real"), default="stress",
                    help="stress (default): 1,000 agents, 5,000 jobs, GPUs oversubscribed; "
                         "real: 10,000 agents on a clos3 fat tree, the trace's job mix on "
                         "free hosts (bench/_cluster_shapes.py)")
    ap.add_argument("--quick", action="store_true",
                    help="5 arrivals, shorter flood and agent windows; stress: 2,000 jobs "
                         "(< 90 s)")
    ap.add_argument("--agents", type=int, default=None,
                    help="simulated agents (default stress 1000, real 10000)")
    ap.add_argument("--jobs", type=int, default=None,
                    help="jobs over them (default stress 5000, --quick 2000; real: at most "
                         "2000, fewer when the fabric is full)")
    ap.add_argument("--workers", type=int, default=4, help="agent worker processes (default 4)")
    ap.add_argument("--arrivals", type=int, default=None,
                    help="job arrivals timed (default 12, --quick 5); fewer (not below 8, "
                         "--quick 4) when they take over 170 s (real 400 s; --quick 45 s, "
                         "real 120 s)")
    ap.add_argument("--report-interval", type=float, default=300.0, metavar="S",
                    help="a simulated agent's report at least this often (default 300, "
                         "agent.refresh_s's default); otherwise it reports, as the real agent "
                         "does, only at start, after a full plan, on a job arrival and when "
                         "its plan stream comes back")
    ap.add_argument("--agents-per-channel", type=int, default=1, metavar="K",
                    help="real shape: simulated agents sharing one gRPC channel (one TCP "
                         "connection); default 1, a connection per agent")
    ap.add_argument("--max-gpus", type=int, default=512, metavar="G",
                    help="real shape: the largest job size of the trace's mix (default 512; "
                         "128 fits 2,000 jobs in 80,000 GPUs)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    real = args.shape == "real"
    if args.agents is None:
        args.agents = 10000 if real else 1000
    if args.jobs is None:
        args.jobs = 2000 if real or args.quick else 5000
    if args.agents_per_channel != 1 and not real:
        ap.error("--agents-per-channel is for --shape real")
    n_arrivals = args.arrivals if args.arrivals is not None else (5 if args.quick else 12)
    flood_s = 3.0 if args.quick else 5.0
    window_s = 10.0 if args.quick else 20.0
    gap_s = 0.5
    # for the arrivals; the leader's speed varies
    budget_s = (120.0 if real else 45.0) if args.quick else (400.0 if real else 170.0)
    steady_timeout_s = (420.0 if args.quick else 900.0) if real else 300.0

    nofile = raise_nofile()
    started = time.monotonic()
    ranges = worker_ranges(args.agents, args.workers)
    if real:
        specs, arrivals = real_workload(args.agents, args.jobs, ranges, n_arrivals, args.seed,
                                        args.max_gpus)
        nics = REAL_NICS
    else:
        specs = make_jobs(args.agents, args.jobs, args.seed)
        arrivals = stress_arrivals(ranges, n_arrivals, args.seed)
        nics = NICS_PER_HOST
    print_header(args, n_arrivals, nofile)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    tmp = Path(tempfile.mkdtemp(prefix="crux-control-plane-"))
    b = RealBench(tmp, args) if real else Bench(tmp, args)
    try:
        b.start_leader()
        assert b.leader is not None
        if isinstance(b, RealBench):
            b.start_shaped_workers(ranges, specs, args.agents_per_channel)
        elif b.start_workers() != ranges:
            raise AssertionError("the workers' hosts are not worker_ranges'")
        print(f"    ... leader {b.address} (pid {b.leader.pid}), {args.workers} workers, "
              "connecting", file=sys.stderr, flush=True)
        try:
            s = phase_steady(b, specs, nics, steady_timeout_s)
        except RuntimeError:
            diagnose(b)
            raise
        print(f"    ... steady after {s['steady_s']:.1f} s (generation {s['generation']})",
              file=sys.stderr, flush=True)
        idle = phase_idle(b, window_s)
        print(f"    ... idle: leader {idle['leader']['pct']:.1f} % of a core, agents' "
              f"workers {idle['worker_pct']:.1f} %", file=sys.stderr, flush=True)
        ing = phase_ingest(b, flood_s)
        print(f"    ... ingestion {ing['rate']:.0f} reports/s", file=sys.stderr, flush=True)
        b.wait_steady(steady_timeout_s)
        errs0 = b.errors()
        plans0 = b.ask(b.all_workers(), "plans")
        lat = phase_latency(b, args.agents, arrivals, gap_s, budget_s,
                            min(n_arrivals, 4 if args.quick else 8))
        lat_errors = b.errors_since(errs0)
        plans = [sum(p[i] - q[i] for p, q in zip(b.ask(b.all_workers(), "plans"), plans0,
                                                  strict=True)) for i in (0, 1)]
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

    print_report(args, specs, arrivals=[sp for _, sp in arrivals], s=s, idle=idle, ing=ing,
                 lat=lat,
                 alone=alone, lat_errors=lat_errors, plans=plans, mem_loaded=mem_loaded,
                 mem_end=mem_end, agent=agent, flood_s=flood_s, window_s=window_s,
                 gap_s=gap_s, errors_logged=errors_logged)
    print(f"\n# total {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted; every process started was stopped", file=sys.stderr)
        sys.exit(130)
