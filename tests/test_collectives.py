"""t_j and period from NCCL profiler bursts (cruxd/measure/collectives.py), and the record reader
(transport/nccl_records.py) on bytes it must refuse."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cruxd.measure.collectives import RESOLUTION_S, Bursts, estimate, occupancy
from transport import nccl_records as nr
from transport.pid_files import TornRead

T0 = 10**12  # CLOCK_MONOTONIC ns somewhere in a host's uptime


def periodic(period_s: float, shape: list[tuple[float, float]], seconds: float,
             shift_s: float = 0.0, sent: int = 1000) -> Bursts:
    """Bursts of a job that runs on past `seconds` (the window's end cuts an iteration)."""
    s, e = [], []
    for k in range(int(seconds / period_s) + 2):
        for off, dur in shape:
            a = T0 + int((k * period_s + off + shift_s) * 1e9)
            s.append(a)
            e.append(a + int(dur * 1e9))
    start, end = np.array(s, dtype=np.uint64), np.array(e, dtype=np.uint64)
    return Bursts(start, end, end - start, np.full(start.size, sent, dtype=np.uint64), T0)


def test_eight_ranks_of_one_job_count_once() -> None:
    """A job's ranks are on the wire together: their union, not their sum, is t_j."""
    ranks = [periodic(0.25, [(0.1, 0.04), (0.2, 0.02)], 12.0, shift_s=r * 0.0003)
             for r in range(8)]
    est = estimate(ranks, T0, T0 + int(12e9))
    assert est is not None
    assert est.period_s == pytest.approx(0.25, rel=1e-3)
    # each burst's union over the ranks is 2.1 ms longer than one rank's
    assert est.comm_s == pytest.approx(0.06 + 2 * 0.0021, rel=0.01)
    assert est.bytes_per_iter == pytest.approx(8 * 2 * 1000, rel=0.01)


def test_a_ring_that_dropped_old_bursts_cuts_the_window() -> None:
    b = periodic(0.2, [(0.05, 0.05)], 10.0)
    late = Bursts(b.start_ns, b.end_ns, b.busy_ns, b.sent_bytes, T0 + int(6e9))
    est = estimate([late], T0, T0 + int(10e9))
    assert est is not None and est.window_s == pytest.approx(4.0, abs=0.01)
    assert est.comm_s == pytest.approx(0.05, rel=0.01)


def test_nothing_to_go_on_gives_none() -> None:
    empty = Bursts(*(np.zeros(0, dtype=np.uint64) for _ in range(4)), T0)
    assert estimate([empty], T0, T0 + int(10e9)) is None
    one = periodic(5.0, [(1.0, 0.1)], 0.0)  # one burst before the window's end: no repetition
    assert estimate([one], T0, T0 + int(5e9)) is None


@settings(max_examples=60, deadline=None)
@given(period=st.floats(0.02, 1.0), duty=st.floats(0.05, 0.8), copies=st.integers(1, 4),
       seconds=st.floats(4.0, 12.0))
def test_period_and_t_j_of_any_on_off_job(period: float, duty: float, copies: int,
                                          seconds: float) -> None:
    seconds = max(seconds, 4 * period)
    b = periodic(period, [(0.0, duty * period)], seconds)
    est = estimate([b] * copies, T0, T0 + int(seconds * 1e9))
    assert est is not None
    assert est.period_s == pytest.approx(period, rel=0.01)
    # a cell per burst edge, and the period's own error (the whole periods counted end a
    # little early or late in a burst)
    assert est.comm_s == pytest.approx(duty * period, abs=2 * RESOLUTION_S + 0.01 * period)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 10**8), st.floats(0, 1)),
                max_size=60))
def test_occupancy_is_a_share_and_never_more_than_the_bursts(spans: list[tuple[int, int,
                                                                                float]]) -> None:
    s = np.array([T0 + a for a, _, _ in spans], dtype=np.uint64)
    e = s + np.array([d for _, d, _ in spans], dtype=np.uint64)
    busy = np.array([int(d * f) for _, d, f in spans], dtype=np.uint64)
    occ = occupancy([Bursts(s, e, busy, busy, T0)], T0, T0 + 2 * 10**9)
    assert ((occ >= 0) & (occ <= 1 + 1e-9)).all()
    assert occ.sum() * RESOLUTION_S <= sum(int(x) for x in busy) / 1e9 + 1e-6


def record_bytes(**patch: int) -> bytearray:
    """A valid file: one live communicator with two bursts; then `patch`ed header fields."""
    buf = bytearray(nr.SIZE)
    h = np.zeros(1, dtype=nr._HEADER)
    h["magic"], h["version"], h["header_size"] = nr.MAGIC, nr.VERSION, nr.HEADER_SIZE
    h["comm_size"], h["burst_size"], h["comms"] = nr.COMM_SIZE, nr.BURST_SIZE, nr.COMMS
    h["bursts"], h["pid"], h["job_id"], h["api_version"] = nr.BURSTS, 42, b"job", 6
    c = np.zeros(1, dtype=nr._COMM)
    c["state"], c["total"], c["comm_hash"], c["created_ns"] = nr.SLOT_LIVE, 3, 7, 1
    c["ring"][0, :3] = [(10, 20, 10, 1, 1, 1, 1), (30, 40, 20, 1, 1, 1, 1),  # busy > span
                        (50, 60, 5, 1, 1, 1, 1)]
    for k, v in patch.items():
        h[k] = v
    buf[:nr.HEADER_SIZE] = h.tobytes()
    buf[nr.HEADER_SIZE:nr.HEADER_SIZE + nr.COMM_SIZE] = c.tobytes()
    if "checksum" not in patch:
        h["checksum"] = nr.checksum(bytes(buf))
        buf[:nr.HEADER_SIZE] = h.tobytes()
    return buf


def test_the_reader_keeps_what_is_sound_and_drops_the_rest() -> None:
    rec = nr.parse(bytes(record_bytes()))
    assert (rec.pid, rec.job_id, rec.api_version) == (42, "job", 6)
    (comm,) = rec.comms
    assert comm.total == 3 and comm.bursts["start_ns"].tolist() == [10, 50]


@pytest.mark.parametrize("patch,error", [
    (dict(magic=1), "bad magic"), (dict(version=2), "not understood"),
    (dict(bursts=10**6), "not understood"), (dict(checksum=5), "checksum")])
def test_the_reader_refuses_what_it_does_not_understand(patch: dict[str, int],
                                                       error: str) -> None:
    with pytest.raises(ValueError, match=error) as info:
        nr.parse(bytes(record_bytes(**patch)))
    assert isinstance(info.value, TornRead) == (error == "checksum")
    with pytest.raises(nr.NcclRecordError, match="shorter"):
        nr.parse(bytes(record_bytes())[:1000])


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=512), st.integers(0, nr.SIZE - 1))
def test_garbage_is_refused_not_crashed_on(junk: bytes, at: int) -> None:
    buf = record_bytes()
    buf[at:at + len(junk)] = junk
    try:
        rec = nr.parse(bytes(buf[:nr.SIZE]))
    except ValueError:
        return
    for c in rec.comms:  # anything that passed is bounded and self-consistent
        assert c.bursts.size <= nr.BURSTS
        assert (c.bursts["end_ns"] >= c.bursts["start_ns"]).all()
