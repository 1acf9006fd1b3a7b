"""Max K-cut of one topological order (cruxd.scheduler.compression tries several).

Cutting an order a_1..a_n into K consecutive blocks (the first block the highest level)
cuts C(j, i) = weight of edges from a_1..a_j into a_{j+1}..a_i at each boundary; the
DP over blocks reads C from a prefix matrix Q, and its argmax is monotone, so each level
is a vectorised divide and conquer (compression.py's module docstring has the argument).
"""

from __future__ import annotations

import numpy as np


def prefix_sums(prefix: np.ndarray) -> None:
    """In place: Q[j, i] = weight of edges from the first j+1 nodes to the first i+1."""
    for i in range(1, prefix.shape[0]):  # adding whole rows is several times faster
        prefix[i] += prefix[i - 1]       # than cumsum(axis=0)
    np.cumsum(prefix, axis=1, out=prefix)


def prefix_sums_transposed(spare: np.ndarray, out: np.ndarray, hi: np.ndarray,
                            lo: np.ndarray, w: np.ndarray, block: int = 128) -> None:
    """Q where the DP reads it (j <= i), for large matrices: cumsum along rows is ~5x
    slower than adding whole rows, so both sums add rows, with a blocked transpose in
    between, and each only over the triangle that can be non-zero or is read (edges
    go forward in the order). The sums run in another order than `prefix_sums`', so
    float32 roundings differ; below the diagonal `out` is left undefined."""
    n = out.shape[0]
    spare.fill(0.0)
    spare[lo, hi] = w  # transposed: row y holds the edges into y, at column x < y
    for i in range(2, n):
        spare[i, :i] += spare[i - 1, :i]  # row b: weight from each x into the first b+1
    for i0 in range(0, n, block):
        out[:i0 + block, i0:i0 + block] = spare[i0:i0 + block, :i0 + block].T
    for i in range(1, n):
        out[i, i:] += out[i - 1, i:]


def cut_of_order(prefix: np.ndarray, levels: int) -> tuple[float, np.ndarray]:
    """Max K-cut of one order. `prefix` holds Q[j, i] = weight of edges from the first
    j+1 nodes to the first i+1 nodes of that order (`prefix_sums`). Returns (value,
    block of each position, 0 = first block = highest level)."""
    n = prefix.shape[0]
    k_max = min(levels, n)
    f = np.full(n + 1, -np.inf)
    f[1:] = 0.0  # one block: nothing cut
    opts = []
    for k in range(2, k_max + 1):
        f, opt = dp_level(f, prefix, k)
        opts.append(opt)
    blocks = np.zeros(n, dtype=np.int64)
    i = n
    for k in range(k_max, 1, -1):
        j = int(opts[k - 2][i])
        blocks[j:i] = k - 1
        i = j
    return float(f[n] if k_max > 1 else 0.0), blocks


def dp_level(prev: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """f(i) = max_{k-1 <= j < i} prev(j) + C(j, i) for i >= k, by vectorised divide and
    conquer over the monotone argmax. C(j, i) = Q[j-1, i-1] - Q[j-1, j-1] (j >= 1)."""
    n = len(prev) - 1
    cur = np.full(n + 1, -np.inf)
    opt = np.zeros(n + 1, dtype=np.int64)
    # segments: i in [ilo, ihi], argmax j in [jlo, jhi]
    ilo, ihi = np.array([k]), np.array([n])
    jlo, jhi = np.array([k - 1]), np.array([n - 1])
    while len(ilo):
        mid = (ilo + ihi) // 2
        top = np.minimum(jhi, mid - 1)
        counts = top - jlo + 1
        seg = np.repeat(np.arange(len(mid)), counts)
        starts = np.cumsum(counts) - counts
        j = jlo[seg] + (np.arange(counts.sum()) - starts[seg])
        val = prev[j] + q[j - 1, mid[seg] - 1] - q[j - 1, j - 1]
        best = np.maximum.reduceat(val, starts)
        # first j reaching the segment's best keeps the argmax monotone under ties
        hits = np.flatnonzero(val >= best[seg])
        hit_seg = seg[hits]
        bj = j[hits[np.r_[True, hit_seg[1:] != hit_seg[:-1]]]]
        cur[mid], opt[mid] = best, bj
        left = mid - 1 >= ilo
        right = mid + 1 <= ihi
        ilo, ihi, jlo, jhi = (np.concatenate([ilo[left], mid[right] + 1]),
                              np.concatenate([mid[left] - 1, ihi[right]]),
                              np.concatenate([jlo[left], bj[right]]),
                              np.concatenate([bj[left], jhi[right]]))
    return cur, opt
