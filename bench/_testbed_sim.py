"""bench/testbed.py's simulator side: the simulator on the scenario the rig runs, its ECMP
hash draws, the fabric without a failed cable, and replays of the paths and levels a run
took (every figure the bench sets beside the rig's)."""

from __future__ import annotations

import dataclasses
from typing import Any

from cruxd.model.topology import Topology
from cruxd.scenario import Scenario
from cruxd.scenario.simulation import simulation_of
from cruxd.sim.policies import Policy, make_policy
from cruxd.sim.policies.crux import Crux
from cruxd.sim.policies.ecmp import Ecmp
from cruxd.sim.policies.pinned import Pinned
from cruxd.sim.run import SimResult, simulate
from tests.rig.testbed_churn import without_cable


def _run(sc: Scenario, policy: Policy, duration_s: float, seed: int | None = None,
         topo: Topology | None = None,
         churn: dict[str, tuple[float, float | None]] | None = None,
         levels: int | None = None) -> SimResult:
    """The simulator on the scenario (on `levels` instead of its own); `churn` replaces
    jobs' (arrival_s, iterations) with what happened on the rig."""
    jobs, settings = simulation_of(sc, policies=["ecmp"], horizon_s=duration_s, seed=seed,
                                   levels=levels)
    if churn:
        jobs = [dataclasses.replace(j, arrival_s=churn[j.job.id][0],
                                    iterations=churn[j.job.id][1])
                if j.job.id in churn else j for j in jobs]
    return simulate(jobs, topo or sc.view.topology, policy, settings.config)


def _utilizations(res: SimResult) -> dict[str, Any]:
    """Cluster and per-job utilisation of one simulator run."""
    return {"utilization": res.gpu_utilization,
            "jobs": {r.job: r.busy_gpu_s / (r.gpus * r.active_s) if r.active_s else 0.0
                     for r in res.jobs}}


def simulated(sc: Scenario, duration_s: float,
              churn: dict[str, tuple[float, float | None]] | None = None,
              ) -> dict[str, dict[str, Any]]:
    """The simulator on the same file: per policy, cluster and per-job utilisation;
    paths-only is crux-full on one level (its paths do not depend on the levels),
    levels-only crux's compressed levels on ECMP's paths."""
    out = {"paths-only": _utilizations(_run(sc, make_policy("crux-full"), duration_s,
                                            churn=churn, levels=1)),
           "levels-only": _utilizations(_run(sc, Crux("levels-only", paths=False),
                                             duration_s, churn=churn))}
    for name in ("ecmp", "crux-full"):
        res = _run(sc, make_policy(name), duration_s, churn=churn)
        out[name] = _utilizations(res)
    # alone, a job computes compute_s of every standalone period (the same in every run)
    spec = {j.id: j for j in sc.view.jobs}
    alone = {r.job: spec[r.job].compute_s / r.standalone_period_s for r in res.jobs}
    gpus = {r.job: r.gpus for r in res.jobs}
    out["standalone"] = {"utilization": sum(alone[j] * gpus[j] for j in alone)
                         / sum(gpus.values()), "jobs": alone}
    return out


def hash_draws(sc: Scenario, duration_s: float, n: int = 20,
               churn: dict[str, tuple[float, float | None]] | None = None,
               ) -> dict[str, float]:
    """The simulator's ECMP under `n` hash seeds: which links collide is a draw, in the
    simulator as on the rig (the kernel keys its hash at random per namespace)."""
    us = [_run(sc, Ecmp(), duration_s, seed=seed, churn=churn).gpu_utilization
          for seed in range(n)]
    return {"n": n, "mean": sum(us) / n, "min": min(us), "max": max(us)}


def simulated_degraded(sc: Scenario, duration_s: float, leaf: str, spine: str,
                       via: dict[str, dict[tuple[str, str], str]] | None = None,
                       levels: dict[str, int] | None = None) -> float:
    """crux-full's utilisation on the fabric without the leaf-spine cable: what the
    cluster can recover to after the failure; with `via` and `levels`, that of the
    plan that ran after it instead (the network model's check on the degraded run)."""
    topo = without_cable(sc.view.topology, leaf, spine)
    policy = Pinned(via, levels=levels) if via is not None else make_policy("crux-full")
    return _run(sc, policy, duration_s, topo=topo).gpu_utilization


def simulated_on(sc: Scenario, duration_s: float,
                 via: dict[str, dict[tuple[str, str], str]],
                 churn: dict[str, tuple[float, float | None]] | None = None,
                 levels: dict[str, int] | None = None) -> dict[str, Any]:
    """The simulator with each hop on the path it was seen on, every job on one level or
    on the `levels` the live plan gave: the network model compared on the same
    collisions and priorities, not another hash draw or another plan."""
    return _utilizations(_run(sc, Pinned(via, levels=levels), duration_s, churn=churn))


def replayed_levels(mode: str, jobs: dict[str, dict[str, Any]]) -> dict[str, int] | None:
    """The levels the simulator replays a crux-mode run on, beside the spines that carried
    each hop: the plan's, except in paths-only, whose switches had one class for all
    (None: every job on one level)."""
    if mode == "paths-only":
        return None
    return {j: int(s.get("level", 0)) for j, s in jobs.items()}
