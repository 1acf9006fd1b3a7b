"""Per-QP traffic counters (shim/crux_qps.h version 2) without a NIC, and their layout.

tests/c/gate_drive.c gives the wrapper's trampolines (shim/crux_gate.c) a fake device context
whose ops table they swap as they would a provider's, and, with a records file, writes each QP's
record and hands its counters to the gate as the wrapper does at connect. The counts are read
back through transport/qp_records.py, the agent's reader: the C writer and the Python reader
are checked against each other, and the layout against bytes written out by hand. A real RDMA
transfer through the wrapper: tests/test_rdma.py.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cbuild import build
from tests.test_pcie_gate import LINK, Drive, drives
from tests.test_pcie_links import GATE_SOURCES
from transport.pcie import PcieLocks
from transport.pcie_links import DeviceLink
from transport.qp_records import (
    MAGIC,
    ProcessRecords,
    QpRecord,
    RecordsError,
    Traffic,
    job_bytes_posted,
    job_traffic,
    parse,
)

DriveFactory = Callable[..., Drive]


@pytest.fixture(scope="module")
def prog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("cbin"), "gate_drive", GATE_SOURCES, "-pthread")


@pytest.fixture
def rig(prog: Path, tmp_path: Path) -> Iterator[DriveFactory]:
    """The drivers' device (mlx5_0) on link LINK; records=PATH makes a driver count."""
    yield from drives(prog, tmp_path, (DeviceLink("mlx5_0", LINK, None),))


def read(path: Path) -> ProcessRecords:
    return parse(path.read_bytes())


def qp(path: Path, qpn: int) -> QpRecord:
    (q,) = [q for q in read(path).qps if q.qpn == qpn]
    return q


def counts(path: Path, qpn: int) -> tuple[int, int]:
    q = qp(path, qpn)
    return q.bytes_posted, q.wrs_posted


def test_bytes_by_opcode_on_a_context_that_is_not_gated(rig: DriveFactory,
                                                        tmp_path: Path) -> None:
    rec = tmp_path / "records"
    d = rig(-1, records=rec)  # no level: not gated, but a job id, so counted
    d("qp 0")
    d.send("ops")
    assert d.answer() == "ok swapped"
    d("post 0 2 1 1000")  # a chain of 3 RDMA WRITEs of 1000 bytes (two SGEs each)
    assert counts(rec, 100) == (3000, 3)
    for op in ("send", "send-imm", "write-imm"):
        d(f"post 0 1 0 7 {op}")
    assert counts(rec, 100) == (3021, 6)
    d("post 0 2 0 4096 read", "post 0 1 0 8 atomic")  # WRs, but no bytes leave this NIC
    assert counts(rec, 100) == (3021, 9)
    assert d.stats()["contexts"]["no-level"] == 1  # type: ignore[index]


def test_the_ops_stay_the_providers_without_counting_or_gating(rig: DriveFactory) -> None:
    d = rig(-1)  # no records file: the wrapper without a job id (or CRUX_QP_COUNTERS=off)
    d("qp 0")
    d.send("ops")
    assert d.answer() == "ok provider"
    counted = rig(-1, records=Path(d.log).with_suffix(".rec"))
    counted("qp 0")
    counted.send("ops")
    assert counted.answer() == "ok swapped"


def test_refused_wrs_are_not_counted(rig: DriveFactory, tmp_path: Path) -> None:
    rec = tmp_path / "records"
    d = rig(-1, records=rec)
    d("qp 0", "fail 0 3 100")  # the provider refuses every WR
    assert counts(rec, 100) == (0, 0)
    d("partial 0 3 100")  # ... the first accepted, the two after it refused
    assert counts(rec, 100) == (100, 1)


def test_busy_time_runs_from_the_idle_post_to_each_completion(rig: DriveFactory,
                                                              tmp_path: Path) -> None:
    """Containment, not speed: busy time covers the sleep between a post and its completion
    and never exceeds the time from before the post to after the completion."""
    rec = tmp_path / "records"
    d = rig(-1, records=rec)
    d("qp 0")
    t0 = time.monotonic_ns()
    d("post 0 2")
    time.sleep(0.05)
    d("done 0 1")  # one of two completed: still busy, and counted so far
    mid = time.monotonic_ns()
    first = qp(rec, 100).busy_ns
    assert 50_000_000 <= first <= mid - t0
    time.sleep(0.05)
    d("done 0 1")
    t1 = time.monotonic_ns()
    busy = qp(rec, 100).busy_ns
    assert first + 50_000_000 <= busy <= t1 - t0
    d("post 0 0 3")  # unsignaled only: no completion will end it, so it starts no busy span
    time.sleep(0.02)
    d("done 0 1")  # a stray completion (clamped: nothing outstanding)
    assert qp(rec, 100).busy_ns == busy
    d("post 0 1", "err 0 1")  # an error completion ends the span too
    assert qp(rec, 100).busy_ns > busy


def test_destroyed_qps_move_to_the_header_and_the_job_total_holds(rig: DriveFactory,
                                                                  tmp_path: Path) -> None:
    rec = tmp_path / "records"
    d = rig(-1, records=rec)
    d("qp 0", "qp 1", "post 0 3 0 500", "post 1 1 0 64 send", "done 0 3")
    before = read(rec)
    busy0 = qp(rec, 100).busy_ns
    assert job_traffic([before], "drive") == Traffic(1564, 4, busy0 + qp(rec, 101).busy_ns)
    d("destroy 0")
    after = read(rec)
    assert [q.qpn for q in after.qps] == [101]
    assert after.retired == Traffic(1500, 3, busy0)
    assert job_bytes_posted([after], "drive") == job_bytes_posted([before], "drive") == 1564
    d("qp 2")  # takes the freed slot: counts from zero
    assert counts(rec, 102) == (0, 0)
    d("post 2 1 0 10")
    assert job_bytes_posted([read(rec)], "drive") == 1574


def test_many_threads_on_shared_and_own_qps_count_exactly(rig: DriveFactory,
                                                          tmp_path: Path) -> None:
    rec = tmp_path / "records"
    d = rig(-1, records=rec)
    d(*(f"qp {n}" for n in range(5)))
    d("threads 4 20000 64")  # each: 20000 WRITEs on QP 0 and 20000 SENDs on its own QP
    assert counts(rec, 100) == (4 * 20000 * 64, 4 * 20000)
    assert [counts(rec, 101 + t) for t in range(4)] == [(20000 * 64, 20000)] * 4


def test_a_gated_qp_is_gated_and_counted(rig: DriveFactory, tmp_path: Path) -> None:
    rec = tmp_path / "records"
    d = rig(3, records=rec)
    with PcieLocks.open(tmp_path / "pcie") as sem:
        d("qp 0", "post 0 2 0 300")
        assert sem.stats(LINK).holder_pid == d.pid
        d("done 0 2")
        assert sem.stats(LINK).holder_pid == 0
    assert counts(rec, 100) == (600, 2) and qp(rec, 100).busy_ns > 0


def test_job_bytes_sum_the_jobs_processes_only(rig: DriveFactory, tmp_path: Path) -> None:
    a, b = rig(-1, records=tmp_path / "a"), rig(-1, records=tmp_path / "b")
    a("qp 0", "post 0 1 0 1000")
    b("qp 0", "qp 1", "post 0 1 0 20", "post 1 1 0 300", "destroy 1")
    other = ProcessRecords(1, "other", {}, 0, (), Traffic(5, 1, 0))
    procs = [read(tmp_path / "a"), read(tmp_path / "b"), other]
    assert job_bytes_posted(procs, "drive") == 1320
    assert job_bytes_posted(procs, "other") == 5 and job_bytes_posted(procs, "none") == 0


# --- the layout, from bytes written out by hand (shim/crux_qps.h) -------------------------

def golden(version: int) -> bytes:
    head = bytearray(192)
    struct.pack_into("<QIIIIII", head, 0, MAGIC, version, 192, 128, 1, 4242, 1)
    head[96:99] = b"job"
    struct.pack_into("<QQQ", head, 168, 11, 2, 333)  # retired: bytes, WRs, busy ns
    rec = bytearray(128)
    struct.pack_into("<IB", rec, 0, 2, 1)  # seq even, live
    struct.pack_into("<I", rec, 8, 77)  # qpn
    rec[48:54] = b"mlx5_0"
    struct.pack_into("<QQQ", rec, 104, 1 << 40, 12345, 999)  # bytes, WRs, busy ns
    return bytes(head + rec)


@pytest.mark.skipif(struct.pack("=I", 1) != struct.pack("<I", 1), reason="golden bytes are LE")
def test_golden_bytes() -> None:
    v2 = parse(golden(2))
    (q,) = v2.qps
    assert (q.qpn, q.device, q.bytes_posted, q.wrs_posted, q.busy_ns) == (
        77, "mlx5_0", 1 << 40, 12345, 999)
    assert v2.retired == Traffic(11, 2, 333) and v2.job_id == "job"
    v1 = parse(golden(1))  # the same bytes were reserved in version 1: never counters
    assert (v1.qps[0].qpn, v1.qps[0].bytes_posted, v1.qps[0].busy_ns) == (77, 0, 0)
    assert v1.retired == Traffic()
    with pytest.raises(RecordsError, match="version 3"):
        parse(golden(3))


@pytest.mark.skipif(struct.pack("=I", 1) != struct.pack("<I", 1), reason="golden bytes are LE")
def test_the_agents_qp_source_points_at_each_live_qps_bytes(tmp_path: Path) -> None:
    """QpBytesSource hands the NIC loop (file, offset) pairs: the offset of each live QP's
    bytes_posted, which the loop preads as a u64."""
    import os

    from cruxd.measure.sampling.job_bytes import QpBytesSource

    data = bytearray(golden(2))
    struct.pack_into("<I", data, 24, os.getpid())  # a live process: this one
    (tmp_path / str(os.getpid())).write_bytes(bytes(data))
    (c,), problems = QpBytesSource(tmp_path).counters()
    assert problems == [] and (c.job_id, c.pid) == ("job", os.getpid())
    assert struct.unpack_from("<Q", c.path.read_bytes(), c.offset)[0] == 1 << 40
