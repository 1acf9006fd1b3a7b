"""Two jobs on one link under strict priority: the model behind k_j (seed §4.2).

Each job iterates: `compute_s` of compute; its communication (`comm_s` of exclusive
link time) may start once (1 - overlap) of the compute is done; the next iteration
starts when both are done. Both jobs start an iteration at t = 0 (a synchronised
collision, the seed's Fig. 11 setting). The high-priority job runs as if alone;
the low one gets only the link time the high one leaves idle.

We measure S, the link time each job transmits within a window of
`window_periods` x the longer standalone period (the seed's Fig. 11 window is
12 s = 3 x 4 s). A finite window matters: jobs with equal periods can phase-lock
into non-overlapping slots in the steady state (Fig. 12's jobs do), while real
clusters keep colliding through jitter and arrivals, so we score the damage right
after a collision. Everything is vectorised over many low/high pairs at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Timing:
    """Per-job arrays (or scalars broadcast against them)."""

    compute_s: np.ndarray
    overlap: np.ndarray
    comm_s: np.ndarray

    @property
    def period(self) -> np.ndarray:
        out: np.ndarray = np.maximum(self.compute_s,
                                     (1.0 - self.overlap) * self.compute_s + self.comm_s)
        return out

    @property
    def comm_offset(self) -> np.ndarray:
        """When communication starts within an iteration."""
        out: np.ndarray = (1.0 - self.overlap) * self.compute_s
        return out


def timing(compute_s: object, overlap: object, comm_s: object) -> Timing:
    return Timing(np.asarray(compute_s, dtype=np.float64), np.asarray(overlap, dtype=np.float64),
                  np.asarray(comm_s, dtype=np.float64))


def busy_time(high: Timing, x: np.ndarray) -> np.ndarray:
    """Link time the high job uses in [0, x)."""
    p, t = high.period, high.comm_s
    y = np.maximum(x - high.comm_offset, 0.0)
    k = np.floor(y / p)
    rest = np.clip(y - k * p, 0.0, p)  # from the same quotient: floor and mod must agree
    out: np.ndarray = k * t + np.minimum(rest, t)
    return out


def _free_until(high: Timing, target: np.ndarray) -> np.ndarray:
    """Earliest x whose cumulative free time x - busy(x) reaches `target`."""
    phi, p, t = high.comm_offset, high.period, high.comm_s
    free = p - t
    y = target - phi
    with np.errstate(divide="ignore", invalid="ignore"):
        q = y / free
        # a transfer ending exactly at the end of a free gap must not spill over the
        # next busy period because of rounding: snap q to an integer within 1e-9
        k = np.ceil(q - 1e-9 * np.maximum(1.0, q)) - 1.0
        x = phi + k * p + t + (y - k * free)
    x = np.where(y <= 0, target, x)
    return np.where((free <= 0) & (y > 0), np.inf, x)


def low_share(high: Timing, low: Timing, window: np.ndarray) -> np.ndarray:
    """Link time the low job transmits in [0, window) under the high job."""
    shape = np.broadcast(high.period, low.period, window).shape
    start = np.zeros(shape)  # iteration start
    sent = np.zeros(shape)
    window = np.broadcast_to(window, shape)
    offset = np.broadcast_to(low.comm_offset, shape)
    comm = np.broadcast_to(low.comm_s, shape)
    compute = np.broadcast_to(low.compute_s, shape)
    active = np.ones(shape, dtype=bool)
    while active.any():
        s = start + offset  # communication starts
        f_s = s - busy_time(high, s)
        end = _free_until(high, f_s + comm)
        done = end <= window
        partial = np.where(s < window, (window - busy_time(high, window)) - f_s, 0.0)
        sent = np.where(active, sent + np.where(done, comm, np.maximum(partial, 0.0)), sent)
        nxt = np.maximum(start + compute, end)
        active = active & done & (nxt < window) & (nxt > start)
        start = np.where(active, nxt, start)
    return sent


def pair_gains(ref: Timing, jobs: Timing, window_periods: float = 3.0
               ) -> tuple[np.ndarray, np.ndarray]:
    """For each job j against the reference r, on one link, in one window:

    gain_j = S_j(j high) - S_j(r high): link time j wins by being prioritised;
    loss_r = S_r(r high) - S_r(j high): link time r loses by yielding to j.
    """
    window = window_periods * np.maximum(ref.period, jobs.period)
    j_high = busy_time(jobs, window)
    j_low = low_share(ref, jobs, window)
    r_high = busy_time(ref, window)
    r_low = low_share(jobs, ref, window)
    return j_high - j_low, r_high - r_low
