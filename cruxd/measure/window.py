"""A bounded, thread-safe window of counter readings, turned into rate series on demand.

The sampler thread appends one reading of every counter per tick (`add`); the agent asks
for the summed bytes/s of some counters between two times (`rates`). Readings, not rates,
are kept so any subset of counters can be summed after the fact: which counters belong to
a job is only known when the agent measures it (the shim's QP records name the ports).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


class CounterWindow:
    def __init__(self, names: Sequence[str], rate_hz: float, keep_s: float) -> None:
        if not names:
            raise ValueError("no counters")
        self.names = tuple(names)
        self.rate_hz = rate_hz
        self._index = {n: i for i, n in enumerate(self.names)}
        self._readings: deque[tuple[float, tuple[float, ...]]] = deque(
            maxlen=max(4, math.ceil(keep_s * rate_hz) + 1))
        self._lock = threading.Lock()

    def add(self, t: float, values: Sequence[float | None]) -> None:
        """One reading (monotonic seconds; bytes per counter, None where it failed)."""
        row = tuple(math.nan if v is None else float(v) for v in values)
        if len(row) != len(self.names):
            raise ValueError(f"expected {len(self.names)} values, got {len(row)}")
        with self._lock:
            self._readings.append((t, row))

    def extend(self, ts: Sequence[float], rows: npt.NDArray[np.float64]) -> None:
        """Many readings at once (a batch from the C sampler): rows[i] was read at ts[i],
        NaN where a counter failed."""
        if rows.ndim != 2 or rows.shape != (len(ts), len(self.names)):
            raise ValueError(f"expected {len(ts)} x {len(self.names)} values, got {rows.shape}")
        batch = [(float(t), tuple(r)) for t, r in zip(ts, rows.tolist(), strict=True)]
        with self._lock:
            self._readings.extend(batch)

    def __len__(self) -> int:
        return len(self._readings)

    def span(self) -> tuple[float, float] | None:
        with self._lock:
            if len(self._readings) < 2:
                return None
            return self._readings[0][0], self._readings[-1][0]

    def rates(self, names: Sequence[str], since: float = -math.inf
              ) -> tuple[float, npt.NDArray[np.float64]]:
        """(start time, bytes/s per interval summed over `names`) for the intervals that
        start at or after `since`. NaN marks an interval where any of the counters failed
        or went backwards (a reset): a partial sum would look like a quiet phase."""
        cols = [self._index[n] for n in names]
        with self._lock:
            rows = list(self._readings)
        if len(rows) < 2 or not cols:
            return math.nan, np.zeros(0)
        t = np.fromiter((r[0] for r in rows), float, len(rows))
        v = np.array([[r[1][c] for c in cols] for r in rows], dtype=float)
        delta = np.diff(v, axis=0)
        delta[delta < 0] = np.nan
        per = np.sum(delta, axis=1)  # NaN if any counter's delta is NaN
        dt = np.diff(t)
        out = np.where(dt > 0, per / np.where(dt > 0, dt, 1.0), np.nan)
        first = int(np.searchsorted(t[:-1], since, side="left"))
        return (float(t[first]) if first < len(t) - 1 else math.nan), out[first:]
