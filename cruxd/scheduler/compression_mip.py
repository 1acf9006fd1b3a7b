"""Priority compression by mixed-integer programming: the exact optimum of the
Max-K-Cut that compression.py approximates, for small DAGs (tests and benchmarks)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from cruxd.scheduler.compression import Edges, _index


def compress_exact(edges: Edges, levels: int) -> dict[str, int]:
    """The optimum by mixed-integer programming (HiGHS), for small DAGs.

    Variables: integer level l_v in [0, K-1] and binary y_e per edge; l_hi >= l_lo,
    y_e <= l_hi - l_lo (integral levels make a cut edge differ by >= 1);
    maximise sum w_e y_e.
    """
    if levels < 1:
        raise ValueError("levels must be >= 1")
    names, hi, lo, w = _index(edges)
    n, m = len(names), len(hi)
    if m == 0:
        return {str(x): levels - 1 for x in names}
    rows = np.arange(m)
    # l_hi - l_lo >= 0  and  l_hi - l_lo - y >= 0
    a1 = np.zeros((m, n + m))
    a1[rows, hi] += 1
    a1[rows, lo] -= 1
    a2 = a1.copy()
    a2[rows, n + rows] = -1
    res = milp(
        c=np.concatenate([np.zeros(n), -w]),
        integrality=np.ones(n + m),
        bounds=Bounds(np.zeros(n + m), np.concatenate([np.full(n, levels - 1), np.ones(m)])),
        constraints=[LinearConstraint(a1, 0, np.inf), LinearConstraint(a2, 0, np.inf)],
    )
    if res.x is None:  # pragma: no cover - the all-top assignment is always feasible
        raise RuntimeError(f"HiGHS found no solution: {res.message}")
    lv = np.rint(res.x[:n]).astype(int)
    # shift so the highest used level is the top one, as compress() reports
    lv += levels - 1 - lv.max()
    return {str(names[i]): int(lv[i]) for i in range(n)}


def cut_weight(edges: Edges, assignment: Mapping[str, int]) -> float:
    """Total weight of edges whose ends sit on different levels."""
    return float(sum(wt for (h, lo), wt in edges.items()
                     if assignment[str(h)] != assignment[str(lo)]))
