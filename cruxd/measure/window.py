"""A bounded, thread-safe window of counter readings, turned into rate series on demand.

The sampler thread appends one reading of every counter per tick (`add`); the agent asks
for the summed bytes/s of some counters between two times (`rates`). Readings, not rates,
are kept so any subset of counters can be summed after the fact: which counters belong to
a job is only known when the agent measures it (the shim's QP records name the ports).
"""

from __future__ import annotations

import itertools
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

    def _since(self, since: float) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """(times, readings of every counter) of the readings at or after `since`, found
        from the newest end: a report's last second costs that second, not the window."""
        with self._lock:
            if since == -math.inf:
                rows = list(self._readings)
            else:
                rows = list(itertools.takewhile(lambda r: r[0] >= since,
                                                reversed(self._readings)))
                rows.reverse()
        t = np.fromiter((r[0] for r in rows), float, len(rows))
        v = np.array([r[1] for r in rows], dtype=float).reshape(len(rows), len(self.names))
        return t, v

    def rates(self, names: Sequence[str], since: float = -math.inf
              ) -> tuple[float, npt.NDArray[np.float64]]:
        """(start time, bytes/s per interval summed over `names`) for the intervals that
        start at or after `since`. NaN marks an interval where any of the counters failed
        or went backwards (a reset): a partial sum would look like a quiet phase."""
        cols = [self._index[n] for n in names]
        t, v = self._since(since)
        if len(t) < 2 or not cols:
            return math.nan, np.zeros(0)
        per = np.sum(self._deltas(v[:, cols]), axis=1)  # NaN if any counter's delta is NaN
        return float(t[0]), self._per_second(per, t)

    def rates_each(self, since: float = -math.inf) -> dict[str, npt.NDArray[np.float64]]:
        """Bytes/s per interval of every counter on its own, for intervals starting at or
        after `since` (NaN where that counter failed or went backwards)."""
        t, v = self._since(since)
        if len(t) < 2:
            return {n: np.zeros(0) for n in self.names}
        rates = self._per_second(self._deltas(v), t[:, None])
        return {n: rates[:, i] for i, n in enumerate(self.names)}

    @staticmethod
    def _deltas(v: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        delta = np.diff(v, axis=0)
        delta[delta < 0] = np.nan
        return delta

    @staticmethod
    def _per_second(per: npt.NDArray[np.float64], t: npt.NDArray[np.float64]
                    ) -> npt.NDArray[np.float64]:
        dt = np.diff(t, axis=0)
        return np.where(dt > 0, per / np.where(dt > 0, dt, 1.0), np.nan)
