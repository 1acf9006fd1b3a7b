"""The TCP interposer's per-process connect counters (layout: shim/crux_sockrec.h).

libcrux_sock.so counts every TCP connect it intercepts, by outcome, and the accepted
connections it gave a class, in `<qp dir>/sock-<pid>`,
beside the verbs shim's QP records (transport/qp_records.py). The agent sums them per job for
`cruxctl status` and removes the files of processes that are gone.

The directory is world-writable and a job may be hostile: a file is opened without following
links and without blocking (a planted FIFO), must be a regular file, and only its first
SIZE bytes are read, with read(2): never mmap, which a job truncating its file would turn into
SIGBUS in the agent. Every size in it is checked against the constants here. Counters are
read without a lock: each is a monotonic u64, and a count that is one behind is harmless.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from transport.pid_files import read_untrusted, scan

MAGIC = 0x314B4F5358555243  # b"CRUXSOK1" as a little-endian u64
VERSION = 1
SIZE = 256
COUNTERS = 16
PREFIX = "sock-"
OUTCOMES = ("applied", "tos-only", "no-job", "no-table", "bad-table", "no-entry", "ports-busy")

# magic, version, size, pid, outcomes, calls, job_id, counters[16], created_ns, accepts,
# reserved (accepts was reserved before: an older writer leaves it 0)
_REC = struct.Struct(f"=QIIIIQ64s{COUNTERS}QQQ16x")
assert _REC.size == SIZE


class SockRecordError(ValueError):
    """The bytes are not a counters file this reader understands."""


@dataclass(frozen=True)
class SockCounts:
    pid: int
    job_id: str  # "" when the process had no CRUX_JOB_ID
    counters: dict[str, int]  # counted connects by outcome (every name in OUTCOMES)
    calls: int
    created_ns: int
    accepts: int = 0  # accepted connections given their peer's class


def parse(buf: bytes) -> SockCounts:
    """One file's bytes; SockRecordError if they are not a counters file."""
    if len(buf) < SIZE:
        raise SockRecordError(f"{len(buf)} bytes is shorter than the {SIZE}-byte record")
    magic, version, size, pid, outcomes, calls, job_raw, *rest = _REC.unpack_from(buf)
    counters, created, accepts = rest[:COUNTERS], rest[COUNTERS], rest[COUNTERS + 1]
    if magic != MAGIC:
        raise SockRecordError(f"bad magic {magic:#x}")
    if (version, size) != (VERSION, SIZE):
        raise SockRecordError(f"version {version}, size {size}: not understood")
    if not 0 < outcomes <= COUNTERS:
        raise SockRecordError(f"{outcomes} outcomes do not fit {COUNTERS} counters")
    # A newer writer may know more outcomes: they are summed in `calls`, not named here.
    job = job_raw.split(b"\0", 1)[0].decode("utf-8", "replace")
    return SockCounts(pid, job, dict(zip(OUTCOMES, counters, strict=False)), calls, created,
                      accepts)


def read_file(path: Path) -> SockCounts:
    """Read and parse one file without trusting it (see the module doc)."""
    return parse(read_untrusted(path, SIZE))


def read_dir(path: str | os.PathLike[str], *, prune: bool = False,
             gone: list[SockCounts] | None = None) -> tuple[list[SockCounts], list[str]]:
    """(counters of live processes, problems) from the `sock-<pid>` files; with prune, files
    of processes that are gone are removed, and `gone` collects what they said
    (transport/pid_files.py scans)."""
    return scan(path, PREFIX, SIZE, parse, prune=prune, gone=gone)


@dataclass(frozen=True)
class JobSockCounts:
    job_id: str
    processes: int
    counters: dict[str, int]
    calls: int
    accepts: int = 0


def by_job(records: list[SockCounts]) -> list[JobSockCounts]:
    """The counters summed over each job's processes, ordered by job id."""
    jobs: dict[str, tuple[int, dict[str, int], int, int]] = {}
    for r in records:
        n, counts, calls, acc = jobs.get(r.job_id, (0, dict.fromkeys(OUTCOMES, 0), 0, 0))
        for k, v in r.counters.items():
            counts[k] += v
        jobs[r.job_id] = (n + 1, counts, calls + r.calls, acc + r.accepts)
    return [JobSockCounts(job, n, counts, calls, acc)
            for job, (n, counts, calls, acc) in sorted(jobs.items())]
