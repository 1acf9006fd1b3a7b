"""One case of `optimality.py --joint`: the joint brute-force optimum over paths and levels,
and what crux-full, TACCL* and crux-ps-pa get on the same case.

The optimum is over every per-job spine choice (each job sends all its inter-ToR flows
through agg0 or agg1; plus the paths crux-full, crux-ps-pa and TACCL* chose, whole) x every
assignment of the jobs to <= K levels. Simulated utilisation depends only on each
contention component's jobs, their paths and the dense order of their levels inside the
component (cruxd/sim/running.py `_part`, cruxd/sim/epoch.py): every component is simulated
on its own, memoised under that signature, and a configuration's busy GPU-seconds are the
sum over its components. Levels of different components are independent (any <= K-level
ordering of each component fits together in K levels), so the optimum for one path
configuration is the sum over its components of each one's best <= K-block weak order.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cruxd.model.jobs import Job, ring_allreduce
from cruxd.model.paths import finder_for
from cruxd.model.topology import Topology
from cruxd.sim.epoch import components
from cruxd.sim.policies.base import Context, Decisions, Policy
from cruxd.sim.policies.crux import crux_full, crux_ps_pa
from cruxd.sim.policies.taccl import Taccl
from cruxd.sim.run import SimConfig, SimJob, _admit, _fit_levels, simulate
from cruxd.topo.builders import clos2

JobPaths = tuple[np.ndarray, ...]
MAX_HOSTS = 20


class _Given:
    """A policy that returns fixed decisions (levels already fitted)."""

    name = "given"
    ideal_levels = True

    def __init__(self, decisions: Decisions) -> None:
        self.decisions = decisions

    def decide(self, ctx: Context) -> Decisions:
        return self.decisions


@dataclass
class Case:
    seed: int
    tors: int
    per_tor: int
    topo: Topology
    jobs: list[Job]
    horizon: float = math.nan


def make_case(seed: int, oversubscription: float) -> Case:
    """2-4 ToRs x 2 aggs, <= 20 hosts of 8 GPUs (one NIC each), uplinks at R:1; 5 ring
    all-reduce jobs of 2-5 hosts with 8, 4 or 2 GPUs on each, so hosts may be shared
    (jobs on one host share its NIC link; a job's ring visits a host once, so a job has
    no intra-host flow)."""
    rng = np.random.default_rng(seed)
    tors = int(rng.integers(2, 5))
    per_tor = int(rng.integers(max(2, math.ceil(5 / tors)), MAX_HOSTS // tors + 1))
    topo = clos2(tors, 2, per_tor, nics_per_host=1, oversubscription=oversubscription)
    hosts = topo.hosts
    free = {h: 8 for h in hosts}
    jobs = []
    for k in range(5):
        want = int(rng.integers(2, 6))
        per_host = int(rng.choice([8, 4, 2], p=[0.4, 0.4, 0.2]))
        while True:
            fits = [h for h in hosts if free[h] >= per_host]
            if len(fits) >= 2 or per_host == 1:
                break
            per_host //= 2
        members = rng.choice(len(fits), size=min(want, len(fits)), replace=False)
        placed = tuple((fits[int(i)], per_host) for i in members)
        for h, g in placed:
            free[h] -= g
        compute = float(rng.uniform(0.1, 2.0))
        size = float(np.exp(rng.uniform(math.log(1e8), math.log(3e9))))
        flows = ring_allreduce(placed, size, {h: 1 for h, _ in placed})
        gpus = sum(g for _, g in placed)
        jobs.append(Job(f"j{k}", placed, compute, gpus * compute * 1e14,
                        float(rng.uniform(0.0, 0.8)), flows, "ring_allreduce"))
    return Case(seed, tors, per_tor, topo, jobs)


def shared_hosts(case: Case) -> int:
    count: dict[str, int] = {}
    for j in case.jobs:
        for h, _ in j.hosts:
            count[h] = count.get(h, 0) + 1
    return sum(1 for c in count.values() if c > 1)


def spine_options(case: Case) -> list[list[JobPaths]]:
    """Per job: all its flows via agg0, all via agg1 (one option if it stays in a ToR)."""
    topo, finder = case.topo, finder_for(case.topo)
    out = []
    for j in case.jobs:
        options = []
        for spine in ("agg0", "agg1"):
            chosen = []
            for f in j.flows:
                cands = finder.candidates(f.src, f.dst, f.src_port, f.dst_port)
                pick = [c for c in cands if spine in {topo.links[int(i)].dst for i in c}]
                chosen.append(np.asarray(pick[0] if pick else cands[0], dtype=np.int64))
            options.append(tuple(chosen))
        same = all(np.array_equal(a, b) for a, b in zip(*options, strict=True))
        out.append(options[:1] if same else options)
    return out


def policy_decisions(case: Case, policy: Policy, levels: int) -> Decisions:
    """What the trace simulation would use at t = 0: the policy's decisions, fitted to
    `levels` by `_fit_levels` unless the policy asks for ideal levels."""
    ctx = Context(case.topo, finder_for(case.topo, SimConfig.max_paths), tuple(case.jobs),
                  frozenset(j.id for j in case.jobs), 0.0, levels, {}, 0)
    d = policy.decide(ctx)
    if not getattr(policy, "ideal_levels", False):
        d = _fit_levels(d, levels)
    return d


def weak_orders(n: int, k: int) -> Iterator[tuple[int, ...]]:
    """Every assignment of n items to <= k levels, densely ranked (0 = lowest)."""
    seen = set()
    for assign in itertools.product(range(min(n, k)), repeat=n):
        used = sorted(set(assign))
        canon = tuple(used.index(a) for a in assign)
        if canon not in seen:
            seen.add(canon)
            yield canon


def dense(values: Sequence[int]) -> tuple[int, ...]:
    rank = {v: i for i, v in enumerate(sorted(set(values)))}
    return tuple(rank[v] for v in values)


def path_key(p: JobPaths) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(x) for x in a) for a in p)


class Evaluator:
    """Busy GPU-seconds of contention components, memoised by `key`: with `merge`, by
    their jobs, paths up to the agg0 <-> agg1 mirror, and the order (<, =, >) of the
    levels of each pair of jobs that share a link; without, by their jobs, paths and
    dense levels (what the simulator's own cache keys on)."""

    def __init__(self, case: Case, merge: bool = True) -> None:
        self.case, self.merge = case, merge
        self.by_id = {j.id: j for j in case.jobs}
        self.memo: dict[Any, float] = {}
        self.simulations = 0
        index = {(lk.src, lk.dst): i for i, lk in enumerate(case.topo.links)}
        swap = {"agg0": "agg1", "agg1": "agg0"}
        self.mirror = [index[(swap.get(lk.src, lk.src), swap.get(lk.dst, lk.dst))]
                       for lk in case.topo.links]

    def key(self, ids: Sequence[str], paths: dict[str, JobPaths], order: tuple[int, ...]
            ) -> Any:
        if not self.merge:
            return tuple((j, path_key(paths[j]), r) for j, r in zip(ids, order, strict=True))
        keys = [path_key(paths[j]) for j in ids]
        mirrored = [tuple(tuple(self.mirror[x] for x in a) for a in p) for p in keys]
        links = [{x for a in p for x in a} for p in keys]
        signs = tuple((order[a] > order[b]) - (order[a] < order[b])
                      for a, b in itertools.combinations(range(len(ids)), 2)
                      if links[a] & links[b])
        return tuple(ids), min(tuple(keys), tuple(mirrored)), signs

    def parts(self, paths: dict[str, JobPaths]) -> list[list[str]]:
        ids = [j.id for j in self.case.jobs]
        links = [{int(x) for p in paths[j] for x in p} for j in ids]
        return [sorted(ids[i] for i in g) for g in components(links)]

    def busy(self, ids: Sequence[str], paths: dict[str, JobPaths], order: tuple[int, ...]
             ) -> float:
        key = self.key(ids, paths, order)
        got = self.memo.get(key)
        if got is None:
            self.simulations += 1
            d = Decisions(level=dict(zip(ids, order, strict=True)),
                          paths={j: paths[j] for j in ids})
            res = simulate([SimJob(self.by_id[j]) for j in ids], self.case.topo, _Given(d),
                           SimConfig(horizon_s=self.case.horizon, window_s=1e9))
            got = self.memo[key] = sum(s[2] for s in res.series)
        return got

    def alloc(self) -> float:
        return sum(j.gpus for j in self.case.jobs) * self.case.horizon

    def utilisation(self, paths: dict[str, JobPaths], level: dict[str, int]) -> float:
        total = sum(self.busy(g, paths, dense([level.get(j, 0) for j in g]))
                    for g in self.parts(paths))
        return total / self.alloc()

    def best(self, paths: dict[str, JobPaths], k: int) -> tuple[float, dict[str, int]]:
        """The best utilisation over <= k levels for these paths, and levels reaching it
        (each component's best order, top-aligned at level k - 1)."""
        total, level = 0.0, {}
        for g in self.parts(paths):
            full = sum(self.by_id[j].gpus for j in g) * self.case.horizon * (1 - 1e-12)
            b, o = -1.0, ()
            for order in weak_orders(len(g), k):
                got = self.busy(g, paths, order)
                if got > b:
                    b, o = got, order
                if b >= full:  # every GPU busy all the time: nothing does better
                    break
            total += b
            top = max(o)
            level.update({j: k - 1 - top + r for j, r in zip(g, o, strict=True)})
        return total / self.alloc(), level


def describe(case: Case, paths: dict[str, JobPaths], level: dict[str, int]) -> dict[str, str]:
    """Per job: 'L<level> <aggs its paths use>' ('-' within one ToR)."""
    out = {}
    for j in case.jobs:
        aggs = sorted({case.topo.links[int(x)].dst for p in paths[j.id] for x in p
                       if case.topo.links[int(x)].dst.startswith("agg")})
        out[j.id] = f"L{level.get(j.id, 0)} {'+'.join(aggs) or '-'}"
    return out


def job_summary(j: Job) -> str:
    hosts = ",".join(f"{h}:{g}" for h, g in j.hosts)
    size = j.network_bytes / max(1, len(j.flows))
    return (f"{j.id} [{hosts}] compute {j.compute_s:.2f}s overlap {j.overlap:.2f} "
            f"{size / 1e9:.2f} GB/hop")


def run_joint(args: tuple[int, int, float]) -> dict[str, Any]:
    """One case: utilisations of the optimum and of each policy, and the details."""
    seed, k, oversub = args
    case = make_case(seed, oversub)
    pols = {"crux-full": (crux_full(), k), "taccl*": (Taccl(), k),
            "crux-ps-pa": (crux_ps_pa(), k)}
    dec = {name: policy_decisions(case, p, lv) for name, (p, lv) in pols.items()}
    # 8 x the longest standalone iteration, as the simulator computes it (the same as the
    # planner's period_s, which the per-part mode uses)
    finder = finder_for(case.topo, SimConfig.max_paths)
    case.horizon = 8 * max(_admit(SimJob(j), 0.0, finder).period for j in case.jobs)
    ev = Evaluator(case)
    ids = [j.id for j in case.jobs]
    configs: dict[Any, dict[str, JobPaths]] = {}
    for d in dec.values():  # the policies' own paths first: often optimal already
        cfg = {j: tuple(np.asarray(x, dtype=np.int64) for x in d.paths[j]) for j in ids}
        configs.setdefault(tuple(path_key(cfg[j]) for j in ids), cfg)
    for combo in itertools.product(*spine_options(case)):
        cfg = dict(zip(ids, combo, strict=True))
        configs.setdefault(tuple(path_key(cfg[j]) for j in ids), cfg)
    u_opt, opt_paths, opt_level = -1.0, None, None
    for cfg in configs.values():
        u, lv = ev.best(cfg, k)
        if u > u_opt:
            u_opt, opt_paths, opt_level = u, cfg, lv
        if u_opt >= 1 - 1e-12:  # every GPU busy all the time
            break
    assert opt_paths is not None and opt_level is not None
    util = {name: ev.utilisation({j: tuple(d.paths[j]) for j in ids}, d.level)
            for name, d in dec.items()}
    return {
        "seed": seed, "levels": k, "oversubscription": oversub, "tors": case.tors,
        "hosts_per_tor": case.per_tor, "shared_hosts": shared_hosts(case),
        "optimum": u_opt, **{f"u_{n}": u for n, u in util.items()},
        "path_configs": len(configs), "simulations": ev.simulations,
        "jobs": [job_summary(j) for j in case.jobs],
        "crux_full_decisions": describe(case, {j: tuple(dec["crux-full"].paths[j])
                                               for j in ids}, dec["crux-full"].level),
        "taccl_decisions": describe(case, {j: tuple(dec["taccl*"].paths[j]) for j in ids},
                                    dec["taccl*"].level),
        "optimum_decisions": describe(case, opt_paths, opt_level),
    }
