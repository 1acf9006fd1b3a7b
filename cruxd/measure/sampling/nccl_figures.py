"""A job's t_j and period from its processes' NCCL profiler records, when they are fresh.

The plugin's files (`<qp dir>/nccl-<pid>`, transport/nccl_records.py) are read at most every
READ_EVERY_S and pruned of processes that are gone. A file counts for a job only if it names
the job and its process is one of the job's registered pids or descends from one (`belongs`):
a record file only claims its job id. The figures are fresh while the job's newest burst
ended within max(STALE_S, 2 periods) of now: a job that stopped talking (evaluation, a
checkpoint, a hang) falls back to the NIC counters, which then see the same silence.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from cruxd.measure.collectives import Bursts, estimate
from cruxd.measure.comm import CommEstimate
from transport.nccl_records import NcclRecord, read_dir
from transport.pid_files import SkippedFiles

LOG = logging.getLogger(__name__)
SOURCE = "nvml+nccl"
READ_EVERY_S = 0.5
STALE_S = 2.0


class NcclFigures:
    def __init__(self, directory: Path, owners: Callable[[str], Iterable[int]],
                 belongs: Callable[[int, set[int]], bool],
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.directory, self.owners, self.belongs, self.clock = directory, owners, belongs, clock
        self.skips = SkippedFiles(LOG)
        self._records: list[NcclRecord] = []
        self._read_at = -float("inf")

    def records(self) -> list[NcclRecord]:
        now = time.monotonic()
        if now - self._read_at >= READ_EVERY_S:
            self._read_at = now
            self._records, problems = read_dir(self.directory, prune=True)
            self.skips.note("NCCL profiler records", problems)
        return self._records

    def job_records(self, job_id: str) -> list[NcclRecord]:
        mine = [r for r in self.records() if r.job_id == job_id]
        if not mine:
            return []
        owners = set(self.owners(job_id))
        return [r for r in mine if owners and self.belongs(r.pid, owners)]

    def estimate(self, job_id: str, since_s: float) -> CommEstimate | None:
        """The job's figures since `since_s` (time.monotonic), or None when it has no fresh
        records (no plugin, no bursts lately, or too few iterations to see a period)."""
        records = [r for r in self.job_records(job_id) if any(c.bursts.size for c in r.comms)]
        bursts = [Bursts(c.bursts["start_ns"], c.bursts["end_ns"], c.bursts["busy_ns"],
                         c.bursts["sent_bytes"], c.since_ns)
                  for r in records for c in r.comms if c.bursts.size]
        if not bursts:
            return None
        now = self.clock()
        newest = max(int(b.end_ns.max()) for b in bursts)
        # each file holds what happened up to its last write (at most 200 ms ago while the
        # job talks): a window to `now` would count the unwritten rest as idle
        end = min(now, *(r.written_ns for r in records))
        est = estimate(bursts, int(since_s * 1e9), end)
        if est is None or (now - newest) / 1e9 > max(STALE_S, 2 * est.period_s):
            return None
        return est
