"""Incremental planning (cruxd/scheduler/incremental.py) against plan() from scratch.

Protocol
  * Fabric A, the control-plane benchmark's (bench/control_plane.py): clos2 with 16
    hosts per ToR, 16 aggregation switches, 4 x 100 Gbit/s NICs per host, 1,001 hosts;
    5,000 jobs as bench/_workload.py draws them (1/2/4/8 consecutive hosts, declared
    W_j and all-reduce sizes), each a ring all-reduce as the leader builds it.
  * Fabric B: a 3-tier Clos of 10,000 hosts x 8 GPUs (25 pods of 16 ToRs x 25 hosts,
    4 x 100 Gbit/s NICs per host, 8 aggregation switches per pod, 8 planes of 8
    cores, 1:1); 2,000 jobs from cruxd.workload.synth_jobs (the trace's size and
    model mix; exclusive=False: the mix needs more GPUs than the fabric has).
  * The last --arrivals jobs arrive one at a time. Per arrival: plan() from scratch
    on the new view, and IncrementalPlanner.plan after it planned every earlier view,
    (i) given the same Job objects plus the new one (as the simulator does), (ii)
    given freshly built, equal Job objects (as the leader's make_plan builds them).
    Every incremental plan is checked equal to the from-scratch one. Wall time of the
    plan call alone (time.perf_counter), and the planning thread's CPU time
    (time.thread_time: what a shared, loaded machine inflates least); PlanConfig()
    defaults (5 levels, 10 samples).
  * "re-picked": jobs whose paths were picked again; "components": contention
    components compressed again / reused.

    .venv/bin/python bench/incremental_plan.py [--arrivals R] [--only A|B]
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
from _workload import NICS_PER_HOST, make_jobs  # bench/ is on sys.path when run as a script
from tables import preamble, table

from cruxd.model.jobs import Job, ring_allreduce
from cruxd.model.plan import Plan
from cruxd.model.topology import Topology, TopologyBuilder
from cruxd.model.view import ClusterView
from cruxd.scheduler.incremental import IncrementalPlanner
from cruxd.scheduler.planner import PlanConfig, plan
from cruxd.topo.builders import clos2
from cruxd.workload import synth_jobs


def fabric_a() -> tuple[Topology, list[Job]]:
    hosts = 1001
    topo = clos2(math.ceil(hosts / 16), 16, 16, nics_per_host=NICS_PER_HOST)
    jobs = []
    for s in make_jobs(hosts, 5000, seed=0):
        placed = tuple((f"h{h}", s.gpus) for h in s.hosts)
        flows = (ring_allreduce(placed, s.allreduce_bytes, {h: NICS_PER_HOST for h, _ in placed})
                 if len(placed) > 1 else ())
        # as the leader's _as_job makes it: declared hints, default overlap, no t_j yet
        jobs.append(Job(s.job_id, placed, s.compute_s, s.flops_per_iter, 0.5, flows,
                        declared=True))
    return topo, jobs


def clos3(pods: int = 25, tors: int = 16, hosts_per_tor: int = 25, aggs: int = 8,
          cores_per_plane: int = 8, nics: int = 4, gbps: float = 100.0) -> Topology:
    b = TopologyBuilder("clos3-10k")
    planes = [[b.switch(f"core{a}_{c}", 3) for c in range(cores_per_plane)]
              for a in range(aggs)]
    tor_agg = hosts_per_tor * nics * gbps / aggs
    agg_core = tors * tor_agg / cores_per_plane
    h = 0
    for p in range(pods):
        pod_aggs = [b.switch(f"agg{p}_{a}", 2) for a in range(aggs)]
        for a, agg in enumerate(pod_aggs):
            for core in planes[a]:
                b.link(agg, core, agg_core)
        for t in range(tors):
            tor = b.switch(f"tor{p}_{t}", 1)
            for agg in pod_aggs:
                b.link(tor, agg, tor_agg)
            for _ in range(hosts_per_tor):
                b.link(b.host(f"h{h}", 8), tor, gbps, count=nics)
                h += 1
    return b.build()


def fabric_b() -> tuple[Topology, list[Job]]:
    topo = clos3()
    return topo, synth_jobs(topo, 2000, seed=0, exclusive=False)


def fresh(job: Job) -> Job:
    """An equal Job with its own flow objects, as make_plan builds one per plan."""
    return replace(job, flows=tuple(replace(f) for f in job.flows))


def run(name: str, topo: Topology, jobs: list[Job], arrivals: int) -> list[list[str]]:
    config = PlanConfig()
    base, coming = jobs[:-arrivals], jobs[-arrivals:]
    same, rebuilt = IncrementalPlanner(), IncrementalPlanner()
    same.plan(ClusterView(topo, tuple(base)), config)
    rebuilt.plan(ClusterView(topo, tuple(fresh(j) for j in base)), config)
    plan(ClusterView(topo, tuple(base)), config)  # warm the path finder's caches
    full_t: list[tuple[float, float]] = []
    same_t: list[tuple[float, float]] = []
    rebuilt_t: list[tuple[float, float]] = []
    repicked, comps = [], []
    current = list(base)
    for job in coming:
        current.append(job)
        view = ClusterView(topo, tuple(current))
        want = timed(full_t, plan, view, config)
        got = timed(same_t, same.plan, view, config)
        got2 = timed(rebuilt_t, rebuilt.plan, ClusterView(topo, tuple(fresh(j) for j in current)),
                     config)
        if got != want or got2 != want:
            raise SystemExit(f"{name}: the incremental plan differs after {job.id}")
        repicked.append(same.repicked)
        memo = same._memo
        comps.append(f"{memo.misses}/{memo.hits}")
    flows = sum(len(j.flows) for j in jobs)
    rows = []
    for label, ts in (("plan() from scratch", full_t), ("incremental, same Jobs", same_t),
                      ("incremental, rebuilt Jobs", rebuilt_t)):
        wall, cpu = np.array(ts).T * 1e3
        rows.append([name, f"{len(topo.hosts)}", f"{len(jobs)}", f"{flows}", label,
                     f"{np.median(wall):.1f}", f"{np.percentile(wall, 99):.1f}",
                     f"{np.median(cpu):.1f}", f"{np.percentile(cpu, 99):.1f}"])
    print(f"    {name}: re-picked jobs per arrival {repicked}; contention components "
          f"solved/reused per arrival {comps}", flush=True)
    return rows


def timed(out: list[tuple[float, float]], fn: Callable[[ClusterView, PlanConfig], Plan],
          view: ClusterView, config: PlanConfig) -> Plan:
    """fn(view, config), appending (wall, this thread's CPU) seconds to `out`."""
    w0, c0 = time.perf_counter(), time.thread_time()
    result = fn(view, config)
    out.append((time.perf_counter() - w0, time.thread_time() - c0))
    return result


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--arrivals", type=int, default=12)
    ap.add_argument("--only", choices=["A", "B"], default=None)
    args = ap.parse_args(argv)
    preamble(f"numpy {np.__version__}", f"load average {os.getloadavg()[0]:.2f} at start")
    print()
    rows = []
    for key, name, build in (("A", "A clos2", fabric_a), ("B", "B clos3", fabric_b)):
        if args.only in (None, key):
            topo, jobs = build()
            rows += run(name, topo, jobs, args.arrivals)
    print()
    print(f"Plan time per arrival, ms ({args.arrivals} arrivals; p99 = np.percentile, ~ the "
          "second largest of 12)")
    print(table(["fabric", "hosts", "jobs", "flows", "planner", "wall median", "wall p99",
                 "CPU median", "CPU p99"], rows))
    print(f"# load average {os.getloadavg()[0]:.2f} at the end (the machine is shared: "
          "a load above the core count inflates every time)")


if __name__ == "__main__":
    main()
