"""IncrementalPlanner: `planner.plan` for a stream of views, redoing only what changed.

Every call returns exactly what `plan(view, config)` returns for that view (the test
tests/test_incremental_planning.py checks it on random event sequences). What is kept
from the last call, and why reusing it is exact:

* Per job: its flows' candidate paths, standalone t_j, bytes and candidate links,
  keyed by the job's flows and the path-table entries of their host pairs; all
  dropped when the topology object or max_paths changes (`_Entry`).
* Path selection: `reselect` replays the last run, re-picking only flows whose
  candidate links' loads may have changed (the argument is in reselect.py). Loads
  are weighted by I_j, not I_j / I_max, so a new most intensive job does not touch
  the numbers of the others.
* Compression: per weakly connected component of the contention DAG, by its exact
  inputs (compression.ComponentMemo). Components are solved independently: each may
  use all the levels (the level budget does not couple them), draws its orders from
  its own generator seeded with config.seed, and its weights are rescaled by a power
  of two, exactly, so the cluster-wide largest intensity does not enter either.
* Per job: its FlowDecisions for the choices it made last time.

Redone from scratch on every call, and so exact for the same reason: the level-aware
rounds after compression (level_aware.py), which read every job's level. They leave
the flows' `choice` (the first selection, which `reselect` carries) untouched.

Recomputed in full on every call, because they couple all jobs and are cheap
(vectorised): intensities (a declared job's is capped at the lowest measured one),
priorities (k_j is relative to the reference job, ranks are global), link demand,
the contention DAG and its components, the jobs' decisions, the busiest links.

Not thread-safe: one plan at a time (the leader's planning worker runs its plans one
after another, and the simulator is single-threaded), so it takes no lock.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cruxd.model.jobs import FlowSpec, Job
from cruxd.model.paths import PathFinder, finder_for
from cruxd.model.plan import FlowDecision, Plan
from cruxd.model.topology import Topology
from cruxd.model.view import ClusterView, DiscoveredPath
from cruxd.scheduler.compression import ComponentMemo
from cruxd.scheduler.flow_paths import (
    Candidates,
    FlowPaths,
    job_flow_decisions,
    job_flows,
    link_destinations,
)
from cruxd.scheduler.level_aware import Choices
from cruxd.scheduler.planner import PlanConfig, finish, intensities, plan, selection_order
from cruxd.scheduler.reselect import JobInput, SelectionState, reselect
from cruxd.scheduler.selection import standalone_comm_time


@dataclass
class _Entry:
    """One job's cached step 1 (and its standalone t_j), valid while `flows` and the
    path-table entries `pairs` are equal to the job's."""

    flows_key: tuple[FlowSpec, ...]
    pairs: tuple[tuple[DiscoveredPath, ...], ...]
    flows: list[FlowPaths]
    nbytes: np.ndarray
    hops: np.ndarray
    links: np.ndarray
    traffic: float
    alone: float
    decided: tuple[tuple[int, ...], tuple[FlowDecision, ...]] | None = None


class IncrementalPlanner:
    """plan(view, config) with memory; see the module docstring."""

    def __init__(self) -> None:
        self._reset(None, 0)

    def _reset(self, topo: Topology | None, max_paths: int) -> None:
        self._topo, self._max_paths = topo, max_paths
        self._entries: dict[str, _Entry] = {}
        self._selection = SelectionState()
        self._memo = ComponentMemo()
        self.repicked = 0  # jobs that picked paths again in the last plan
        self.rebuilt = 0  # jobs whose candidates were computed again in the last plan

    def plan(self, view: ClusterView, config: PlanConfig | None = None) -> Plan:
        config = config or PlanConfig()
        ids = [j.id for j in view.jobs]
        if len(set(ids)) != len(ids):  # ids key everything kept: plan such a view afresh
            self._reset(None, 0)
            return plan(view, config)
        if view.topology is not self._topo or config.max_paths != self._max_paths:
            self._reset(view.topology, config.max_paths)
        try:
            return self._plan(view, config, ids)
        except Exception:
            self._reset(None, 0)  # half-updated state must not leak into the next plan
            raise

    def _plan(self, view: ClusterView, config: PlanConfig, ids: list[str]) -> Plan:
        config.dscp_values()  # a bad DSCP map fails before any work
        topo = view.topology
        finder = finder_for(topo, config.max_paths)
        memo: dict[tuple[str, str, int | None, int | None], Candidates] = {}
        scratch = np.zeros(len(topo.capacity))
        entries: dict[str, _Entry] = {}
        self.rebuilt = 0
        self._memo.hits = self._memo.misses = 0
        for ji, job in enumerate(view.jobs):
            e = self._entries.get(job.id)
            pairs = _pairs(view, job)
            if e is None or e.flows_key != job.flows or e.pairs != pairs:
                e = self._entry(view, finder, ji, pairs, memo, scratch)
                self.rebuilt += 1
            elif e.flows and e.flows[0].job != ji:
                for f in e.flows:
                    f.job = ji
            entries[job.id] = e
        self._entries = entries
        per_job = [entries[i] for i in ids]
        jobs = intensities(view, np.array([e.traffic for e in per_job], dtype=np.float64),
                           np.array([e.alone for e in per_job], dtype=np.float64),
                           np.array([len(e.flows) > 0 for e in per_job], dtype=bool))
        order = selection_order(ids, jobs, config.tie_tolerance)
        inputs = [JobInput(ids[ji], per_job[ji], per_job[ji].flows, per_job[ji].nbytes,
                           per_job[ji].hops, per_job[ji].links, float(jobs.intensity[ji]),
                           float(jobs.period[ji])) for ji in order]
        self._selection = reselect(self._selection, inputs, len(topo.capacity))
        self.repicked = self._selection.repicked
        link_dst = link_destinations(topo)

        def decide(choices: Choices) -> list[tuple[FlowDecision, ...]]:
            out = []
            for jid, e, mine in zip(ids, per_job, choices, strict=True):
                if e.decided is None or e.decided[0] != mine:
                    e.decided = (mine, job_flow_decisions(link_dst, jid, e.flows, mine))
                out.append(e.decided[1])
            return out

        out = finish(view, config, jobs, order, [e.flows for e in per_job],
                     [e.nbytes.tolist() for e in per_job], [e.hops.tolist() for e in per_job],
                     decide, self._memo, [self._selection.paths[i] for i in ids])
        self._memo.roll()
        return out

    @staticmethod
    def _entry(view: ClusterView, finder: PathFinder, ji: int,
               pairs: tuple[tuple[DiscoveredPath, ...], ...],
               memo: dict[tuple[str, str, int | None, int | None], Candidates],
               scratch: np.ndarray) -> _Entry:
        job: Job = view.jobs[ji]
        flows = job_flows(view, finder, ji, memo)
        nbytes = np.array([f.spec.bytes for f in flows], dtype=np.float64)
        links = (np.unique(np.concatenate([f.cands.ravel() for f in flows])) if flows
                 else np.zeros(0, dtype=np.int64))
        alone = standalone_comm_time([(f.cands, f.inv_cap, f.spec.bytes) for f in flows],
                                     view.topology.capacity, scratch)
        return _Entry(job.flows, pairs, flows, nbytes,
                      np.array([f.cands.shape[1] for f in flows], dtype=np.int64), links,
                      float(sum(f.spec.bytes for f in flows)), alone)


def _pairs(view: ClusterView, job: Job) -> tuple[tuple[DiscoveredPath, ...], ...]:
    """The path-table entries the job's candidates are made of."""
    table = view.path_table
    if not table:
        return ()
    return tuple(table.get((f.src, f.dst), ()) for f in job.flows if f.src != f.dst)
