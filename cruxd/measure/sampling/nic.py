"""NIC byte counters: what a job's traffic looks like from this host, sampled from sysfs.

Two kinds of interface, both read under an injectable sysfs root (tests use a fixture tree):
  - RDMA ports: <root>/class/infiniband/<dev>/ports/<p>/counters/port_xmit_data and
    port_rcv_data count octets divided by 4 (IBTA PortCounters: "data octets / 4"); the
    extended 64-bit counters are what modern kernels expose there.
  - netdevs (TCP/UDP traffic): <root>/class/net/<if>/statistics/{tx,rx}_bytes.

`Sampler` reads them on a fixed-rate loop (absolute deadlines, so the series stays on its grid
even when a read is slow) into `RateSeries`: bytes/s per interval. A failed or impossible
reading (missing file, counter that went backwards: a reset or a device swap) skips that
interval for that interface, logged once per interface until it recovers, never fatal.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

LOG = logging.getLogger(__name__)
DEFAULT_RATE_HZ = 100.0  # resolves iterations down to ~0.1 s with a few samples per burst


@dataclass(frozen=True)
class Counter:
    """One byte counter: name "rdma:<dev>/<port>" or "net:<if>", file, bytes per unit."""
    name: str
    path: Path
    scale: int = 1  # 4 for IB port_xmit_data / port_rcv_data


def rdma_counters(root: Path, direction: str = "xmit") -> list[Counter]:
    """Every RDMA port's data counter (direction "xmit" or "rcv")."""
    out = []
    for dev in sorted((root / "class" / "infiniband").glob("*")):
        for port in sorted((dev / "ports").glob("*")):
            f = port / "counters" / f"port_{direction}_data"
            if f.exists():
                out.append(Counter(f"rdma:{dev.name}/{port.name}", f, 4))
    return out


def net_counters(root: Path, names: Iterable[str] | None = None,
                 direction: str = "tx") -> list[Counter]:
    """Netdev byte counters (direction "tx" or "rx"), all but loopback unless named."""
    base = root / "class" / "net"
    want = sorted(names) if names is not None else sorted(
        p.name for p in base.glob("*") if p.name != "lo")
    return [Counter(f"net:{n}", base / n / "statistics" / f"{direction}_bytes") for n in want
            if (base / n / "statistics" / f"{direction}_bytes").exists()]


@dataclass
class RateSeries:
    """Bytes/s per sampling interval for one counter; NaN where an interval was skipped."""
    name: str
    rate_hz: float
    start: float  # monotonic time of the first interval's start
    rates: list[float] = field(default_factory=list)
    total_bytes: float = 0.0

    @property
    def duration_s(self) -> float:
        return len(self.rates) / self.rate_hz


class CounterReader:
    """Reads counters, keeping each file open and re-reading it with pread at offset 0
    (sysfs returns a fresh value each time): open/read/close per sample cost 5x the CPU at
    100 Hz. A counter that cannot be read is logged once until it recovers."""

    def __init__(self) -> None:
        self.fds: dict[Path, int] = {}
        self.failing: set[str] = set()
        self.failed = 0  # readings that failed, all counters together

    def fd(self, c: Counter) -> int:
        """The counter's open descriptor (opened on first use; raises OSError)."""
        fd = self.fds.get(c.path)
        if fd is None:
            fd = self.fds[c.path] = os.open(c.path, os.O_RDONLY | os.O_CLOEXEC)
        return fd

    def read(self, c: Counter) -> int:
        return int(os.pread(self.fd(c), 64, 0).split()[0]) * c.scale

    def read_or_none(self, c: Counter) -> int | None:
        try:
            value = self.read(c)
        except (OSError, ValueError, IndexError) as exc:
            self.failure(c, exc)
            return None
        self.success(c)
        return value

    def failure(self, c: Counter, exc: Exception, count: int = 1) -> None:
        """Count `count` failed readings, log the first of a run, and reopen the file next
        time (the device may have been replaced)."""
        self.failed += count
        self.drop(c.path)
        if c.name not in self.failing:
            LOG.warning("%s: cannot read %s (%s); skipping until it recovers", c.name, c.path,
                        exc)
            self.failing.add(c.name)

    def success(self, c: Counter) -> None:
        if c.name in self.failing:
            LOG.info("%s: readable again", c.name)
            self.failing.discard(c.name)

    def drop(self, path: Path) -> None:
        fd = self.fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for p in list(self.fds):
            self.drop(p)


class Sampler:
    """Samples counters at `rate_hz`; call `run(duration_s)` or drive `tick()` yourself."""

    def __init__(self, counters: list[Counter], rate_hz: float = DEFAULT_RATE_HZ,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not counters:
            raise ValueError("no counters to sample")
        if not 0 < rate_hz <= 10_000:
            raise ValueError(f"rate_hz must be in (0, 10000], got {rate_hz}")
        self.counters, self.rate_hz, self.clock = counters, rate_hz, clock
        self._last: dict[str, tuple[float, int] | None] = {}
        self.series: dict[str, RateSeries] = {}
        self._resets = 0
        self._reader = CounterReader()

    @property
    def failed_reads(self) -> int:
        """Unreadable counters plus intervals skipped for a counter that went backwards."""
        return self._reader.failed + self._resets

    def close(self) -> None:
        self._reader.close()

    def _sample_one(self, c: Counter, now: float) -> float:
        value = self._reader.read_or_none(c)
        if value is None:
            self._last[c.name] = None
            return math.nan
        prev = self._last.get(c.name)
        self._last[c.name] = (now, value)
        if prev is None:
            return math.nan
        dt, delta = now - prev[0], value - prev[1]
        if delta < 0 or dt <= 0:
            self._resets += 1
            LOG.warning("%s: counter went from %d to %d (reset?); interval skipped",
                        c.name, prev[1], value)
            return math.nan
        self.series[c.name].total_bytes += delta
        return delta / dt

    def tick(self) -> None:
        """Read every counter once; the first tick only sets the baseline."""
        now = self.clock()
        for c in self.counters:
            s = self.series.get(c.name)
            if s is None:  # the first reading only sets the baseline
                self.series[c.name] = RateSeries(c.name, self.rate_hz, now)
                self._sample_one(c, now)
            else:
                s.rates.append(self._sample_one(c, now))

    def run(self, duration_s: float, sleep: Callable[[float], None] = time.sleep
            ) -> dict[str, RateSeries]:
        """Sample for `duration_s` on absolute deadlines; returns the series by counter."""
        period = 1.0 / self.rate_hz
        t0 = self.clock()
        n = round(duration_s * self.rate_hz)
        for i in range(n + 1):  # n + 1 readings give n intervals
            delay = t0 + i * period - self.clock()
            if delay > 0:
                sleep(delay)
            self.tick()
        self.close()
        return self.series
