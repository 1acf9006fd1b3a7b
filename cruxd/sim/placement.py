"""Where a trace job's GPUs go: the job scheduler's placement, one policy per name
(pure; `cruxd.sim.trace` calls it as jobs arrive and leave).

Every policy sees the free GPUs per host and the fabric's grouping of hosts (ToR groups:
hosts linked to the same ToRs; pods: ToR groups under the same aggregation switches) and
returns [(host index, GPUs)] or None when the job must wait. None of them draws random
numbers, so a trace's seed fixes its jobs whatever the placement.

* `packed`: the trace's packing scheduler (the default, as before): one host (best fit)
  or two halves under one ToR, larger jobs on whole free hosts of the tightest ToR group.
* `none`: a scheduler that ignores topology: first fit over free GPUs in host order. As
  jobs come and go, free GPUs scatter, and jobs with them (seed §2.2's fragmentation).
* `hived`: HiveD's (OSDI'20) affinity cells, as far as placement goes: a hierarchy of
  cells (host, ToR group, pod, cluster); a job takes the smallest cell level that can
  hold it, in the cell of that level that has the fewest free GPUs but enough (buddy
  allocation keeps whole cells whole for large jobs), packing hosts inside it by best
  fit; only if no cell of that level has room does it go up a level. Not modelled:
  virtual clusters and their quotas, priorities and preemption, cell binding around
  failed hardware.
* `muri`: Muri (SIGCOMM'22) as the seed describes it, "schedules by reducing idle
  links". Muri interleaves jobs whose demands on a resource differ so that none idles
  while another saturates; our reading for a network is: spread communication over the
  fabric's ToR uplinks. Cells as in `hived`, but a communication-heavy job (sending at
  least the median rate of the running multi-host jobs) takes the cell whose ToR
  uplinks carry the least load, and a light one the cell whose uplinks carry the most
  (leaving the quiet links to the heavy jobs); equal loads go to the fullest cell.
  Inside a cell that holds the job only across hosts (a pod, on the trace's Clos,
  whose ToR groups are 16 GPUs), hosts are taken in the same order of their ToR
  group's uplink load. Not modelled: Muri's time-sharing of GPUs between interleaved
  jobs, and its storage and CPU resources.
* `crux-hints`: crux as the scheduler's advisor (`cruxd.sim.hint_placement`).

A job whose GPUs form tensor-parallel groups of `unit` GPUs gets them in whole groups
per host under every policy (Megatron keeps a TP group on one host's NVLink).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Placement = list[tuple[int, int]]  # (host index, GPUs)
PLACEMENTS = ("packed", "none", "hived", "muri", "crux-hints")


@dataclass(frozen=True)
class Extra:
    """What the load-aware policies see beyond free GPUs (all optional).

    uplink_load: per ToR group, the running jobs' demand on its uplinks over their
        capacity (muri);
    heavy: the arriving job sends at least the running multi-host jobs' median rate;
    advise: crux-hints' placement for this job (None: fall back to hived).
    """

    uplink_load: FloatArray | None = None
    heavy: bool = True
    advise: Callable[[IntArray, int, int], Placement | None] | None = field(
        default=None, compare=False)


def place(policy: str, free: IntArray, cap: IntArray, group: IntArray, pod: IntArray,
          need: int, split: bool, *, unit: int = 1, extra: Extra | None = None
          ) -> Placement | None:
    """Where a job of `need` GPUs (in groups of `unit` per host) goes under `policy`,
    given `free` GPUs per host (of `cap`), each host's ToR group and pod; None: not now."""
    if need <= 0 or need > int((free // unit * unit).sum()) or need % unit:
        return None
    extra = extra or Extra()
    if policy == "packed":
        return packed(free, cap, group, need, split, unit)
    if policy == "none":
        return first_fit(free, need, unit)
    if policy == "hived":
        return hived(free, cap, group, pod, need, unit)
    if policy == "muri":
        return muri(free, cap, group, pod, need, unit, extra)
    if policy == "crux-hints":
        got = extra.advise(free, need, unit) if extra.advise is not None else None
        return got if got is not None else hived(free, cap, group, pod, need, unit)
    raise ValueError(f"unknown placement {policy!r}; placements: {', '.join(PLACEMENTS)}")


def first_fit(free: IntArray, need: int, unit: int = 1) -> Placement | None:
    return _take(free, np.flatnonzero(free >= unit).tolist(), need, unit)


def _take(free: IntArray, order: list[int], need: int, unit: int = 1) -> Placement | None:
    """`need` GPUs from the hosts in `order`, each giving what it has free (in whole
    groups of `unit`), sorted by host; None if they do not hold that many."""
    taken: Placement = []
    for h in order:
        g = min(int(free[h]) // unit * unit, need)
        if g:
            taken.append((h, g))
            need -= g
        if need == 0:
            return sorted(taken)
    return None


def hived(free: IntArray, cap: IntArray, group: IntArray, pod: IntArray,
          need: int, unit: int = 1) -> Placement | None:
    return _cells(free, cap, group, pod, need, unit, None)


def muri(free: IntArray, cap: IntArray, group: IntArray, pod: IntArray, need: int,
         unit: int, extra: Extra) -> Placement | None:
    if need <= int(cap.max()) or extra.uplink_load is None:
        return hived(free, cap, group, pod, need, unit)  # one host: no links to spread over
    load = extra.uplink_load[group]  # per host, its ToR group's uplink load
    return _cells(free, cap, group, pod, need, unit, load if extra.heavy else -load)


def _cells(free: IntArray, cap: IntArray, group: IntArray, pod: IntArray, need: int,
           unit: int, load: FloatArray | None) -> Placement | None:
    """HiveD's walk up the cell levels (host, ToR group, pod, cluster): the first level
    with a cell that holds the job; in it the cell of least `load` (mean over its hosts;
    None: no load), then the fewest free GPUs (the fullest cell that still fits)."""
    usable = free // unit * unit
    hosts = np.arange(len(free))
    levels = [hosts, group, pod, np.zeros(len(free), dtype=np.int64)]  # host .. cluster
    for cell_of in levels:
        size = np.bincount(cell_of, weights=cap, minlength=int(cell_of.max()) + 1)
        if size.max() < need:
            continue  # no cell of this level is big enough: the next level up
        room = np.bincount(cell_of, weights=usable, minlength=len(size))
        fits = np.flatnonzero((size >= need) & (room >= need))
        if not len(fits):
            continue
        key = room[fits]
        if load is not None:
            mean = (np.bincount(cell_of, weights=load, minlength=len(size))
                    / np.maximum(np.bincount(cell_of, minlength=len(size)), 1))
            key = np.lexsort((room[fits], np.round(mean[fits], 6)))
            cell = int(fits[key[0]])
        else:
            cell = int(fits[np.argmin(key)])
        hosts = np.flatnonzero(cell_of == cell)
        return _pack(free, hosts, need, unit, None if load is None else load[hosts])
    return None


def _pack(free: IntArray, hosts: IntArray, need: int, unit: int = 1,
          load: FloatArray | None = None) -> Placement | None:
    """`need` GPUs from `hosts`: one host if one fits (best fit), else the hosts with the
    most free GPUs first (whole free hosts before partly free ones); with a `load` per
    host (muri), least load first and, among equal loads, most free first."""
    room = free[hosts] // unit * unit
    one = np.flatnonzero(room >= need)
    if len(one):
        return [(int(hosts[one[np.argmin(room[one])]]), need)]
    if load is None:
        order = np.argsort(-room, kind="stable")
    else:  # lexsort: the last key is the first; ties keep host order (stable)
        order = np.lexsort((-room, np.round(load, 6)))
    return _take(free, hosts[order].tolist(), need, unit)


def _best_fit(free: IntArray, need: int, allowed: npt.NDArray[np.bool_]) -> int | None:
    ok = np.flatnonzero(allowed & (free >= need))
    return int(ok[np.argmin(free[ok])]) if len(ok) else None  # argmin: first of the ties


def packed(free: IntArray, cap: IntArray, group: IntArray, need: int, split: bool,
           unit: int = 1) -> Placement | None:
    """The trace's packing scheduler (see the module docstring of cruxd.sim.trace)."""
    anywhere = np.ones(len(free), dtype=bool)
    if need <= int(cap.max()):
        if split and need >= 2 * unit and need // 2 % unit == 0 and len(free) >= 2:
            high, low = need - need // 2, need // 2
            pairs = np.bincount(group[free >= low], minlength=int(group.max()) + 1) >= 2
            h1 = _best_fit(free, high, pairs[group])  # a ToR with room for both halves
            h1 = h1 if h1 is not None else _best_fit(free, high, anywhere)
            if h1 is not None:
                others = anywhere.copy()
                others[h1] = False
                h2 = _best_fit(free, low, others & (group == group[h1]))
                h2 = h2 if h2 is not None else _best_fit(free, low, others)
                if h2 is not None:
                    return sorted([(h1, high), (h2, low)])
        h = _best_fit(free, need, anywhere)
        if h is not None:
            return [(h, need)]
    whole = (free == cap) & (cap > 0)
    per_group = np.bincount(group[whole], weights=cap[whole], minlength=int(group.max()) + 1)
    fits = np.flatnonzero(per_group >= need)
    if len(fits):
        g = int(fits[np.argmin(per_group[fits])])
        order = np.flatnonzero(whole & (group == g)).tolist()
    else:
        rank = np.argsort(-per_group, kind="stable")  # groups with most free whole hosts
        pos = np.empty_like(rank)
        pos[rank] = np.arange(len(rank))
        wh = np.flatnonzero(whole)
        part = np.flatnonzero(~whole & (free > 0))
        order = (wh[np.argsort(pos[group[wh]], kind="stable")].tolist()
                 + part[np.argsort(-free[part], kind="stable")].tolist())
    return _take(free, order, need, unit)
