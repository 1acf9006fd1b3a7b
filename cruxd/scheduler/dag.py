"""The communication contention DAG (seed §4.3, Fig. 14).

One node per job; for every two jobs whose chosen paths share a link, an edge
from the higher-ranked to the lower-ranked job, weighted by the higher job's
intensity (what it loses when both end up on one level).
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix, triu


def contention_edges(link_of: np.ndarray, job_of: np.ndarray, rank: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) job index arrays, one entry per contending pair, sorted.

    `link_of`/`job_of` list which job uses which link (one entry per flow hop;
    repeats are fine). `rank[j]` = 0 for the highest priority. Pairs come from the
    sparse product A A^T of the job x link incidence matrix A: entry (a, b) is
    non-zero exactly when jobs a and b share a link.
    """
    n = len(rank)
    empty = np.zeros(0, dtype=np.int64)
    if len(link_of) == 0 or n < 2:
        return empty, empty
    # order jobs by rank so that the upper triangle holds (higher, lower) pairs
    pos = np.asarray(rank, dtype=np.int64)
    incidence = csr_matrix((np.ones(len(job_of), dtype=np.float32), (pos[job_of], link_of)),
                           shape=(n, int(link_of.max()) + 1))
    incidence.data[:] = 1.0  # duplicates summed by the constructor: presence is what counts
    shared = triu(incidence @ incidence.T, k=1, format="coo")
    by_rank = np.argsort(pos)
    hi, lo = by_rank[shared.row], by_rank[shared.col]
    order = np.lexsort((lo, hi))
    return hi[order].astype(np.int64), lo[order].astype(np.int64)
