"""The seed's microbenchmark (§4.4): each part of Crux against a brute-force optimum,
scored by the simulator's GPU utilisation.

Cases: <= 20 hosts of 8 GPUs, a 2-layer Clos with 2-4 ToRs and 2 aggregation
switches (one NIC per host), 5 ring all-reduce jobs on random hosts, 3 levels. Every
candidate decision is simulated for 8 x the longest standalone iteration, all jobs
starting together; utilisation = busy GPU-seconds / allocated GPU-seconds.

* compression: Crux's levels (Alg. 1 on the contention DAG) against the best of all
  ways to cut Crux's priority order into <= 3 consecutive levels (paths: Crux's).
* priority assignment: Crux's order, cut optimally, against the best of all ordered
  partitions of the jobs into <= 3 levels (181 for 5 jobs; paths: Crux's).
* path selection: Crux's paths against every per-job spine choice (each job sends
  all its inter-ToR flows through one aggregation switch; 2^5 configurations, plus
  Crux's own), each with Crux's priorities and compression computed for those paths.
  The seed pairs every path choice with optimal priorities; that is 181 simulations
  per configuration, so here the other two parts are Crux's own for every candidate.

    .venv/bin/python bench/optimality.py [--cases N] [--seed S] [--workers W]

These scores are against cuts of Crux's own order and single-spine choices under Crux's
own levels: they cannot see a loss from which jobs share a level on which links. The
joint mode (`_joint_case`, `_joint_report`) can: every per-job spine choice x every
assignment of the jobs to <= K levels, hosts shared between jobs, uplinks at R:1, with
crux-full, TACCL* (levels squashed as the trace simulation squashes them) and crux-ps-pa
as fractions of that optimum:

    .venv/bin/python bench/optimality.py --joint [--levels K] [--oversubscription R]
        [--cases N] [--workers W] [--json PATH] [--worst N] [--only SEED ...]
"""

from __future__ import annotations

import argparse
import itertools
import math
import multiprocessing
import shlex
import sys
import time
from collections.abc import Iterator, Sequence

import numpy as np

from cruxd.model.jobs import Job, ring_allreduce
from cruxd.model.paths import finder_for
from cruxd.model.topology import Topology
from cruxd.model.view import ClusterView
from cruxd.scheduler.compression import compress_indexed
from cruxd.scheduler.dag import contention_edges
from cruxd.scheduler.planner import PlanConfig, plan
from cruxd.sim.policies.base import Context, Decisions
from cruxd.sim.run import SimConfig, SimJob, simulate

LEVELS = 3
Paths = dict[str, tuple[np.ndarray, ...]]


class _Given:
    """A policy that returns fixed decisions."""

    name = "given"

    def __init__(self, decisions: Decisions) -> None:
        self.decisions = decisions

    def decide(self, ctx: Context) -> Decisions:
        return self.decisions


def make_case(rng: np.random.Generator) -> tuple[Topology, list[Job]]:
    tors = int(rng.integers(2, 5))
    per_tor = int(rng.integers(max(2, math.ceil(5 / tors)), 20 // tors + 1))
    topo = clos2_one_nic(tors, per_tor)
    hosts = topo.hosts
    jobs = []
    for k in range(5):
        members = rng.choice(len(hosts), size=int(rng.integers(2, 6)), replace=False)
        placed = tuple((hosts[int(h)], 8) for h in members)
        compute = float(rng.uniform(0.1, 2.0))
        size = float(np.exp(rng.uniform(math.log(1e8), math.log(3e9))))
        flows = ring_allreduce(placed, size, {h: 1 for h, _ in placed})
        jobs.append(Job(f"j{k}", placed, compute, len(placed) * 8 * compute * 1e14,
                        float(rng.uniform(0.0, 0.8)), flows, "ring_allreduce"))
    return topo, jobs


def clos2_one_nic(tors: int, per_tor: int) -> Topology:
    from cruxd.topo import clos2

    return clos2(tors, 2, per_tor, nics_per_host=1)


def utilisation(topo: Topology, jobs: list[Job], paths: Paths, levels: dict[str, int],
                horizon: float) -> float:
    result = simulate([SimJob(j) for j in jobs], topo, _Given(Decisions(level=levels,
                                                                          paths=paths)),
                      SimConfig(horizon_s=horizon, window_s=1e9))
    return result.gpu_utilization


def crux_levels(topo: Topology, jobs: list[Job], paths: Paths, rank: dict[str, int]
                ) -> dict[str, int]:
    """Crux's compression of its own ranks, on the DAG these paths induce."""
    ids = [j.id for j in jobs]
    link_of = np.concatenate([p for j in ids for p in paths[j]])
    job_of = np.concatenate([np.full(len(p), i) for i, j in enumerate(ids) for p in paths[j]])
    ranks = np.array([rank[j] for j in ids])
    hi, lo = contention_edges(link_of, job_of, ranks)
    intensity = np.ones(len(ids))  # weights: only the structure matters for 3 levels here
    lv = compress_indexed(len(ids), hi, lo, intensity[hi], LEVELS, np.argsort(ranks))
    return {j: int(lv[i]) for i, j in enumerate(ids)}


def splits(order: Sequence[str]) -> Iterator[dict[str, int]]:
    """Every cut of `order` (highest first) into <= LEVELS consecutive blocks."""
    n = len(order)
    for k in range(1, min(LEVELS, n) + 1):
        for cuts in itertools.combinations(range(1, n), k - 1):
            bounds = (0, *cuts, n)
            yield {order[i]: LEVELS - 1 - b for b in range(k)
                   for i in range(bounds[b], bounds[b + 1])}


def ordered_partitions(ids: Sequence[str]) -> Iterator[dict[str, int]]:
    """Every assignment of the jobs to <= LEVELS levels, up to unused levels."""
    seen = set()
    for assign in itertools.product(range(LEVELS), repeat=len(ids)):
        used = sorted(set(assign))
        canon = tuple(LEVELS - len(used) + used.index(a) for a in assign)
        if canon not in seen:
            seen.add(canon)
            yield dict(zip(ids, canon, strict=True))


def spine_choices(topo: Topology, jobs: list[Job]) -> Iterator[Paths]:
    finder = finder_for(topo)
    per_job: list[list[tuple[np.ndarray, ...]]] = []
    for j in jobs:
        options = []
        for spine in ("agg0", "agg1"):
            chosen = []
            for f in j.flows:
                cands = finder.candidates(f.src, f.dst)
                pick = [c for c in cands if spine in {topo.links[int(i)].dst for i in c}]
                chosen.append(np.asarray(pick[0] if pick else cands[0]))
            options.append(tuple(chosen))
        same = all(np.array_equal(a, b) for a, b in zip(*options, strict=True))
        per_job.append(options[:1] if same else options)
    for combo in itertools.product(*per_job):
        yield {j.id: p for j, p in zip(jobs, combo, strict=True)}


def run_case(seed: int) -> tuple[float, float, float]:
    rng = np.random.default_rng(seed)
    topo, jobs = make_case(rng)
    view = ClusterView(topo, tuple(jobs))
    p = plan(view, PlanConfig(levels=LEVELS, dscp=tuple(range(LEVELS))))
    horizon = 8 * max(d.period_s for d in p.jobs)
    rank = {d.job: d.rank for d in p.jobs}
    order = [d.job for d in p.jobs]
    paths: Paths = {j.id: tuple(np.array(f.path) for f in p.flows if f.job == j.id)
                    for j in jobs}
    crux = {d.job: d.level for d in p.jobs}

    def u(levels: dict[str, int], with_paths: Paths = paths) -> float:
        return utilisation(topo, jobs, with_paths, levels, horizon)

    u_crux = u(crux)
    best_cut = max(u(lv) for lv in splits(order))
    comp = u_crux / max(best_cut, u_crux)
    best_any = max(u(lv) for lv in ordered_partitions([j.id for j in jobs]))
    pa = best_cut / max(best_any, best_cut)
    best_paths = max(u(crux_levels(topo, jobs, ps, rank), ps) for ps in spine_choices(topo, jobs))
    ps_ratio = u_crux / max(best_paths, u_crux)
    return ps_ratio, pa, comp


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--cases", type=int, default=None,
                    help="cases (default 300; with --joint 40)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--joint", action="store_true",
                    help="against the joint optimum over paths x levels (see above)")
    ap.add_argument("--levels", type=int, default=LEVELS, help="K, with --joint")
    ap.add_argument("--oversubscription", type=float, default=1.0, help="R, with --joint")
    ap.add_argument("--json", metavar="PATH", help="with --joint: every case and the summary")
    ap.add_argument("--worst", type=int, default=0, metavar="N",
                    help="with --joint: the N worst cases for crux-full in detail")
    ap.add_argument("--only", type=int, nargs="+", metavar="SEED",
                    help="with --joint: just these case seeds (from --worst)")
    args = ap.parse_args(argv)
    if args.joint:
        from _joint_report import main_joint  # bench/ is on sys.path when run as a script

        if args.cases is None:
            args.cases = 40
        main_joint(args)
        return
    if args.cases is None:
        args.cases = 300
    print("$ " + shlex.join(sys.orig_argv))
    start = time.perf_counter()
    seeds = [args.seed * 1_000_003 + i for i in range(args.cases)]
    with multiprocessing.Pool(args.workers) as pool:
        rows = np.array(pool.map(run_case, seeds, chunksize=4))
    print(f"{args.cases} cases (2-4 ToRs x 2 aggs, <= 20 hosts of 8 GPUs, 5 jobs, "
          f"{LEVELS} levels), utilisation of Crux's part / brute-force optimum")
    print(f"{'part':22}{'mean':>9}{'p5':>9}{'min':>9}{'optimal':>9}{'seed':>9}")
    for name, col, seed_value in (("path selection", 0, "97.69 %"),
                                  ("priority assignment", 1, "97.24 %"),
                                  ("priority compression", 2, "97.12 %")):
        r = rows[:, col]
        print(f"{name:22}{100 * r.mean():8.2f}%{100 * np.percentile(r, 5):8.2f}%"
              f"{100 * r.min():8.2f}%{100 * np.mean(r >= 1 - 1e-9):8.1f}%{seed_value:>9}")
    cdf = np.percentile(rows, [1, 5, 10, 25, 50], axis=0)
    print("CDF of the ratio (percentiles 1, 5, 10, 25, 50):")
    for name, col in (("path selection", 0), ("priority assignment", 1),
                      ("priority compression", 2)):
        print(f"  {name:22}" + "  ".join(f"{100 * v:6.2f}%" for v in cdf[:, col]))
    print(f"# wall time {time.perf_counter() - start:.1f} s with {args.workers} workers")


if __name__ == "__main__":
    main()
