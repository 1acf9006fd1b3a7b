"""Planner benchmarks.

(a) Priority compression against the optimum on the seed's microbenchmark (§4.4):
    small 2-layer Clos fabrics, 5 jobs, 3 levels; the planner's contention DAG is
    compressed by `compress` (Alg. 1), by the planner itself, and by two naive
    baselines, and each cut is divided by the MIP optimum (`compress_exact`).
(b) plan() latency at trace scale (§2.2 fabrics) with synthetic jobs
    (`cruxd.workload.synth_jobs`).

    .venv/bin/python bench/planner.py [--quick] [--cases N] [--seed S]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
from tables import preamble, table  # bench/ is on sys.path when run as a script

from cruxd.model.jobs import Job, ring_allreduce
from cruxd.model.plan import Plan
from cruxd.model.topology import Topology
from cruxd.model.view import ClusterView
from cruxd.scheduler.compression import compress
from cruxd.scheduler.compression_mip import compress_exact, cut_weight
from cruxd.scheduler.dag import contention_edges
from cruxd.scheduler.planner import PlanConfig, plan
from cruxd.topo.builders import clos2, double_sided, trace_clos
from cruxd.workload import synth_jobs

Edges = dict[tuple[str, str], float]
Levels = dict[str, int]
EXACT = 1.0 - 1e-9  # a ratio at least this counts as optimal


def dag_edges(p: Plan) -> Edges:
    """The planner's contention DAG rebuilt from its output, as the planner builds it:
    jobs whose chosen paths share a link, higher rank -> lower rank, weight I_hi."""
    ids = [d.job for d in p.jobs]  # sorted by rank, and ranks are 0..n-1
    index = {j: i for i, j in enumerate(ids)}
    link_of = np.fromiter((x for f in p.flows for x in f.path), dtype=np.int64)
    job_of = np.fromiter((index[f.job] for f in p.flows for _ in f.path), dtype=np.int64)
    hi, lo = contention_edges(link_of, job_of, np.arange(len(ids)))
    return {(ids[h], ids[lo_]): p.jobs[h].intensity
            for h, lo_ in zip(hi.tolist(), lo.tolist(), strict=True)}


def rank_order(p: Plan, edges: Edges) -> list[str]:
    nodes = {str(x) for e in edges for x in e}
    return [d.job for d in p.jobs if d.job in nodes]


def sincronia(order: list[str], levels: int) -> Levels:
    """The first levels-1 jobs one level each from the top, everybody else on level 0."""
    return {j: max(levels - 1 - i, 0) for i, j in enumerate(order)}


def balanced(order: list[str], levels: int) -> Levels:
    """Rank order cut into `levels` equal consecutive chunks, the first on top."""
    chunks = np.array_split(np.arange(len(order)), levels)
    return {order[int(i)]: levels - 1 - c for c, chunk in enumerate(chunks) for i in chunk}


def micro_case(rng: np.random.Generator, njobs: int = 5) -> ClusterView:
    """§4.4: 2-4 ToRs, 2 aggregation switches, <= 20 hosts, `njobs` jobs on random hosts."""
    tors = int(rng.integers(2, 5))
    per_tor = int(rng.integers(max(2, math.ceil(5 / tors)), 20 // tors + 1))
    topo = clos2(tors, 2, per_tor, nics_per_host=1)
    hosts = topo.hosts
    jobs = []
    for k in range(njobs):
        members = rng.choice(len(hosts), size=int(rng.integers(2, 6)), replace=False)
        gpus = int(rng.choice([4, 8]))
        placed = tuple((hosts[int(h)], gpus) for h in members)
        compute = float(rng.uniform(0.1, 2.0))
        nbytes = float(np.exp(rng.uniform(math.log(1e8), math.log(3e9))))
        flows = ring_allreduce(placed, nbytes, {h: 1 for h, _ in placed})
        jobs.append(Job(f"j{k}", placed, compute, len(placed) * gpus * compute * 100e12,
                        float(rng.uniform(0.0, 0.8)), flows, "ring_allreduce"))
    return ClusterView(topo, tuple(jobs))


def part_a(cases: int, seed: int, njobs: int = 5, levels: int = 3) -> None:
    rng = np.random.default_rng(seed)
    methods: dict[str, Callable[[Plan, Edges], Levels]] = {
        "crux compress() (Alg. 1)": lambda p, e: compress(e, levels, seed=seed),
        "planner's own levels": lambda p, e: {d.job: d.level for d in p.jobs},
        "sincronia-style": lambda p, e: sincronia(rank_order(p, e), levels),
        "balanced": lambda p, e: balanced(rank_order(p, e), levels),
    }
    ratios: dict[str, list[float]] = {m: [] for m in methods}
    contended = 0
    t_exact = t_crux = 0.0
    for _ in range(cases):
        view = micro_case(rng, njobs)
        p = plan(view, PlanConfig(levels=levels))
        edges = dag_edges(p)
        if not edges:
            continue
        contended += 1
        t0 = time.perf_counter()
        best = cut_weight(edges, compress_exact(edges, levels))
        t_exact += time.perf_counter() - t0
        for name, method in methods.items():
            t0 = time.perf_counter()
            assignment = method(p, edges)
            if name.startswith("crux"):
                t_crux += time.perf_counter() - t0
            got = cut_weight(edges, assignment)
            ratios[name].append(got / best if best > 0 else 1.0)
    print(f"(a) Compression vs optimum: {cases} cases (2-4 ToRs x 2 aggs, <= 20 hosts, 1 NIC; "
          f"{njobs} jobs, {levels} levels; seed {seed})")
    print(f"    cases with contention: {contended}  (skipped without: {cases - contended})")
    rows = []
    for name, r in ratios.items():
        a = np.array(r) if r else np.ones(1)
        rows.append([name, f"{100 * a.mean():.2f} %", f"{100 * np.percentile(a, 5):.2f} %",
                     f"{100 * a.min():.2f} %", f"{100 * np.mean(a >= EXACT):.1f} %"])
    print(table(["method", "mean", "p5", "min", "optimal"], rows))
    if njobs == 5 and levels == 3:
        print("    target: crux mean >= 99 % (seed Fig. 16 reports 97.12 % for compression)")
    else:
        print("    beyond the seed's setting: more jobs than 10 sampled orders can cover")
    if contended:
        print(f"    time per DAG: compress() {1e3 * t_crux / contended:.2f} ms, "
              f"MIP optimum {1e3 * t_exact / contended:.2f} ms")
    print("    ratio = cut weight / optimal cut weight on the planner's contention DAG")
    print("    (edge hi->lo per pair of jobs sharing a chosen link, weight I_hi);")
    print("    sincronia-style: levels-1 top-ranked jobs one level each, rest on level 0;")
    print("    balanced: rank order in equal consecutive chunks.")


def part_b(quick: bool, seed: int) -> None:
    # (jobs, largest job): the trace mix averages ~54 GPUs a job, so 100 such jobs
    # overflow a 2,000-GPU fabric; the "<= 32 GPUs" row is 100 jobs that fit it.
    cases = [(30, 512), (100, 32), (100, 512), (1000, 512)] + ([] if quick else [(5000, 512)])
    runs = ({30: 5, 100: 5, 1000: 1} if quick else {30: 20, 100: 20, 1000: 5, 5000: 3})
    fabrics: list[Callable[[], Topology]] = [trace_clos, double_sided]
    rows = []
    shared = False
    for build in fabrics:
        topo = build()
        for n, largest in cases:
            jobs = synth_jobs(topo, n, seed=seed, exclusive=True, max_gpus=largest)
            exclusive = len(jobs) == n
            if not exclusive:
                jobs = synth_jobs(topo, n, seed=seed, exclusive=False, max_gpus=largest)
                shared = True
            view = ClusterView(topo, tuple(jobs))
            config = PlanConfig(levels=5)
            times = []
            p = None
            for _ in range(runs[n]):
                t0 = time.perf_counter()
                p = plan(view, config)
                times.append(time.perf_counter() - t0)
            assert p is not None
            edges = dag_edges(p)
            t = np.array(times)
            gpus = sum(j.gpus for j in jobs)
            label = f"{n}" + (f" (<= {largest} GPUs)" if largest < 512 else "")
            rows.append([f"{topo.name} ({topo.total_gpus()} GPUs)", label,
                         f"{gpus}" + ("" if exclusive else " *"), len(p.flows), len(edges),
                         len({x for e in edges for x in e}), runs[n],
                         f"{1e3 * np.median(t):.1f}", f"{1e3 * np.percentile(t, 99):.1f}"])
            print(f"    ... {topo.name} {n} jobs: median {1e3 * np.median(t):.1f} ms",
                  file=sys.stderr, flush=True)
    print(f"(b) plan() latency, PlanConfig(levels=5), synth_jobs(seed={seed})")
    print(table(["fabric", "jobs", "GPUs used", "flows", "DAG edges", "contending",
                 "runs", "median ms", "p99 ms"], rows))
    print("    targets: 100 jobs on a 2,000-GPU fabric well under 100 ms; 5000 jobs under 5 s")
    print("    p99 is np.percentile(99) over the runs listed (with <= 20 runs: ~the max);")
    print("    the first (cold) run is included. DAG edges/contending: the planner's DAG.")
    if shared:
        print("    * the fabric cannot hold these jobs exclusively: synth_jobs(exclusive=False)")
        print("      reuses hosts round-robin, so GPUs are OVERSUBSCRIBED (GPUs used > fabric);")
        print("      only meaningful as a planner stress test.")
    if quick:
        print("    --quick: 5000-job case left out, fewer runs.")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="fewer cases and runs (< 60 s)")
    ap.add_argument("--cases", type=int, default=None, help="cases for (a) (default 1500)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    cases = args.cases if args.cases is not None else (200 if args.quick else 1500)
    preamble(f"numpy {np.__version__}")
    start = time.perf_counter()
    print()
    part_a(cases, args.seed)
    print()
    for levels in (3, 5):
        part_a(max(50, cases // 5), args.seed, njobs=20, levels=levels)
        print()
    part_b(args.quick, args.seed)
    print(f"\n# total wall time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
