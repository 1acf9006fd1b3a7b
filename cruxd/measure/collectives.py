"""t_j and the iteration period from NCCL's own view of a job (pure numpy, no I/O).

The profiler plugin (shim/crux_nccl_profiler.c) records, per communicator of each process,
bursts of network activity: [start, end] and the exact busy time inside. A job on a host has
several processes (one per GPU) and each may have several communicators, all busy at about
the same time. Their union is the job's time on the network:

  - the window's bursts are laid on a grid of RESOLUTION_S; a burst fills the part of each
    cell it covers, at its density busy / (end - start) (1 for a burst with no gap inside),
    and overlapping bursts take the highest fill: their union, not their sum;
  - the period is `estimate_period` of that occupancy (the same estimator as the NIC
    counters', on a series with no other job in it);
  - t_j = the occupied time over the newest whole number of periods in the window, divided by
    that number (a window cut anywhere in an iteration would count part of one: up to a
    period's worth of error over the window); bytes per iteration likewise.

Unlike the NIC counters, nothing another job sends can enter: two jobs that share a NIC each
get their own figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cruxd.measure.comm import CommEstimate
from cruxd.measure.period import estimate_period

RESOLUTION_S = 0.0005  # 2 kHz: a burst's edges cost under half a cell each, on average none
MAX_CELLS = 1 << 18  # a window of 131 s at 2 kHz; a longer one is cut to its newest part


@dataclass(frozen=True)
class Bursts:
    """Bursts of one communicator (CLOCK_MONOTONIC ns), complete from `since_ns` on."""
    start_ns: npt.NDArray[np.uint64]
    end_ns: npt.NDArray[np.uint64]
    busy_ns: npt.NDArray[np.uint64]
    sent_bytes: npt.NDArray[np.uint64]
    since_ns: int


def occupancy(bursts: Sequence[Bursts], t0_ns: int, t1_ns: int,
              resolution_s: float = RESOLUTION_S) -> npt.NDArray[np.float64]:
    """The share of each cell of [t0, t1) that some burst occupies (see the module doc)."""
    res = int(resolution_s * 1e9)
    n = max(0, (t1_ns - t0_ns) // res)
    occ = np.zeros(n)
    if n == 0:
        return occ
    s, e, busy = (np.concatenate([getattr(b, k) for b in bursts]).astype(np.int64)
                  for k in ("start_ns", "end_ns", "busy_ns"))
    keep = (e > t0_ns) & (s < t1_ns) & (e > s)
    density = busy[keep] / (e[keep] - s[keep])
    a = np.maximum(s[keep] - t0_ns, 0)
    z = np.minimum(e[keep] - t0_ns, n * res)
    i, j = a // res, (z - 1) // res
    lens = j - i + 1
    ends = np.cumsum(lens)
    firsts = ends - lens
    cells = np.repeat(i, lens) + np.arange(int(ends[-1]) if ends.size else 0) - np.repeat(
        firsts, lens)
    fill = np.repeat(density, lens)
    fill[firsts] *= (np.minimum(z, (i + 1) * res) - a) / res  # the burst's share of its cells
    wide = lens > 1
    fill[ends[wide] - 1] *= (z[wide] - j[wide] * res) / res
    np.maximum.at(occ, cells, fill)
    return occ


def estimate(bursts: Sequence[Bursts], since_ns: int, now_ns: int,
             resolution_s: float = RESOLUTION_S) -> CommEstimate | None:
    """The job's figures over [since, now], cut to where every communicator's bursts are
    complete; None without a period (too short a window, no bursts, no repetition)."""
    live = [b for b in bursts if b.start_ns.size]
    if not live:
        return None
    t0 = max(since_ns, *(b.since_ns for b in live))
    t0 = max(t0, now_ns - int(MAX_CELLS * resolution_s * 1e9))
    if now_ns - t0 < 4 * resolution_s * 1e9:
        return None
    occ = occupancy(live, t0, now_ns, resolution_s)
    if not occ.any():
        return None
    rate_hz = 1.0 / resolution_s
    p = estimate_period(occ, rate_hz)
    if p is None:
        return None
    window_s = occ.size * resolution_s
    whole = math.floor(window_s / p.period_s)
    if not math.isfinite(p.period_s) or whole < 1:
        return None
    cells = min(occ.size, round(whole * p.period_s / resolution_s))
    busy_s = float(occ[-cells:].sum()) * resolution_s
    t_k = now_ns - int(cells * resolution_s * 1e9)
    sent = sum(int(b.sent_bytes[(b.start_ns >= t_k) & (b.start_ns < now_ns)].sum())
               for b in live)
    return CommEstimate(window_s, p.period_s, window_s / p.period_s, busy_s / whole,
                        sent / whole, p.confidence)
