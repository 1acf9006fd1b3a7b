"""The iteration-period estimator on synthetic traffic: accuracy, refusals, invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cruxd.measure.period import PeriodEstimate, estimate_period

Array = np.ndarray


def on_off(rng: np.random.Generator, period: float, duration: float, rate_hz: float, *,
           duty: float = 0.3, height: float = 1.0, jitter: float = 0.03,
           drift: float = 0.0) -> tuple[Array, float]:
    """A job's rate series: iterations of compute then a burst (`duty` of the iteration)
    at `height`; each iteration's length is period * (1 + U(-jitter, jitter)) times a slow
    linear drift from -drift to +drift over the window. Each sample is the mean rate over
    its 1/rate_hz bin. Returns the series and the realized mean period in the window."""
    count = int(duration / (period * (1 - jitter - drift))) + 3
    lengths = period * (1 + rng.uniform(-jitter, jitter, count))
    lengths *= 1 + drift * np.linspace(-1.0, 1.0, count)
    starts = np.concatenate([[0.0], np.cumsum(lengths)[:-1]]) - rng.uniform(0, period)
    on = starts + (1 - duty) * lengths  # the burst closes the iteration
    ends = starts + lengths
    # Cumulative burst time, piecewise linear through (on_i, A_i), (end_i, A_i + width_i).
    widths = ends - on
    before = np.concatenate([[0.0], np.cumsum(widths)[:-1]])
    knots_t = np.stack([on, ends], axis=1).ravel()
    knots_c = np.stack([before, before + widths], axis=1).ravel()
    n = round(duration * rate_hz)
    edges = np.arange(n + 1) / rate_hz
    rate = height * np.diff(np.interp(edges, knots_t, knots_c)) * rate_hz
    inside = np.flatnonzero((starts >= 0) & (starts <= duration))
    if inside.size < 2:
        return rate, period
    first, last = inside[0], inside[-1]
    return rate, float((starts[last] - starts[first]) / (last - first))


def degrade(rng: np.random.Generator, rate: Array, noise: float, missing: float) -> Array:
    """Additive Gaussian noise (std = noise, in burst heights), clipped at 0, and NaNs."""
    out = np.clip(rate + rng.normal(0.0, noise, rate.size), 0.0, None)
    out[rng.random(rate.size) < missing] = np.nan
    return out


def rate_for(period: float) -> float:
    return 100.0 if period <= 2.0 else 10.0


def window_for(period: float) -> float:
    return max(30.0, 4 * period)


PERIODS = [0.1, 0.17, 0.3, 0.5, 1.0, 1.9, 3.3, 5.0, 8.0, 13.0, 20.0]


def assert_close(est: PeriodEstimate | None, true: float, tol: float = 0.01) -> None:
    assert est is not None
    assert abs(est.period_s - true) <= tol * true, (est, true)
    assert 0.0 <= est.confidence <= 1.0


@pytest.mark.parametrize("period", PERIODS)
@pytest.mark.parametrize("duty", [0.1, 0.3, 0.6])
@pytest.mark.parametrize("noise", [0.1, 0.2])
def test_bursty_jittered_noisy_gappy(period: float, duty: float, noise: float) -> None:
    for seed in range(3):
        rng = np.random.default_rng([seed, int(period * 100), int(duty * 10)])
        fs, dur = rate_for(period), window_for(period)
        rate, true = on_off(rng, period, dur, fs, duty=duty, jitter=0.02 + 0.01 * seed)
        est = estimate_period(degrade(rng, rate, noise, 0.05), fs)
        assert_close(est, true)
        assert est is not None and est.iterations == pytest.approx(dur / est.period_s)


@pytest.mark.parametrize("period", PERIODS)
def test_clean_and_high_jitter(period: float) -> None:
    rng = np.random.default_rng(7)
    fs, dur = rate_for(period), window_for(period)
    rate, true = on_off(rng, period, dur, fs, jitter=0.0)
    est = estimate_period(rate, fs)
    assert_close(est, true, 0.005)  # 4 periods: finite-window bias of the ACF peak
    assert est is not None and est.confidence > 0.95
    rate, true = on_off(rng, period, dur, fs, jitter=0.05)
    assert_close(estimate_period(degrade(rng, rate, 0.15, 0.05), fs), true)


@pytest.mark.parametrize("period", [0.3, 1.0, 4.0, 15.0])
def test_drift_returns_mean_period(period: float) -> None:
    for seed in range(3):
        rng = np.random.default_rng(100 + seed)
        fs, dur = rate_for(period), window_for(period)
        rate, true = on_off(rng, period, dur, fs, drift=0.02, jitter=0.02)
        assert_close(estimate_period(degrade(rng, rate, 0.15, 0.05), fs), true)


@pytest.mark.parametrize("seed", range(5))
def test_two_jobs_on_one_nic_returns_the_stronger(seed: int) -> None:
    # Documented: the job with the larger height * sin(pi * duty) (stronger fundamental).
    rng = np.random.default_rng(200 + seed)
    a, ta = on_off(rng, 1.0, 40.0, 100.0, duty=0.3, height=1.0)
    b, tb = on_off(rng, 1.7, 40.0, 100.0, duty=0.3, height=0.5)
    assert_close(estimate_period(degrade(rng, a + b, 0.1, 0.05), 100.0), ta)
    a, ta = on_off(rng, 1.0, 40.0, 100.0, duty=0.2, height=0.4)
    b, tb = on_off(rng, 1.7, 40.0, 100.0, duty=0.4, height=1.0)
    assert_close(estimate_period(degrade(rng, a + b, 0.1, 0.05), 100.0), tb)


def test_harmonic_rich_iteration_is_not_halved() -> None:
    # Two bursts per iteration (e.g. forward and backward communication), the second one
    # stronger at 2/T than the fundamental: the period is still T, not T/2.
    rng = np.random.default_rng(3)
    a, true = on_off(rng, 2.0, 60.0, 100.0, duty=0.15, height=1.0, jitter=0.0)
    shifted = np.roll(a, 100) * 0.7  # a second burst half an iteration later
    est = estimate_period(degrade(rng, a + shifted, 0.1, 0.0), 100.0)
    assert_close(est, true)


@pytest.mark.parametrize("seed", range(10))
def test_none_on_white_noise(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = [3000, 300, 30000, 64, 1000][seed % 5]
    assert estimate_period(np.abs(rng.normal(5.0, 1.0, n)), 100.0) is None
    assert estimate_period(rng.exponential(1.0, n), 10.0) is None


def test_none_on_constant_ramp_and_too_little_data() -> None:
    assert estimate_period(np.full(3000, 7.5), 100.0) is None
    assert estimate_period(np.zeros(3000), 100.0) is None
    assert estimate_period(np.linspace(1.0, 5.0, 3000), 100.0) is None
    assert estimate_period(np.array([1.0, 0.0] * 4), 100.0) is None  # < 16 samples
    rng = np.random.default_rng(1)
    rate, _ = on_off(rng, 1.0, 30.0, 100.0)
    gappy = rate.copy()
    gappy[rng.random(rate.size) < 0.4] = np.nan  # too many missing
    assert estimate_period(gappy, 100.0) is None
    assert estimate_period(np.full(100, np.nan), 100.0) is None


@pytest.mark.parametrize("periods_in_window", [0.8, 1.2, 1.5, 1.9])
@pytest.mark.parametrize("period", [1.0, 5.0, 20.0])
def test_none_on_window_shorter_than_two_periods(periods_in_window: float,
                                                 period: float) -> None:
    for seed in range(3):
        rng = np.random.default_rng(seed)
        fs = rate_for(period)
        rate, _ = on_off(rng, period, period * periods_in_window, fs, duty=0.3)
        assert estimate_period(degrade(rng, rate, 0.1, 0.0), fs) is None


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        estimate_period(np.ones(100), 0.0)
    with pytest.raises(ValueError):
        estimate_period(np.ones((10, 10)), 10.0)


def _trace(seed: int, period: float) -> Array:
    rng = np.random.default_rng(seed)
    rate, _ = on_off(rng, period, 30.0, 100.0, duty=0.3)
    return degrade(rng, rate, 0.1, 0.05)


@settings(max_examples=40)
@given(seed=st.integers(0, 2**16), period=st.floats(0.2, 5.0),
       k=st.floats(1e-3, 1e3))
def test_time_scaling_scales_the_period(seed: int, period: float, k: float) -> None:
    x = _trace(seed, period)
    base, scaled = estimate_period(x, 100.0), estimate_period(x, 100.0 * k)
    assert base is not None and scaled is not None
    assert scaled.period_s == pytest.approx(base.period_s / k, rel=1e-12)
    assert scaled.confidence == base.confidence


@settings(max_examples=40)
@given(seed=st.integers(0, 2**16), period=st.floats(0.2, 5.0),
       offset=st.floats(0.0, 1e3), gain=st.floats(1e-6, 1e6))
def test_offset_and_gain_leave_the_period(seed: int, period: float, offset: float,
                                          gain: float) -> None:
    x = _trace(seed, period)
    base = estimate_period(x, 100.0)
    assert base is not None
    for y in (x + offset, x * gain, (x + offset) * gain):
        est = estimate_period(y, 100.0)
        assert est is not None
        assert est.period_s == pytest.approx(base.period_s, rel=1e-6)
        assert est.confidence == pytest.approx(base.confidence, abs=1e-6)


def _pieces(rng: np.random.Generator, fs: float, period: float, burst: float, mbyte_s: float,
            piece: float, seconds: float) -> np.ndarray:
    """Bytes/s per sample of a job whose sends return a `piece` at a time at `mbyte_s` while
    it bursts: what a per-job send counter sees (cruxd/measure/comm.py, "Lumpy series")."""
    n = int(seconds * fs)
    t = np.arange(n) / fs
    out = np.zeros(n)
    start = rng.uniform(0, period)
    while start < seconds:
        k = np.arange(int(burst * mbyte_s * 1e6 / piece)) * piece / (mbyte_s * 1e6) + start
        k = k[k < seconds]
        np.add.at(out, np.minimum((k * fs).astype(int), n - 1), piece * fs)
        start += period
    del t
    return out


@pytest.mark.parametrize(("burst", "piece"), [(0.365, 65536.0), (0.09, 65536.0),
                                              (0.365, 1448.0)])
def test_send_side_pieces_time_the_burst_when_smoothed(burst: float, piece: float) -> None:
    """64 KiB pieces at 25 MB/s sampled at 450 Hz: a sample holds 0, 1 or 2 of them, and the
    raw midpoint reads the burst short; a 20 ms box times it (and changes nothing where
    the pieces are small)."""
    from cruxd.measure.comm import estimate_comm

    rng = np.random.default_rng(7)
    rates = _pieces(rng, 450.0, 1.22, burst, 25.0, piece, 30.0)
    smooth = estimate_comm(rates, 450.0, smooth_s=0.02)
    assert smooth is not None and smooth.comm_s == pytest.approx(burst, rel=0.05)
    raw = estimate_comm(rates, 450.0)
    assert raw is not None
    if piece > 10000:
        assert raw.comm_s < 0.9 * burst  # what the per-job source read without it
    else:
        assert raw.comm_s == pytest.approx(smooth.comm_s, rel=0.05)


def test_smoothing_leaves_bursts_shorter_than_the_box_alone() -> None:
    """A 7 ms burst (the ResNets') is timed raw: the box is capped at half a burst."""
    from cruxd.measure.comm import estimate_comm

    fs, period, burst = 450.0, 0.12, 0.007
    t = np.arange(int(30 * fs)) / fs
    rates = np.where((t % period) < burst, 25e6, 0.0)
    a, b = estimate_comm(rates, fs), estimate_comm(rates, fs, smooth_s=0.02)
    assert a is not None and b is not None and a.comm_s == b.comm_s
