"""Link bandwidth among the collectives in flight: strict priority between levels,
max-min fair share (progressive filling) within a level.

An entity is one job's collective of one iteration. Its flows advance in lockstep
(a ring all-reduce is pipelined: it moves at the pace of its slowest hop), so the
entity has one per-flow rate rho (bytes/s) and loads link e with rho * w_e, where
w_e = M_{j,e} / mean flow bytes is its effective number of flows on e. Within a
level, progressive filling raises every unfrozen entity's rho together and freezes
the entities of each link that fills: the classic flow-level max-min fairness,
with a collective's flows tied together. Higher levels are served first and lower
levels share what is left (strict priority, preemptive).

`allocate` runs the same steps in C (shim/sim/crux_rates.c, built into
transport/native/libcrux_rates.so), which gives the same doubles as the numpy reference
here: the simulator calls it ~10^5 times a run on small problems, where numpy's per-call
overhead was most of the run. Without the library the reference runs (`solver()` says
which, and why).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from transport import native

_EPS = 1e-12


def allocate(weights: np.ndarray, capacity: np.ndarray, level: np.ndarray) -> np.ndarray:
    """Per-flow rate of every entity.

    weights: (entities, links) effective flow counts (>= 0), over the links in play;
    capacity: (links,) bytes/s; level: (entities,) larger = higher priority.
    An entity with no link gets rate inf (nothing limits it).
    """
    fn = _native()[0]
    if fn is None:
        return allocate_numpy(weights, capacity, level)
    n, links = weights.shape
    w = np.ascontiguousarray(weights, dtype=np.float64)
    cap = np.ascontiguousarray(capacity, dtype=np.float64)
    lv = np.ascontiguousarray(level, dtype=np.float64)
    if cap.shape != (links,) or lv.shape != (n,):  # C would read past them
        raise ValueError(f"allocate: {n} x {links} weights, but capacity {cap.shape} and "
                         f"level {lv.shape}")
    rate = np.empty(n)
    if fn(w.ctypes.data, n, links, cap.ctypes.data, lv.ctypes.data, rate.ctypes.data) != 0:
        raise MemoryError("crux_rates_allocate: out of memory")
    return rate


def allocate_numpy(weights: np.ndarray, capacity: np.ndarray, level: np.ndarray) -> np.ndarray:
    """`allocate` in numpy: the reference the C solver is tested against, bit for bit."""
    n = weights.shape[0]
    rate = np.zeros(n)
    if n == 0:
        return rate
    residual = capacity.astype(np.float64).copy()
    uses = weights > 0
    rate[~uses.any(axis=1)] = np.inf
    # one level is the common case (ECMP and the baselines): np.unique costs more than
    # the filling there
    top = level.max()
    for lv in [top] if level.min() == top else np.unique(level)[::-1]:
        active = (level == lv) & np.isfinite(rate) & uses.any(axis=1)
        while active.any():
            # added in entity order, as the C solver does: ndarray.sum switches to
            # pairwise summation when the summed axis is contiguous (one link), and its
            # last bits then depend on numpy's blocking
            load = np.add.accumulate(weights[active], axis=0)[-1]
            busy = load > _EPS
            share = np.full(len(residual), np.inf)
            share[busy] = np.maximum(residual[busy], 0.0) / load[busy]
            inc = share.min()
            if not np.isfinite(inc):  # weights too small to fill any link: unlimited
                rate[active] = np.inf
                break
            rate[active] += inc
            residual[busy] -= inc * load[busy]
            full = busy & (share <= inc * (1 + 1e-9) + _EPS)
            frozen = active & uses[:, full].any(axis=1)
            active &= ~frozen
    return rate


def solver() -> str:
    """Which solver `allocate` uses here, and why not C if not."""
    fn, why = _native()
    return "C (libcrux_rates.so)" if fn is not None else f"numpy ({why})"


@cache
def _native() -> tuple[Callable[..., Any] | None, str]:
    try:
        lib = ctypes.CDLL(str(native.library(native.RATES)))
    except OSError as exc:  # NativeLibraryMissing included
        return None, str(exc)
    fn = lib.crux_rates_allocate
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_void_p]
    return fn, ""
