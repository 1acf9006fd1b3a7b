"""Iteration-period estimator (cruxd/measure/period.py): accuracy vs noise, CPU per window.

Protocol
  * Synthetic on/off traffic, one job: per seed, period log-uniform in [0.2, 5] s, burst
    (comm phase) duty uniform in [0.1, 0.6] at height 1, per-iteration jitter +-3 %
    (uniform, accumulating), each sample the mean rate over its bin, 100 Hz, window
    max(30 s, 4 periods), Gaussian noise of std = level * burst height clipped at 0, 5 %
    of samples NaN. Truth = realized mean iteration length in the window.
  (a) For each noise level, --seeds seeds: the fraction returning None, and the median,
      p95 and max of |error| / period over the estimates returned.
  (b) CPU time (time.process_time) of estimate_period per 30-s window at 100 Hz and 1 kHz
      (period 1 s, noise 0.2): --reps calls per batch, median of 5 batches.
  (c) The NIC sampler (cruxd/measure/sampling/nic.py) on this host's real /sys: every netdev tx
      counter (loopback included, so there is at least one), --sampler-s seconds at 100 Hz
      (the default rate); CPU time / wall time = share of one core. Also the agent's own
      sampling thread (cruxd/agent/measuring.py, same counters) with the C loop
      (shim/agent/crux_sampler.c, one Python wakeup per 1-s batch; "c" in the table) and with
      the Python loop (Event.wait between ticks), and the floor of any Python loop: a
      thread that only wakes 100 times a second and reads nothing.

    .venv/bin/python bench/measure.py [--seeds N] [--reps R] [--sampler-s S]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np

# bench/ is on sys.path when run as a script
from tables import preamble, table

from cruxd.measure.period import estimate_period

LEVELS = (0.0, 0.1, 0.2, 0.5, 1.0)


def on_off(rng: np.random.Generator, period: float, duration: float, rate_hz: float,
           duty: float, jitter: float = 0.03) -> tuple[np.ndarray, float]:
    """Rate series of one job (bursts close each iteration) and its realized mean period."""
    count = int(duration / (period * (1 - jitter))) + 3
    lengths = period * (1 + rng.uniform(-jitter, jitter, count))
    starts = np.concatenate([[0.0], np.cumsum(lengths)[:-1]]) - rng.uniform(0, period)
    on, ends = starts + (1 - duty) * lengths, starts + lengths
    before = np.concatenate([[0.0], np.cumsum(ends - on)[:-1]])
    knots_t = np.stack([on, ends], axis=1).ravel()
    knots_c = np.stack([before, before + ends - on], axis=1).ravel()
    edges = np.arange(round(duration * rate_hz) + 1) / rate_hz
    rate = np.diff(np.interp(edges, knots_t, knots_c)) * rate_hz
    inside = np.flatnonzero((starts >= 0) & (starts <= duration))
    return rate, float((starts[inside[-1]] - starts[inside[0]]) / (inside[-1] - inside[0]))


def degrade(rng: np.random.Generator, rate: np.ndarray, noise: float) -> np.ndarray:
    out = np.clip(rate + rng.normal(0.0, noise, rate.size), 0.0, None)
    out[rng.random(rate.size) < 0.05] = np.nan
    return out


def accuracy(level: float, seeds: int) -> list[object]:
    errors, nones = [], 0
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        period = float(np.exp(rng.uniform(np.log(0.2), np.log(5.0))))
        rate, true = on_off(rng, period, max(30.0, 4 * period), 100.0,
                            float(rng.uniform(0.1, 0.6)))
        est = estimate_period(degrade(rng, rate, level), 100.0)
        if est is None:
            nones += 1
        else:
            errors.append(abs(est.period_s - true) / true)
    e = np.array(errors) * 100
    stats = [f"{np.median(e):.3f}", f"{np.percentile(e, 95):.3f}", f"{e.max():.3f}"] \
        if e.size else ["-", "-", "-"]
    return [f"{level:.1f}", seeds, f"{nones / seeds:.2f}", *stats]


def cpu_ms(rate_hz: float, reps: int) -> list[object]:
    rng = np.random.default_rng(0)
    rate, _ = on_off(rng, 1.0, 30.0, rate_hz, 0.3)
    x = degrade(rng, rate, 0.2)
    estimate_period(x, rate_hz)  # warm-up
    batches = []
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(reps):
            estimate_period(x, rate_hz)
        batches.append((time.process_time() - t0) / reps * 1e3)
    return [f"{rate_hz:,.0f} Hz", x.size, f"{np.median(batches):.3f}", f"{min(batches):.3f}"]


def sampler_row(seconds: float) -> list[object]:
    from pathlib import Path

    from cruxd.measure.sampling.nic import DEFAULT_RATE_HZ, Sampler, net_counters

    root = Path("/sys/class/net")
    counters = net_counters(Path("/sys"), sorted(p.name for p in root.iterdir()))
    s = Sampler(counters, DEFAULT_RATE_HZ)
    w0, c0 = time.monotonic(), time.process_time()
    s.run(seconds)
    wall, cpu = time.monotonic() - w0, time.process_time() - c0
    return [f"{DEFAULT_RATE_HZ:.0f} Hz", len(counters), f"{seconds:.0f}",
            f"{cpu / wall * 100:.2f}", s.failed_reads]


def agent_rows(seconds: float) -> list[list[object]]:
    import threading
    from pathlib import Path

    from cruxd.agent.measuring import LiveMeasurement
    from cruxd.config.model import MeasureConfig

    names = tuple(sorted(p.name for p in Path("/sys/class/net").iterdir()))
    rows: list[list[object]] = []
    for sampler in ("auto", "python"):
        cfg = MeasureConfig(rate_hz=100.0, sampler=sampler, window_s=30.0, gpu="none",
                            gpu_file=None, gpu_interval_s=1.0, interfaces=names, rdma=True,
                            peak_tflops=0.0, settle_s=1.0, sysfs=None)
        live = LiveMeasurement(cfg, (), lambda job: [], lambda: [], lambda: 0)
        w0, c0 = time.monotonic(), time.process_time()
        live.start()
        time.sleep(seconds)
        live.stop()
        wall, cpu = time.monotonic() - w0, time.process_time() - c0
        rows.append([f"agent thread ({live.sampler}), 100 Hz", len(live.counters),
                     f"{seconds:.0f}", f"{cpu / wall * 100:.2f}", live.failed_cycles])
    stop = threading.Event()

    def idle() -> None:
        t = time.monotonic()
        while not stop.wait(max(0.0, (t := t + 0.01) - time.monotonic())):
            pass

    th = threading.Thread(target=idle)
    w0, c0 = time.monotonic(), time.process_time()
    th.start()
    time.sleep(seconds)
    stop.set()
    th.join()
    wall, cpu = time.monotonic() - w0, time.process_time() - c0
    rows.append(["idle wakeups, 100 Hz", 0, f"{seconds:.0f}", f"{cpu / wall * 100:.2f}", 0])
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--reps", type=int, default=100, help="calls per timing batch")
    ap.add_argument("--sampler-s", type=float, default=10.0, help="NIC sampler run length")
    args = ap.parse_args(argv)
    preamble(f"numpy {np.__version__}")
    print()
    print(table(["noise std / burst", "seeds", "None frac", "median |err| %", "p95 |err| %",
                 "max |err| %"], [accuracy(lv, args.seeds) for lv in LEVELS]))
    print()
    print(table(["30-s window", "samples", "CPU ms/window (median)", "CPU ms (best batch)"],
                [cpu_ms(hz, args.reps) for hz in (100.0, 1000.0)]))
    print()
    print(table(["NIC sampler", "counters", "seconds", "% of a core", "failed reads"],
                [sampler_row(args.sampler_s), *agent_rows(args.sampler_s)]))
    print(f"\n# error = |estimate - realized mean period| / period over the estimates returned; "
          f"CPU = time.process_time, median of 5 batches of {args.reps} calls")


if __name__ == "__main__":
    main()
