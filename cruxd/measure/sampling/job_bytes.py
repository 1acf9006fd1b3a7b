"""Per-job byte counters, sampled with the NIC counters: each job's own traffic on a shared NIC.

Two jobs on one host share its NIC, whose counters mix their traffic. The job-side libraries
count what each process sends, in its own record file beside the decision table: the TCP
interposer's `sock-<pid>` holds `bytes_sent` (transport/sock_records.py). A
`JobCounterSource` names such counters: for each live process of a job, a file and the offset
of a monotonic u64. `JobBytes` keeps those files open, hands (descriptor, offset) pairs to the
NIC sampling loop (the C loop preads 8 bytes per counter per tick, as cheap as a sysfs read),
and turns each batch of readings into one monotonic total per job, in a `CounterWindow` per
job. The set of files changes as processes come and go: it is rescanned about once a second
(once per batch of the C loop), never per sample.

The verbs wrapper's QP records count bytes per QP (`bytes_posted`, crux_qps.h): they are the
second `JobCounterSource`, of kind "qp", whose counters are the live QPs' byte fields. A kind
names which jobs it describes: "sock" the jobs that talk TCP (no QP records), "qp" the RDMA
ones.

Files are hostile input (transport/pid_files.py): scanned with the record readers' checks
(regular file, size, pid named in the file, owner), opened again here with O_NOFOLLOW and
O_NONBLOCK and checked to be a regular file, read with pread, never mapped. A process's
counter is attributed to a job only while the process is one of the job's registered pids or
descends from one (`belongs`): a record file only claims its job id. A counter is counted
from when it was first seen (its first reading is its baseline, so a process found late adds
no spike), a counter that goes backwards (a truncated or recreated file) counts nothing for
that interval, and one that goes away leaves its job's total where it was: the total only
grows. A tick where one of a job's counters failed is a gap (NaN) in that job's window.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from cruxd.measure.window import CounterWindow
from transport import qp_records, sock_records
from transport.pid_files import SkippedFiles

LOG = logging.getLogger(__name__)
RESCAN_S = 1.0  # how often the set of files is read again


@dataclass(frozen=True)
class JobCounter:
    """One monotonic u64 in a process's record file that counts bytes for a job."""
    key: str  # unique while it counts the same thing: a recreated file is a new key
    job_id: str
    pid: int  # as the agent sees it (the file is named by the job's own view of it)
    path: Path
    offset: int


class JobCounterSource(Protocol):
    kind: str  # which jobs it describes: "sock" (TCP jobs), "qp" (RDMA jobs)

    def counters(self) -> tuple[list[JobCounter], list[str]]:
        """(the counters of live processes now, problems with files that were refused)."""
        ...


class SockBytesSource:
    """The TCP interposer's `bytes_sent` per process (`<dir>/sock-<pid>`, version 2)."""

    kind = "sock"

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def counters(self) -> tuple[list[JobCounter], list[str]]:
        records, problems = sock_records.read_dir(self.directory)  # the agent prunes, not us
        return [JobCounter(f"sock:{r.file}:{r.created_ns}", r.job_id, r.pid,
                           self.directory / r.file, sock_records.BYTES_SENT_OFFSET)
                for r in records if r.version >= 2 and r.job_id], problems


class QpBytesSource:
    """The verbs wrapper's bytes_posted per live QP (`<dir>/<pid>`, QP records version 2).
    A destroyed QP's counter goes away and its job's total stays where it was; the file's
    `retired` sum is not read, since it takes over counts already seen per QP."""

    kind = "qp"

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def counters(self) -> tuple[list[JobCounter], list[str]]:
        records, problems = qp_records.read_dir(self.directory)
        return [JobCounter(f"qp:{p.file}:{q.slot}:{q.qpn}:{q.created_ns}", p.job_id, p.pid,
                           self.directory / p.file, qp_records.bytes_posted_offset(q.slot))
                for p in records if p.job_id for q in p.qps if q.slot >= 0], problems


def open_counter(c: JobCounter) -> int:
    """A descriptor on the counter's file, refused unless it is a regular file that holds the
    counter (OSError)."""
    fd = os.open(c.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < c.offset + 8:
            raise OSError(errno.EINVAL, f"{c.path}: not a regular file holding the counter")
    except OSError:
        os.close(fd)
        raise
    return fd


@dataclass
class _Open:
    counter: JobCounter
    fd: int
    last: float = math.nan  # the last valid reading: the baseline of the next delta


class JobBytes:
    """Per-job totals from `sources`, sampled by the NIC loop (see the module doc).

    Thread use: `descriptors` and `add` run on the sampling thread; `rates`, `kinds_of` and
    `forget` on the agent's loop. `owners` (the registry's) is called from the sampling
    thread: it returns a tuple built under the GIL."""

    def __init__(self, sources: Sequence[JobCounterSource], rate_hz: float, keep_s: float,
                 owners: Callable[[str], Iterable[int]],
                 belongs: Callable[[int, set[int]], bool],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sources, self.rate_hz, self.keep_s = list(sources), rate_hz, keep_s
        self.owners, self.belongs, self.clock = owners, belongs, clock
        self._open: dict[str, _Open] = {}
        self._order: list[_Open] = []  # the counters of the current batch, in column order
        self._totals: dict[tuple[str, str], float] = {}  # (kind, job) -> bytes so far
        self._kind_of: dict[str, str] = {}  # counter key -> its source's kind
        self._windows: dict[tuple[str, str], CounterWindow] = {}
        self._counted: dict[tuple[str, str], int] = {}  # counters per (kind, job) now
        self._lock = threading.Lock()  # the windows and counts: the loop reads them
        self._rescanned = -math.inf
        self.failed = 0  # readings that failed, all counters together
        self.skips = SkippedFiles(LOG, clock=clock)  # files refused over all scans

    # --- sampling thread -----------------------------------------------------------------
    def descriptors(self) -> list[tuple[int, int]]:
        """(descriptor, offset) per counter for the next readings, in column order; the set
        is rescanned when RESCAN_S has passed."""
        now = self.clock()
        if now - self._rescanned >= RESCAN_S:
            self._rescanned = now
            self._rescan()
        return [(o.fd, o.counter.offset) for o in self._order]

    def _rescan(self) -> None:
        found: dict[str, tuple[str, JobCounter]] = {}
        problems: list[str] = []
        for src in self.sources:
            try:
                counters, why = src.counters()
            except OSError as exc:  # the directory itself: nothing to count this second
                counters, why = [], [f"{src.kind}: {exc}"]
            problems += why
            found.update((c.key, (src.kind, c)) for c in counters)
        owners: dict[str, set[int]] = {}
        for key in list(self._open):
            if key not in found:
                os.close(self._open.pop(key).fd)
                self._kind_of.pop(key, None)
        for key, (kind, c) in found.items():
            if key in self._open:
                continue
            mine = owners.setdefault(c.job_id, set(self.owners(c.job_id)))
            if not mine or not self.belongs(c.pid, mine):
                continue  # not (yet) a registered process of that job: claims nothing
            try:
                self._open[key] = _Open(c, open_counter(c))
            except OSError as exc:
                problems.append(f"{c.path}: {exc}")
                continue
            self._kind_of[key] = kind
        self._order = list(self._open.values())
        counted: dict[tuple[str, str], int] = {}
        for o in self._order:
            k = (self._kind_of[o.counter.key], o.counter.job_id)
            counted[k] = counted.get(k, 0) + 1
        with self._lock:
            self._counted = counted
        self.skips.note("per-job counters", problems)

    def add(self, ts: Sequence[float], raw: npt.NDArray[np.int64]) -> None:
        """Readings of the counters `descriptors` gave, ticks x counters: raw[i, k] read at
        ts[i], -errno where it failed."""
        if not self._order or len(ts) == 0:
            return
        if raw.shape != (len(ts), len(self._order)):
            raise ValueError(f"expected {len(ts)} x {len(self._order)} readings, got {raw.shape}")
        values = np.where(raw < 0, np.nan, raw.astype(float))
        self.failed += int((raw < 0).sum())
        jobs: dict[tuple[str, str], list[int]] = {}
        for k, o in enumerate(self._order):
            jobs.setdefault((self._kind_of[o.counter.key], o.counter.job_id), []).append(k)
        steps = np.zeros(values.shape)  # bytes each counter added since its previous reading
        for k, o in enumerate(self._order):
            col = values[:, k]
            prev = np.concatenate([[o.last], col[:-1]])
            # a gap: the delta is taken from the last valid reading, when one comes
            prev = _carry_forward(prev)
            d = col - prev
            steps[:, k] = np.where(np.isfinite(d) & (d > 0), d, 0.0)
            valid = col[np.isfinite(col)]
            if valid.size:
                o.last = float(valid[-1])
        with self._lock:
            for job, cols in jobs.items():
                base = self._totals.get(job, 0.0)
                total = base + np.cumsum(steps[:, cols].sum(axis=1))
                total[np.isnan(values[:, cols]).any(axis=1)] = np.nan
                self._totals[job] = float(base + steps[:, cols].sum())
                w = self._windows.get(job)
                if w is None:
                    w = self._windows[job] = CounterWindow([job[1]], self.rate_hz, self.keep_s)
                w.extend(ts, total[:, None])

    def sample(self, t: float) -> None:
        """One reading of every counter, now (the Python loop's tick; the C loop reads them
        itself and calls `add` per batch)."""
        own = self.descriptors()
        self.add([t], np.array([[read_u64(fd, off) for fd, off in own]],
                               dtype=np.int64).reshape(1, len(own)))

    def close(self) -> None:
        for o in self._open.values():
            os.close(o.fd)
        self._open.clear()
        self._order = []

    # --- agent loop --------------------------------------------------------------------------
    def counted(self, kind: str, job_id: str) -> int:
        """How many of the job's processes' counters of this kind are sampled now."""
        with self._lock:
            return self._counted.get((kind, job_id), 0)

    def rates(self, kind: str, job_id: str, since: float = -math.inf
              ) -> tuple[float, npt.NDArray[np.float64]]:
        """(start, bytes/s per interval) of the job's total, as CounterWindow.rates."""
        with self._lock:
            w = self._windows.get((kind, job_id))
        if w is None:
            return math.nan, np.zeros(0)
        return w.rates([job_id], since)

    def forget(self, live: set[str]) -> None:
        """Drop the windows of jobs that are gone (their files go with their processes)."""
        with self._lock:
            for key in [k for k in self._windows if k[1] not in live]:
                del self._windows[key]
                self._totals.pop(key, None)


def read_u64(fd: int, offset: int) -> int:
    """A per-job counter as the C loop reads it: its value, or -errno (-EIO: short)."""
    try:
        raw = os.pread(fd, 8, offset)
    except OSError as exc:
        return -(exc.errno or errno.EIO)
    if len(raw) != 8:
        return -errno.EIO
    v = int.from_bytes(raw, sys.byteorder)
    return v if v < 2**63 else -errno.EINVAL


def _carry_forward(a: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Each NaN replaced by the last finite value before it (NaN while there is none)."""
    idx = np.where(np.isfinite(a), np.arange(a.size), 0)
    np.maximum.accumulate(idx, out=idx)
    return a[idx]  # idx 0 with a[0] NaN: none yet, still NaN
