"""The TCP interposer's per-process record (layout: shim/crux_sockrec.h).

libcrux_sock.so counts every TCP connect it intercepts, by outcome, and the accepted
connections it gave a class, in `<qp dir>/sock-<pid>`, beside the verbs shim's QP records
(transport/qp_records.py). The agent sums them per job for `cruxctl status` and removes the
files of processes that are gone. Version 2 adds the payload bytes the process sent on those
connections (`bytes_sent`, at BYTES_SENT_OFFSET, which the agent's measurement samples alone:
cruxd/measure/sampling/job_bytes.py), the send calls, and the ports it listens on. A version 1
file (256 bytes) reads with those as 0 and empty.

The directory is world-writable and a job may be hostile: a file is opened without following
links and without blocking (a planted FIFO), must be a regular file, and only its first
SIZE bytes are read, with read(2): never mmap, which a job truncating its file would turn into
SIGBUS in the agent. Every size in it is checked against the constants here. Counters are
read without a lock: each is a monotonic u64, and a count that is one behind is harmless.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from transport.pid_files import read_untrusted, scan

MAGIC = 0x314B4F5358555243  # b"CRUXSOK1" as a little-endian u64
VERSION = 2
SIZE = 512
SIZES = {1: 256, 2: SIZE}  # what each version's record holds
COUNTERS = 16
LISTEN_PORTS = 16
BYTES_SENT_OFFSET = 240  # the u64 the agent samples per process
PREFIX = "sock-"
OUTCOMES = ("applied", "tos-only", "no-job", "no-table", "bad-table", "no-entry", "ports-busy")

# Both versions: magic, version, size, pid, outcomes, calls, job_id, counters[16],
# created_ns, accepts (accepts was reserved before it: an older writer leaves it 0)
_HEAD = struct.Struct(f"=QIIIIQ64s{COUNTERS}QQQ")
# version 1 ends in 16 reserved bytes; version 2 has there, and after them: bytes_sent,
# send_calls, listen_ports[16], reserved
_REC = struct.Struct(_HEAD.format + "16x")
_TAIL2 = struct.Struct(f"=QQ{LISTEN_PORTS}H224x")
assert _HEAD.size == BYTES_SENT_OFFSET and _REC.size == SIZES[1]
assert _HEAD.size + _TAIL2.size == SIZE


class SockRecordError(ValueError):
    """The bytes are not a counters file this reader understands."""


@dataclass(frozen=True)
class SockCounts:
    pid: int  # the writer's; read_dir gives it as the agent sees it (transport/pid_files.py)
    job_id: str  # "" when the process had no CRUX_JOB_ID
    counters: dict[str, int]  # counted connects by outcome (every name in OUTCOMES)
    calls: int
    created_ns: int
    accepts: int = 0  # accepted connections given their peer's class
    bytes_sent: int = 0  # payload bytes sent on its connected and accepted TCP connections
    send_calls: int = 0
    listen_ports: tuple[int, ...] = ()  # distinct TCP ports it listens on, in listen order
    version: int = VERSION
    file: str = ""  # its name in the directory; "" where not read from one
    owner_uid: int = -1  # the file's owner, as read (-1 where not read from a file)


def parse(buf: bytes) -> SockCounts:
    """One file's bytes; SockRecordError if they are not a record file."""
    if len(buf) < SIZES[1]:
        raise SockRecordError(f"{len(buf)} bytes is shorter than the {SIZES[1]}-byte record")
    magic, version, size, pid, outcomes, calls, job_raw, *rest = _HEAD.unpack_from(buf)
    counters, created, accepts = rest[:COUNTERS], rest[COUNTERS], rest[COUNTERS + 1]
    if magic != MAGIC:
        raise SockRecordError(f"bad magic {magic:#x}")
    if SIZES.get(version) != size:
        raise SockRecordError(f"version {version}, size {size}: not understood")
    if len(buf) < size:
        raise SockRecordError(f"{len(buf)} bytes is shorter than the {size}-byte record")
    if not 0 < outcomes <= COUNTERS:
        raise SockRecordError(f"{outcomes} outcomes do not fit {COUNTERS} counters")
    sent, sends, ports = 0, 0, ()
    if version >= 2:
        sent, sends, *slots = _TAIL2.unpack_from(buf, _HEAD.size)
        ports = tuple(dict.fromkeys(p for p in slots if p))  # the writer keeps them distinct
    # A newer writer may know more outcomes: they are summed in `calls`, not named here.
    job = job_raw.split(b"\0", 1)[0].decode("utf-8", "replace")
    return SockCounts(pid, job, dict(zip(OUTCOMES, counters, strict=False)), calls, created,
                      accepts, sent, sends, ports, version)


def read_file(path: Path) -> SockCounts:
    """Read and parse one file without trusting it (see the module doc)."""
    return parse(read_untrusted(path, SIZE))


def read_dir(path: str | os.PathLike[str], *, prune: bool = False,
             gone: list[SockCounts] | None = None) -> tuple[list[SockCounts], list[str]]:
    """(counters of live processes, problems) from the `sock-<pid>` files, each with its
    process's pid as the agent sees it; with prune, files of processes that are gone are
    removed, and `gone` collects what they said (transport/pid_files.py scans)."""
    return scan(path, PREFIX, SIZE, parse, prune=prune, gone=gone)


@dataclass(frozen=True)
class JobSockCounts:
    job_id: str
    processes: int
    counters: dict[str, int]
    calls: int
    accepts: int = 0
    bytes_sent: int = 0
    send_calls: int = 0
    listen_ports: tuple[int, ...] = ()  # over its processes, sorted


U64_MAX = (1 << 64) - 1  # the wire's uint64


def sat_sum(values: Iterable[int]) -> int:
    """A sum that stops at U64_MAX: records are written by the jobs, and two counters at
    2^64 - 1 summed past the wire's uint64 made `cruxctl status` fail (issue 37)."""
    return min(sum(values), U64_MAX)


def by_job(records: list[SockCounts]) -> list[JobSockCounts]:
    """The counters summed over each job's processes (saturating), ordered by job id."""
    out = []
    for job, recs in sorted(group_by_job(records).items()):
        counts = {k: sat_sum(r.counters.get(k, 0) for r in recs) for k in OUTCOMES}
        out.append(JobSockCounts(job, len(recs), counts, sat_sum(r.calls for r in recs),
                                 sat_sum(r.accepts for r in recs), job_bytes_sent(recs),
                                 sat_sum(r.send_calls for r in recs), job_listen_ports(recs)))
    return out


def group_by_job(records: list[SockCounts]) -> dict[str, list[SockCounts]]:
    jobs: dict[str, list[SockCounts]] = {}
    for r in records:
        jobs.setdefault(r.job_id, []).append(r)
    return jobs


def job_bytes_sent(records: list[SockCounts]) -> int:
    """The payload bytes one job's processes sent over TCP (their records, summed)."""
    return sat_sum(r.bytes_sent for r in records)


def job_listen_ports(records: list[SockCounts]) -> tuple[int, ...]:
    """The distinct TCP ports one job's processes listen on, sorted."""
    return tuple(sorted({p for r in records for p in r.listen_ports}))
