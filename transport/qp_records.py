"""The QP records jobs' shims leave for the agent (layout: shim/crux_qps.h, docs/shim.md).

One file per job process in the records directory (default /run/crux/qps): which QPs it
connected, to which peer GID, and what it applied or why it applied nothing, and (version 2)
how much each QP sent: bytes and WRs posted and busy time, counted by the wrapper's
post_send/poll_cq trampolines, with the counts of the process's destroyed QPs kept in the
header. The agent reads them to report applied vs pending decisions and to attribute RDMA
traffic to jobs (job_bytes_posted), and removes the files of processes that are gone. Records
are read under their seqlock, like decision-table entries; the counters lie outside it (the
shim adds to them at any time: each is one aligned 64-bit word). A file that is not a records
file is skipped with a reason, never trusted; version 1 files read with the counters at 0.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from transport.decision_table import Decision
from transport.pid_files import scan
from transport.table_format import gid_text

MAGIC = 0x3153505158555243
VERSION = 2
VERSIONS = (1, 2)  # 1: the same layout, counters reserved (read as 0)
HEADER_SIZE = 192
RECORD_SIZE = 128
OUTCOMES = ("applied", "no-job", "no-table", "bad-table", "no-entry", "not-global",
            "sport-range", "records-full")
READ_TRIES = 1024
CAPACITY = 1024  # CRUX_QPS_CAPACITY: the shim's files are exactly this big
MAX_FILE = HEADER_SIZE + CAPACITY * RECORD_SIZE

_HEADER = struct.Struct("<QIIIIII8Q64sQ3Q")
_RECORD = struct.Struct("<IBBBBIIIIHBBBB2x16s32sQQQ3Q")
assert _HEADER.size == HEADER_SIZE and _RECORD.size == RECORD_SIZE
COUNTERS_OFFSET = 104  # struct crux_qps_record's counters: bytes_posted first
assert _RECORD.size - COUNTERS_OFFSET == 3 * 8


@dataclass(frozen=True)
class QpRecord:
    pid: int
    job_id: str
    device: str
    port: int
    sgid_index: int
    qpn: int
    dest_qpn: int
    peer: str  # IPv4 text for an IPv4-mapped GID, else IPv6 text
    outcome: str  # one of OUTCOMES
    sport: int  # decided source port, 0 = none
    flow_label: int  # what the NIC was given
    orig_flow_label: int
    traffic_class: int
    orig_traffic_class: int
    level: int
    dscp: int
    plan_generation: int
    table_generation: int
    created_ns: int
    # send-side traffic as posted (struct crux_qps_counters; 0 in a version 1 file):
    bytes_posted: int = 0  # SEND/RDMA_WRITE(+IMM) sg_list bytes; not RDMA_READ, atomics
    wrs_posted: int = 0  # every WR the provider accepted
    busy_ns: int = 0  # with signaled send WRs outstanding, up to the last completion polled
    slot: int = -1  # its index in the file (bytes_posted_offset), -1 where not read from one


@dataclass(frozen=True)
class Traffic:
    """Counters summed over QPs: one process's destroyed QPs, or a job's whole traffic."""
    bytes_posted: int = 0
    wrs_posted: int = 0
    busy_ns: int = 0


@dataclass(frozen=True)
class ProcessRecords:
    pid: int  # the writer's; read_dir gives it as the agent sees it (transport/pid_files.py)
    job_id: str
    counters: dict[str, int]  # intercepted connects by outcome
    calls: int
    qps: tuple[QpRecord, ...]
    retired: Traffic = Traffic()  # the process's destroyed QPs' counters
    file: str = ""  # its name in the directory; "" where not read from one
    owner_uid: int = -1  # the file's owner, as read (-1 where not read from a file)


class RecordsError(ValueError):
    """The file is not a records file this reader understands."""


def _record(buf: bytes | memoryview, off: int) -> tuple[Any, ...] | None:
    """One record under its seqlock; None if the writer kept it busy (skip it). A bytes copy
    cannot change under us: one try, so a file of busy records costs no retries."""
    for _ in range(1 if isinstance(buf, bytes) else READ_TRIES):
        seq = struct.unpack_from("<I", buf, off)[0]
        if seq & 1:
            continue
        fields = _RECORD.unpack_from(buf, off)
        if struct.unpack_from("<I", buf, off)[0] == seq:
            return fields
    return None


def parse(buf: bytes | memoryview) -> ProcessRecords:
    """The records in one file's bytes; RecordsError if they are not a records file."""
    if len(buf) < HEADER_SIZE:
        raise RecordsError(f"{len(buf)} bytes is shorter than the {HEADER_SIZE}-byte header")
    (magic, version, hsize, rsize, capacity, pid, used, *rest) = _HEADER.unpack_from(buf)
    counters, job_raw, calls, retired = rest[:8], rest[8], rest[9], rest[10:13]
    if magic != MAGIC:
        raise RecordsError(f"bad magic {magic:#x}")
    if version not in VERSIONS or (hsize, rsize) != (HEADER_SIZE, RECORD_SIZE):
        raise RecordsError(f"version {version}, sizes {hsize}/{rsize}: not understood")
    counted = version >= 2  # version 1: those bytes are reserved, whatever they hold
    if HEADER_SIZE + capacity * RECORD_SIZE > len(buf):
        raise RecordsError(f"capacity {capacity} does not fit in {len(buf)} bytes")
    job = job_raw.rstrip(b"\0").decode("utf-8", "replace")
    qps = []
    for i in range(min(used, capacity)):
        f = _record(buf, HEADER_SIZE + i * RECORD_SIZE)
        if f is None or f[1] != 1:
            continue
        (_, _, outcome, port, sgid, qpn, dqpn, ofl, fl, sport, otc, tc, level, dscp, dgid, dev,
         plan, tgen, created, *traffic) = f
        sent, wrs, busy = traffic[:3] if counted else (0, 0, 0)
        qps.append(QpRecord(
            pid, job, dev.rstrip(b"\0").decode("utf-8", "replace"), port, sgid, qpn, dqpn,
            gid_text(dgid), OUTCOMES[outcome] if outcome < len(OUTCOMES) else f"unknown-{outcome}",
            sport, fl, ofl, tc, otc, level, dscp, plan, tgen, created,
            sent, wrs, busy, i))
    return ProcessRecords(pid, job, dict(zip(OUTCOMES, counters, strict=True)), calls,
                          tuple(qps), Traffic(*retired) if counted else Traffic())


def read_dir(path: str | os.PathLike[str], *, prune: bool = False
             ) -> tuple[list[ProcessRecords], list[str]]:
    """(records of live processes, problems): the `<pid>` files only, as the TCP
    interposer's `sock-<pid>` files share the directory (transport/pid_files.py scans). Each
    process and its QPs carry its pid as the agent sees it."""
    records, problems = scan(path, "", MAX_FILE, parse, prune=prune)
    return [r if all(q.pid == r.pid for q in r.qps)
            else replace(r, qps=tuple(replace(q, pid=r.pid) for q in r.qps))
            for r in records], problems


def bytes_posted_offset(slot: int) -> int:
    """Where the `slot`th record's bytes_posted (a monotonic u64) sits in its file."""
    return HEADER_SIZE + slot * RECORD_SIZE + COUNTERS_OFFSET


def job_traffic(records: list[ProcessRecords], job_id: str) -> Traffic:
    """What `job_id`'s processes posted over all their QPs, live and destroyed: it only grows
    while the processes live, and drops when one exits (its file goes). A read that races a
    QP's destroy may miss that QP's counts once (crux_qps.h)."""
    b = w = n = 0
    for proc in records:
        if proc.job_id != job_id:
            continue
        b += proc.retired.bytes_posted + sum(q.bytes_posted for q in proc.qps)
        w += proc.retired.wrs_posted + sum(q.wrs_posted for q in proc.qps)
        n += proc.retired.busy_ns + sum(q.busy_ns for q in proc.qps)
    return Traffic(b, w, n)


def job_bytes_posted(records: list[ProcessRecords], job_id: str) -> int:
    """The bytes `job_id`'s processes posted on RDMA (job_traffic's bytes_posted)."""
    return job_traffic(records, job_id).bytes_posted


@dataclass(frozen=True)
class QpState:
    """A recorded QP against the decision that holds for it now."""
    qp: QpRecord
    state: str  # "applied", "pending" or "fail-open"
    want_sport: int
    want_traffic_class: int


def classify(records: list[ProcessRecords],
             decision: Callable[[str, str], Decision | None]) -> list[QpState]:
    """Each QP's state: `applied` when it carries the decision that holds now, `pending` when
    the decision differs from what it got at connect (a live RoCE QP keeps its path until it
    reconnects, unless the NIC can re-path it), `fail-open` when it got nothing and nothing is
    decided for it. `decision(job, peer)` is the current per-peer-else-job-wide decision."""
    out = []
    for proc in records:
        for q in proc.qps:
            d = decision(q.job_id, q.peer) if q.job_id else None
            want = (d.sport, d.traffic_class) if d is not None else (0, 0)
            if q.outcome == "applied":
                state = "applied" if d is not None and want == (q.sport, q.traffic_class) \
                    else "pending"
            else:
                state = "pending" if d is not None else "fail-open"
            out.append(QpState(q, state, *want))
    return out
