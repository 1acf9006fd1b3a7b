"""The communication contention DAG (seed §4.3, Fig. 14).

One node per job; for every two jobs whose chosen paths share a link, an edge
from the higher-ranked to the lower-ranked job, weighted by the higher job's
intensity (what it loses when both end up on one level).
"""

from __future__ import annotations

import itertools

import numpy as np


def contention_edges(link_of: np.ndarray, job_of: np.ndarray, rank: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) job index arrays, one entry per contending pair.

    `link_of`/`job_of` list which job uses which link (one entry per flow hop;
    repeats are fine). `rank[j]` = 0 for the highest priority.
    """
    n = len(rank)
    if len(link_of) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    pairs = np.unique(link_of.astype(np.int64) * n + job_of)
    links, jobs = pairs // n, pairs % n
    bounds = np.flatnonzero(np.r_[True, links[1:] != links[:-1], True])
    his: list[np.ndarray] = []
    los: list[np.ndarray] = []
    tri: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for s, e in itertools.pairwise(bounds):
        m = int(e - s)
        if m < 2:
            continue
        if m not in tri:
            tri[m] = np.triu_indices(m, k=1)
        a, b = jobs[s:e][tri[m][0]], jobs[s:e][tri[m][1]]
        first = rank[a] < rank[b]
        his.append(np.where(first, a, b))
        los.append(np.where(first, b, a))
    if not his:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    code = np.unique(np.concatenate(his) * n + np.concatenate(los))
    return code // n, code % n
