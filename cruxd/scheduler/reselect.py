"""Path selection (step 3) again after an event, re-picking only the flows it can affect.

The from-scratch step places jobs one after another in `selection_order`, each flow
taking `pick(cands, inv_cap, load, x)` of the load placed so far. Given the last run
(its order, each job's chosen links and loads, snapshots of `load` every `stride`
positions), the new run is replayed so that it ends exactly where the from-scratch
run would:

* A job is *unchanged* when it keeps its candidates (the same cached `FlowPaths`)
  and its x_f (I_j and the period bit for bit: loads are I_j-weighted, not divided
  by a cluster-wide maximum, see planner.flow_loads). If the unchanged jobs are not
  in the same relative order as last time (tie groups with a tolerance can regroup),
  every job counts as changed: a full run.
* Up to the first position p where the orders differ or a job changed, everything is
  as last time; `load` at p is the snapshot before p plus the jobs in between.
* A link is *dirty* once its load may differ from what the same unchanged job saw
  last time: the old paths of departed and changed jobs (from the start), the paths
  of new and changed jobs, old and new paths of jobs whose choice moved. A clean
  link has received the same contributions in the same order, so the same float.
* From p on every job is replayed in order. A changed job, or one with a candidate
  link that is dirty, picks again on the true `load`; any other job's pick reads only
  clean links, equal to last time's, so its old choice is reused and only its loads
  are added (`np.add.at` adds repeated indices in order, as the loop would).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cruxd.scheduler.flow_paths import FlowPaths
from cruxd.scheduler.selection import flow_loads, pick


@dataclass
class SelectionState:
    """What the last run leaves for the next one (by job id)."""

    order: list[str] = field(default_factory=list)
    inputs: dict[str, tuple[object, float, float]] = field(default_factory=dict)
    paths: dict[str, np.ndarray] = field(default_factory=dict)  # chosen links, flow order
    loads: dict[str, np.ndarray] = field(default_factory=dict)  # x_f on each of them
    snapshots: dict[int, np.ndarray] = field(default_factory=dict)  # load before position
    repicked: int = 0  # jobs that picked again in the last run (for benchmarks)


@dataclass(frozen=True)
class JobInput:
    """One job as selection sees it: `key` identifies its candidates (the cache entry),
    `intensity`/`period` its x_f with `nbytes`; `links` all its candidate links."""

    id: str
    key: object
    flows: list[FlowPaths]
    nbytes: np.ndarray
    hops: np.ndarray  # links per flow
    links: np.ndarray
    intensity: float
    period: float


def reselect(state: SelectionState, jobs: Sequence[JobInput], n_links: int) -> SelectionState:
    """Sets every flow's `choice` as the from-scratch step would for `jobs` (in selection
    order) and returns the state for the next call; `state` is consumed."""
    n = len(jobs)
    same = [state.inputs.get(j.id) == (j.key, j.intensity, j.period) for j in jobs]
    kept = {j.id for j, s in zip(jobs, same, strict=True) if s}
    if [i for i in state.order if i in kept] != [j.id for j in jobs if j.id in kept]:
        same, kept = [False] * n, set()
    p = 0
    while p < min(n, len(state.order)) and same[p] and jobs[p].id == state.order[p]:
        p += 1
    stride = max(32, n // 32)  # at most ~32 snapshots of the load
    start = max((k for k in state.snapshots if k <= p), default=0)
    out = SelectionState(snapshots={k: v for k, v in state.snapshots.items() if k <= p})
    out.order = [j.id for j in jobs]
    load = state.snapshots[start].copy() if start else np.zeros(n_links)
    for j in jobs[start:p]:
        _carry(out, state, j)
    _add(load, [out.paths[j.id] for j in jobs[start:p]], [out.loads[j.id] for j in jobs[start:p]])
    for j in jobs[:start]:
        _carry(out, state, j)
    dirty = np.zeros(n_links, dtype=bool)
    for jid in state.order:
        if jid not in kept:
            dirty[state.paths[jid]] = True
    pending: list[int] = []
    for q in range(p, n):
        if q % stride == 0 and q > p:
            _flush(load, out, jobs, pending)
            out.snapshots[q] = load.copy()
        j = jobs[q]
        if same[q] and not dirty[j.links].any():
            _carry(out, state, j)
            pending.append(q)
            continue
        _flush(load, out, jobs, pending)
        old = state.paths.get(j.id) if same[q] else None
        path, x = _pick_job(j, load)
        out.paths[j.id], out.loads[j.id] = path, x
        out.inputs[j.id] = (j.key, j.intensity, j.period)
        out.repicked += 1
        if old is None or not np.array_equal(old, path):
            dirty[path] = True
            if old is not None:
                dirty[old] = True
    _flush(load, out, jobs, pending)
    return out


def _carry(out: SelectionState, state: SelectionState, j: JobInput) -> None:
    """An unchanged job keeps its choices (still set on its flows) and loads."""
    out.paths[j.id], out.loads[j.id] = state.paths[j.id], state.loads[j.id]
    out.inputs[j.id] = state.inputs[j.id]


def _flush(load: np.ndarray, out: SelectionState, jobs: Sequence[JobInput],
           pending: list[int]) -> None:
    _add(load, [out.paths[jobs[q].id] for q in pending],
         [out.loads[jobs[q].id] for q in pending])
    pending.clear()


def _add(load: np.ndarray, paths: list[np.ndarray], loads: list[np.ndarray]) -> None:
    if paths:
        np.add.at(load, np.concatenate(paths), np.concatenate(loads))


def _pick_job(j: JobInput, load: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The from-scratch step for one job; returns its chosen links and their loads."""
    x = flow_loads(j.intensity, j.period, j.nbytes).tolist()
    for f, xf in zip(j.flows, x, strict=True):
        f.choice = pick(f.cands, f.inv_cap, load, xf)
        load[f.cands[f.choice]] += xf
    if not j.flows:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    path = np.concatenate([f.cands[f.choice] for f in j.flows])
    return path, np.repeat(np.array(x), j.hops)
