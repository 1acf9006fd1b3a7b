"""t_j from a job's traffic-rate series: iterations by period, bursts by threshold.

Over a window of the rate series (bytes/s per sampling interval, NaN where skipped):
  - the iteration period comes from `estimate_period` (FFT + autocorrelation);
  - iterations = window / period;
  - the burst level is the midpoint between the quiet level (10th percentile) and the burst
    level (95th); a sample counts as "on the wire" above it. A sample that straddles a burst
    edge carries the covered fraction of the burst rate, so the midpoint counts it on
    average half the time: edges cost no bias, only noise of about one sample per burst;
  - t_j (comm_s) = on-wire time / iterations, in seconds per iteration;
  - bytes per iteration = window bytes / iterations.
Skipped samples are left out and the on-wire time is scaled up by the share that was valid.
No period, or a series with no bursts, gives None: no guess.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cruxd.measure.period import estimate_period


@dataclass(frozen=True)
class CommEstimate:
    window_s: float
    period_s: float
    iterations: float
    comm_s: float  # t_j: seconds on the wire per iteration
    bytes_per_iter: float
    confidence: float  # the period estimate's


def estimate_comm(rates: npt.ArrayLike, rate_hz: float) -> CommEstimate | None:
    r = np.asarray(rates, dtype=float)
    valid = r[np.isfinite(r)]
    if valid.size < 4 or rate_hz <= 0:
        return None
    p = estimate_period(r, rate_hz)
    if p is None:
        return None
    lo, hi = np.percentile(valid, [10, 95])
    if hi <= 0 or hi - lo <= 0.1 * hi:  # no distinct bursts above the quiet level
        return None
    window_s = r.size / rate_hz
    on_s = float(np.count_nonzero(valid > (lo + hi) / 2)) / rate_hz * (r.size / valid.size)
    iterations = window_s / p.period_s
    total = float(valid.sum()) / rate_hz * (r.size / valid.size)
    return CommEstimate(window_s, p.period_s, iterations, on_s / iterations,
                        total / iterations, p.confidence)
