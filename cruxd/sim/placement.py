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
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
Placement = list[tuple[int, int]]  # (host index, GPUs)
PLACEMENTS = ("packed", "none", "hived")


def place(policy: str, free: IntArray, cap: IntArray, group: IntArray, pod: IntArray,
          need: int, split: bool) -> Placement | None:
    """Where a job of `need` GPUs goes under `policy`, given `free` GPUs per host (of
    `cap`), each host's ToR group and pod; None: not now."""
    if need <= 0 or need > int(free.sum()):
        return None
    if policy == "packed":
        return packed(free, cap, group, need, split)
    if policy == "none":
        return first_fit(free, need)
    if policy == "hived":
        return hived(free, cap, group, pod, need)
    raise ValueError(f"unknown placement {policy!r}; placements: {', '.join(PLACEMENTS)}")


def first_fit(free: IntArray, need: int) -> Placement | None:
    return _take(free, np.flatnonzero(free > 0).tolist(), need)


def _take(free: IntArray, order: list[int], need: int) -> Placement | None:
    """`need` GPUs from the hosts in `order`, each giving what it has free, sorted by
    host; None if they do not hold that many."""
    taken: Placement = []
    for h in order:
        g = min(int(free[h]), need)
        if g:
            taken.append((h, g))
            need -= g
        if need == 0:
            return sorted(taken)
    return None


def hived(free: IntArray, cap: IntArray, group: IntArray, pod: IntArray,
          need: int) -> Placement | None:
    hosts = np.arange(len(free))
    levels = [hosts, group, pod, np.zeros(len(free), dtype=np.int64)]  # host .. cluster
    for cell_of in levels:
        size = np.bincount(cell_of, weights=cap, minlength=int(cell_of.max()) + 1)
        if size.max() < need:
            continue  # no cell of this level is big enough: the next level up
        room = np.bincount(cell_of, weights=free, minlength=len(size))
        fits = np.flatnonzero((size >= need) & (room >= need))
        if not len(fits):
            continue
        cell = int(fits[np.argmin(room[fits])])  # the fullest cell that still fits
        inside = np.flatnonzero(cell_of == cell)
        return _pack(free, inside, need)
    return None


def _pack(free: IntArray, hosts: IntArray, need: int) -> Placement | None:
    """`need` GPUs from `hosts`: one host if one fits (best fit), else the hosts with the
    most free GPUs first (whole free hosts before partly free ones)."""
    room = free[hosts]
    one = np.flatnonzero(room >= need)
    if len(one):
        return [(int(hosts[one[np.argmin(room[one])]]), need)]
    return _take(free, hosts[np.argsort(-room, kind="stable")].tolist(), need)


def _best_fit(free: IntArray, need: int, allowed: npt.NDArray[np.bool_]) -> int | None:
    ok = np.flatnonzero(allowed & (free >= need))
    return int(ok[np.argmin(free[ok])]) if len(ok) else None  # argmin: first of the ties


def packed(free: IntArray, cap: IntArray, group: IntArray, need: int, split: bool
           ) -> Placement | None:
    """The trace's packing scheduler (see the module docstring of cruxd.sim.trace)."""
    anywhere = np.ones(len(free), dtype=bool)
    if need <= int(cap.max()):
        if split and need >= 2 and len(free) >= 2:
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
    return _take(free, order, need)
