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

Lumpy series (`smooth_s`). Bytes counted as the job's `send` calls return, not as the NIC
sends them, arrive in the job's own pieces: the testbed's ring sends 64 KiB at a time, which
at 200 Mbit/s is one piece per 2.6 ms, so at 450 Hz a sample inside a burst holds 0, 1 or 2
pieces. The 95th percentile then sits at two pieces, the midpoint at one, and samples of one
piece fall either side: GPT's t_j read 17 % short. With `smooth_s`, the on-wire time is
counted on the series averaged over a box of that width, capped at half the raw estimate's
burst (a burst shorter than the box would read as the box). A flat burst of width W >= B,
averaged over a box of width B, is a trapezoid whose half-height width is exactly W, so the
box costs no bias while it averages the pieces out. The agent boxes every series, the NIC's
too: read at a few hundred Hz on a loaded host, counters jitter from sample to sample.
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


def _on_samples(valid: npt.NDArray[np.float64]) -> int | None:
    """Samples above the midpoint of quiet and burst levels; None without distinct bursts."""
    lo, hi = np.percentile(valid, [10, 95])
    if hi <= 0 or hi - lo <= 0.1 * hi:  # no distinct bursts above the quiet level
        return None
    return int(np.count_nonzero(valid > (lo + hi) / 2))


def _box(r: npt.NDArray[np.float64], k: int) -> npt.NDArray[np.float64]:
    """`r` averaged over k samples (centred), NaN samples left out of each average."""
    ok = np.isfinite(r)
    kernel = np.ones(k)
    sums = np.convolve(np.where(ok, r, 0.0), kernel, mode="same")
    counts = np.convolve(ok.astype(float), kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        out: npt.NDArray[np.float64] = np.where(counts > 0, sums / counts, np.nan)
    return out


def estimate_comm(rates: npt.ArrayLike, rate_hz: float,
                  smooth_s: float = 0.0) -> CommEstimate | None:
    r = np.asarray(rates, dtype=float)
    valid = r[np.isfinite(r)]
    if valid.size < 4 or rate_hz <= 0:
        return None
    p = estimate_period(r, rate_hz)
    if p is None:
        return None
    on = _on_samples(valid)
    if on is None:
        return None
    window_s = r.size / rate_hz
    iterations = window_s / p.period_s
    scale = r.size / valid.size
    k = int(min(smooth_s, on / rate_hz * scale / iterations / 2) * rate_hz)
    if k >= 3:  # a box of at least three samples, at most half a burst (see above)
        smooth = _box(r, k)
        if (on_smooth := _on_samples(smooth[np.isfinite(smooth)])) is not None:
            on = on_smooth
    on_s = on / rate_hz * scale
    total = float(valid.sum()) / rate_hz * scale
    return CommEstimate(window_s, p.period_s, iterations, on_s / iterations,
                        total / iterations, p.confidence)
