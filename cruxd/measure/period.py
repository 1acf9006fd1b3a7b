"""Iteration period of a training job from its traffic-rate series (pure numpy, no I/O).

A job alternates compute (little traffic) and communication (a burst), so its NIC rate is
a periodic on/off wave. `estimate_period` fills missing samples, removes a linear trend,
takes the Hann-windowed, zero-padded power spectrum, and picks its strongest line. That
line may be a harmonic k/T of the true period T (narrow or multiple bursts per iteration):
the multiples m * lag (m = 1..6) that carry their own spectral line at 1/(m * lag) and an
autocorrelation peak within 15 % of the best are candidates, the longest wins. The chosen
autocorrelation peak and its multiples (up to 8, each located by the centroid of its top)
are fit by least squares through the origin: the period, to a fraction of a sample.

With two jobs on one NIC the period returned is the one of the job with the stronger
spectral fundamental, i.e. the larger burst height * sin(pi * duty); the other job only
lowers the confidence. All work is in samples; `rate_hz` only converts the result, so
scaling the time axis scales the period exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

Array = NDArray[np.float64]

# Linear interpolation over more than 30 % missing samples smears bursts into ramps and
# invents periodicity in long gaps: below that, say nothing.
MAX_MISSING: Final = 0.3
# Fewer samples than this cannot hold two periods of >= MIN_LAG samples plus margin.
MIN_SAMPLES: Final = 16
# A period must repeat at least twice in the window to be told from a one-off event.
MIN_PERIODS: Final = 2.0
# Below 2 samples per period the rate series cannot resolve an on/off wave (Nyquist).
MIN_LAG: Final = 2.0
# 2x zero padding plus a Gaussian fit of the line locate it to a few % of a bin, well
# inside the +-10 % autocorrelation search below even with two to four periods in the
# window; more padding buys nothing the autocorrelation does not refine, at FFT cost.
PAD: Final = 2
# Period multiples tried: a line at k/T strong enough to beat 1/T needs k <= ~6 for any
# plausible burst shape.
MULTIPLES: Final = 6
# Jitter and the estimator's variance make r(2T) a few to ~15 % lower than r(T), while a
# harmonic lag T/k of an on/off wave is far lower (often negative): 0.85 separates them.
NEAR_BEST: Final = 0.85
# Relative half-width of the autocorrelation search around a spectral candidate lag.
SEARCH: Final = 0.1
# Peaks of the autocorrelation fit for the refinement; later ones are blurred by jitter.
REFINE_PEAKS: Final = 8
# Part of an autocorrelation peak (above this fraction of its apex) whose centroid gives
# its position: wide enough to average the jitter, narrow enough that the finite window's
# asymmetry of the peak's flanks does not bias it.
CENTROID_LEVEL: Final = 0.75
# A peak at a multiple is used only while it keeps half the first peak's correlation.
REFINE_KEEP: Final = 0.5
# Confidence floor: below 0.2 four fifths of the variance are not periodic; at realistic
# noise (std 10-20 % of the burst) r(T) is 0.5-0.95.
MIN_CONFIDENCE: Final = 0.2
# White noise gives r(lag) ~ N(0, 1/(n - lag)); 5 sigma keeps short windows from guessing.
NULL_SIGMAS: Final = 5.0
# White-noise periodogram maxima reach ~ln(N)/ln(2) (10-20) times the median; real lines
# of a bursty job are 100-10^4 times the median.
MIN_PEAK_OVER_MEDIAN: Final = 30.0
# A sub-harmonic line must reach 1 % (-20 dB) of the strongest line: Hann sidelobes are
# below -31 dB, so leakage is not mistaken for a line even in a noise-free series.
MIN_SUBLINE: Final = 0.01
# Relative size of the detrended signal below which the series is constant (float noise).
FLAT: Final = 1e-9


@dataclass(frozen=True, slots=True)
class PeriodEstimate:
    """An iteration period found in a rate series."""

    period_s: float
    confidence: float  # normalized autocorrelation at the period lag, 0..1
    iterations: float  # window length / period
    lag_samples: float  # the period in samples
    peaks_fit: int  # autocorrelation peaks in the least-squares fit
    method: str = "fft+acf"


def estimate_period(samples: ArrayLike, rate_hz: float) -> PeriodEstimate | None:
    """The iteration period of `samples` (rates at `rate_hz`, NaN = missing), or None."""
    if not rate_hz > 0 or not math.isfinite(rate_hz):
        raise ValueError(f"rate_hz must be positive and finite, got {rate_hz}")
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"samples must be 1-D, got shape {x.shape}")
    filled = _fill(x)
    if filled is None:
        return None
    y = _detrend(filled)
    n = y.size
    if not np.any(y) or float(np.std(y)) <= FLAT * float(np.max(np.abs(filled))):
        return None  # constant (or a pure ramp)
    spec = _Spectrum(y)
    lag1 = spec.strongest()
    if lag1 is None:
        return None
    r = _autocorrelation(y)
    max_lag = n / MIN_PERIODS
    chosen = _pick_lag(r, spec, lag1, max_lag)
    if chosen is None:
        return None
    j0, r0 = chosen
    if r0 < max(MIN_CONFIDENCE, NULL_SIGMAS / math.sqrt(n - j0)):
        return None
    lag, fit = _refine(r, j0, max_lag)
    if not MIN_LAG <= lag <= max_lag:
        return None
    return PeriodEstimate(period_s=lag / rate_hz, confidence=min(1.0, r0),
                          iterations=n / lag, lag_samples=lag, peaks_fit=fit)


def _fill(x: Array) -> Array | None:
    ok = np.isfinite(x)
    valid = int(np.count_nonzero(ok))
    if valid < MIN_SAMPLES or valid < (1.0 - MAX_MISSING) * x.size:
        return None
    if valid == x.size:
        return x
    idx = np.arange(x.size, dtype=np.float64)
    return np.interp(idx, idx[ok], x[ok])


def _detrend(x: Array) -> Array:
    t = np.arange(x.size, dtype=np.float64) - (x.size - 1) / 2.0
    y = x - float(np.mean(x))
    return y - (float(np.dot(t, y)) / float(np.dot(t, t))) * t


class _Spectrum:
    """Hann-windowed, zero-padded power spectrum; frequencies in padded bins."""

    def __init__(self, y: Array) -> None:
        n = y.size
        self.nfft = 1 << (PAD * n - 1).bit_length()
        f = np.fft.rfft(y * np.hanning(n), self.nfft)
        self.p = f.real ** 2 + f.imag ** 2
        self.lo = max(1, math.ceil(MIN_PERIODS * self.nfft / n))  # >= 2 cycles in window
        self.hi = min(self.p.size - 2, math.floor(self.nfft / MIN_LAG))
        band = self.p[self.lo:self.hi + 1]
        # Median over every PAD-th bin: the same level, on nearly independent bins.
        self.floor = float(np.median(band[::PAD])) if band.size else 0.0
        self.top = 0.0

    def strongest(self) -> float | None:
        """Lag (samples) of the strongest significant line in the band, or None."""
        if self.hi - self.lo < 2:
            return None
        i = int(np.argmax(self.p[self.lo:self.hi + 1])) + self.lo
        self.top = float(self.p[i])
        if not self.significant(i):
            return None
        return self.nfft / (i + _vertex(*np.log(self.p[i - 1:i + 2] + 1e-300)))

    def significant(self, i: int) -> bool:
        return bool(self.p[i] >= MIN_PEAK_OVER_MEDIAN * self.floor and self.p[i] > 0)

    def has_line(self, lag: float) -> bool:
        """Whether a significant local maximum lies within half a (unpadded) bin of lag."""
        c = self.nfft / lag
        lo, hi = max(1, math.floor(c - PAD / 2)), min(self.p.size - 2, math.ceil(c + PAD / 2))
        if hi < lo:
            return False
        i = int(np.argmax(self.p[lo:hi + 1])) + lo
        return bool(self.p[i - 1] < self.p[i] >= self.p[i + 1] and self.significant(i)
                    and self.p[i] >= MIN_SUBLINE * self.top)


def _autocorrelation(y: Array) -> Array:
    """Unbiased normalized autocorrelation r[0..n-1], r[0] = 1."""
    n = y.size
    m = 1 << (2 * n - 1).bit_length()
    f = np.fft.rfft(y, m)
    acf = np.fft.irfft(f.real ** 2 + f.imag ** 2, m)[:n]
    return np.asarray(acf / acf[0] * (n / (n - np.arange(n))), dtype=np.float64)


def _local_max(r: Array, center: float, half: float, max_lag: float) -> int | None:
    """The highest lag within center +- half (<= max_lag), if it is a true local maximum:
    a peak cut by the window's edge (e.g. by max_lag) is not a period."""
    lo = max(1, math.floor(center - half))
    hi = min(math.floor(max_lag), math.ceil(center + half), r.size - 2)
    if hi < lo:
        return None
    j = int(np.argmax(r[lo:hi + 1])) + lo
    return j if r[j - 1] <= r[j] >= r[j + 1] else None


def _pick_lag(r: Array, spec: _Spectrum, lag1: float,
              max_lag: float) -> tuple[int, float] | None:
    """The fundamental: the longest multiple m * lag1 (m <= MULTIPLES) that is a peak of
    the autocorrelation near the best candidate's and carries its own spectral line at
    1/(m * lag1) (m = 1: the strongest line itself).

    The line test rejects multiples of the fundamental (a periodic series has no power at
    f/m) and a second job's correlation at lags near m * lag1; the correlation test
    rejects a line at f/m that belongs to another job. So a strong harmonic k/T (narrow or
    multiple bursts per iteration) yields to its period T."""
    cands: list[tuple[int, float]] = []
    for m in range(1, MULTIPLES + 1):
        # The spectral lag is good to ~SEARCH; m * lag1 inherits m times that error but
        # must not reach the next multiple's peak.
        c = m * lag1
        if c > max_lag * (1 + SEARCH):
            break
        j = _local_max(r, c, max(1.0, min(SEARCH * c, 0.4 * lag1)), max_lag)
        if j is not None and j >= MIN_LAG and (m == 1 or spec.has_line(c)):
            cands.append((j, float(r[j])))
    if not cands:
        return None
    best = max(v for _, v in cands)
    if best <= 0:
        return None
    return max((c for c in cands if c[1] >= NEAR_BEST * best), key=lambda c: c[0])


def _refine(r: Array, j0: int, max_lag: float) -> tuple[float, int]:
    """Least-squares period through the autocorrelation peaks at j0, 2*j0, ..."""
    first = j0 + _peak_offset(r, j0)
    num, den, est, fit = first, 1.0, first, 1
    for k in range(2, REFINE_PEAKS + 1):
        j = _local_max(r, k * est, max(1.0, SEARCH * est), max_lag)
        if j is None or j + 1 > max_lag or r[j] < REFINE_KEEP * r[j0]:
            break
        num += k * (j + _peak_offset(r, j))
        den += k * k
        est, fit = num / den, fit + 1
    return est, fit


def _peak_offset(r: Array, j: int) -> float:
    """Sub-sample position of the peak at j: the centroid of its upper half.

    Per-iteration jitter makes the peak a sum of shifted copies, one per pair of
    iterations; its centroid is their mean spacing, where the apex (parabolic fit) is
    their mode. A one-sample-wide peak falls back to the parabolic vertex."""
    if j < 1 or j + 1 >= r.size:
        return 0.0
    half = CENTROID_LEVEL * float(r[j])
    reach = max(1, j // 4)
    lo, hi = j, j
    while lo > max(1, j - reach) and r[lo - 1] > half:
        lo -= 1
    while hi < min(r.size - 1, j + reach) and r[hi + 1] > half:
        hi += 1
    if hi - lo < 2:
        return _vertex(float(r[j - 1]), float(r[j]), float(r[j + 1]))
    w = r[lo:hi + 1] - half
    return float(np.dot(np.arange(lo - j, hi - j + 1), w) / np.sum(w))


def _vertex(a: float, b: float, c: float) -> float:
    """Offset in [-0.5, 0.5] of the vertex of the parabola through (-1,a), (0,b), (1,c)."""
    d = a - 2.0 * b + c
    if d >= 0:
        return 0.0
    return max(-0.5, min(0.5, 0.5 * (a - c) / d))
