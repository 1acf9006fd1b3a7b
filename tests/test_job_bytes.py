"""Per-job byte counters (cruxd/measure/sampling/job_bytes.py): the C loop's binary reads, the
files found, attributed and read without trust, the per-job totals (baselines, resets, gaps,
processes that go), and the agent measuring each of two jobs on one host from its own bytes
while its only job keeps the NIC counters."""

from __future__ import annotations

import ctypes
import errno
import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cruxd.agent.measuring import LiveMeasurement
from cruxd.agent.process_tree import belongs
from cruxd.control.records import HostPlan, JobAssignment, JobState, LocalJob, Measurement
from cruxd.measure.sampling.csampler import BatchSampler, SamplerUnavailable, load_library
from cruxd.measure.sampling.job_bytes import JobBytes, SockBytesSource, read_u64
from cruxd.measure.sampling.nic import CounterReader
from cruxd.measure.window import CounterWindow
from tests.test_live_measurement import FIXTURE, bursts, config, feed
from tests.test_sock_bytes import golden
from transport.sock_records import BYTES_SENT_OFFSET


def c_sampler() -> None:
    try:
        load_library()
    except SamplerUnavailable as exc:
        pytest.skip(f"C sampler unavailable: {exc}")


@pytest.fixture
def other_pid() -> Iterator[int]:
    """A live process of ours that is not this one (a second job's process)."""
    p = subprocess.Popen(["sleep", "600"])
    yield p.pid
    p.kill()
    p.wait()


def record(d: Path, pid: int, job: str, sent: int, created: int = 123) -> Path:
    raw = bytearray(golden(pid=pid, sent=sent))
    raw[32:96] = job.encode().ljust(64, b"\0")
    raw[224:232] = created.to_bytes(8, "little")
    path = d / f"sock-{pid}"
    path.write_bytes(bytes(raw))
    return path


def set_sent(path: Path, sent: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, sent.to_bytes(8, "little"), BYTES_SENT_OFFSET)
    finally:
        os.close(fd)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_the_c_loop_reads_binary_counters_beside_text_ones(tmp_path: Path) -> None:
    c_sampler()
    text, binary, short = tmp_path / "t", tmp_path / "b", tmp_path / "s"
    text.write_text("42\n")
    binary.write_bytes(golden(sent=2**40 + 5))
    short.write_bytes(b"\0" * 244)  # the counter is cut in half: a truncated file
    fds = [os.open(p, os.O_RDONLY) for p in (text, binary, short)]
    try:
        n, ticks = 3, 2
        values = (ctypes.c_int64 * (n * ticks))()
        t = (ctypes.c_double * ticks)()
        got = load_library().crux_sample_batch_at(
            (ctypes.c_int * n)(*fds), (ctypes.c_int64 * n)(-1, BYTES_SENT_OFFSET,
                                                           BYTES_SENT_OFFSET),
            n, 1_000_000, ctypes.byref(ctypes.c_int64(0)), ticks,
            ctypes.byref(ctypes.c_int(0)), t, values)
        assert got == ticks
        assert list(values) == [42, 2**40 + 5, -errno.EIO] * ticks
        assert read_u64(fds[1], BYTES_SENT_OFFSET) == 2**40 + 5
        assert read_u64(fds[2], BYTES_SENT_OFFSET) == -errno.EIO
    finally:
        for fd in fds:
            os.close(fd)


def test_files_are_attributed_to_registered_processes_only(tmp_path: Path) -> None:
    me, parent = os.getpid(), os.getppid()
    record(tmp_path, me, "a", 1000)
    record(tmp_path, parent, "a", 50)  # claims job a: not one of its processes, nor a child
    os.mkfifo(tmp_path / "sock-5")
    (tmp_path / "sock-6").symlink_to(tmp_path / f"sock-{me}")
    owners = {"a": {me}}
    jb = JobBytes([SockBytesSource(tmp_path)], 100.0, 10.0, lambda j: owners.get(j, ()),
                  belongs, Clock())
    try:
        assert len(jb.descriptors()) == 1 and jb.counted("sock", "a") == 1
        assert jb.skips.count == 2  # the FIFO and the link, never opened
        assert jb.counted("sock", "b") == 0 and jb.counted("qp", "a") == 0
    finally:
        jb.close()


def test_totals_baseline_reset_gap_and_a_process_that_goes(tmp_path: Path,
                                                           other_pid: int) -> None:
    me, clock = os.getpid(), Clock()
    mine = record(tmp_path, me, "a", 10_000)
    jb = JobBytes([SockBytesSource(tmp_path)], 10.0, 100.0, lambda j: {me, other_pid},
                  belongs, clock)
    try:
        jb.sample(0.0)  # the first reading is the baseline: 10 kB before it count nothing
        set_sent(mine, 10_500)
        jb.sample(0.1)
        other = record(tmp_path, other_pid, "a", 7_000)  # found at the next rescan
        clock.t += 1.0
        jb.sample(0.2)
        assert jb.counted("sock", "a") == 2
        set_sent(mine, 11_000)
        set_sent(other, 7_300)
        jb.sample(0.3)  # both add: 500 + 300
        set_sent(mine, 0)  # went backwards (recreated?): nothing for that interval
        jb.sample(0.4)
        set_sent(mine, 100)
        jb.sample(0.5)
        other.unlink()  # the process is gone: its bytes stay in the total
        clock.t += 1.0
        jb.sample(0.6)
        _, r = jb.rates("sock", "a")
        np.testing.assert_allclose(r, [5000, 0, 8000, 0, 1000, 0])
        # a failed reading is a gap; the bytes come back at the next good one
        w = jb._windows[("sock", "a")]
        jb.add([0.7, 0.8, 0.9], np.array([[-errno.EIO], [300], [400]], dtype=np.int64))
        _, r = w.rates(["a"], since=0.6)
        assert math.isnan(r[0]) and math.isnan(r[1]) and r[2] == pytest.approx(1000)
        jb.forget({"b"})
        assert jb.rates("sock", "a")[1].size == 0
    finally:
        jb.close()


def test_the_c_loop_samples_job_totals(tmp_path: Path) -> None:
    c_sampler()
    me = os.getpid()
    mine = record(tmp_path, me, "a", 0)
    jb = JobBytes([SockBytesSource(tmp_path)], 200.0, 30.0, lambda j: {me}, belongs)
    sampler = BatchSampler([], 200.0, CounterReader(), batch_s=0.05, job_bytes=jb)
    stop = threading.Event()
    th = threading.Thread(target=sampler.run, args=(CounterWindow(["none"], 200.0, 30), stop))
    th.start()
    try:
        deadline = time.monotonic() + 10
        while jb.rates("sock", "a")[1].size < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # the baseline is read: what is sent from now on counts
        sent = 0
        while time.monotonic() < deadline and sent < 4000:
            sent += 1000
            set_sent(mine, sent)
            time.sleep(0.05)
        time.sleep(0.2)
    finally:
        stop.set()
        sampler.stop()
        th.join(timeout=5)
        jb.close()
    t, v = jb._windows[("sock", "a")]._since(-math.inf)
    assert len(t) > 10 and np.all(np.diff(v[:, 0]) >= 0) and v[-1, 0] - v[0, 0] == sent
    assert np.all(np.diff(t) > 0)


def plan(*jobs: tuple[str, JobState]) -> HostPlan:
    return HostPlan("h0", 1, 0, 4, tuple(JobAssignment(j, s, level=3, dscp=46)
                                         for j, s in jobs))


def test_two_jobs_on_one_host_are_measured_from_their_own_bytes(tmp_path: Path,
                                                                other_pid: int) -> None:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURE, root)
    qps = tmp_path / "qps"
    qps.mkdir()
    me = os.getpid()
    record(qps, me, "a", 0)
    record(qps, other_pid, "b", 0)
    owners = {"a": (me,), "b": (other_pid,)}
    jobs = [2]
    m = LiveMeasurement(config(root), (), lambda j: owners.get(j, ()), lambda: [],
                        lambda: jobs[0], job_sources=[SockBytesSource(qps)])
    assert m.job_bytes is not None
    n, hz = 1000, 100.0
    series = {"a": bursts(n, hz, 0.5, 0.15, 1e6), "b": bursts(n, hz, 0.3, 0.06, 3e6)}
    # the NIC sees both jobs at once
    feed(m, {"net:eth0": series["a"] + series["b"]})
    m.job_bytes.descriptors()
    cum = np.cumsum(np.stack([series["a"], series["b"]], axis=1) / hz, axis=0)
    raw = np.concatenate([[[0, 0]], cum]).astype(np.int64)
    now = time.monotonic()
    order = [o.counter.job_id for o in m.job_bytes._order]
    raw = raw[:, [["a", "b"].index(j) for j in order]]
    m.job_bytes.add([now - (n - i) / hz for i in range(n + 1)], raw)
    m.plan_changed(plan(("a", JobState.PROFILING), ("b", JobState.PROFILING)))
    for t in m.tracks.values():
        t.profiling_since = time.monotonic() - 20
    got = {j: m.measure(LocalJob(j, 1), Measurement()) for j in ("a", "b")}
    m.job_bytes.close()
    assert got["a"].source == got["b"].source == "nvml+sock"
    assert got["a"].period_s == pytest.approx(0.5, rel=0.02)
    assert got["a"].comm_s == pytest.approx(0.15, rel=0.1)
    assert got["b"].period_s == pytest.approx(0.3, rel=0.02)
    assert got["b"].comm_s == pytest.approx(0.06, rel=0.1)
    # the host's only job keeps the NIC counters (here: the mix, whatever it shows)
    jobs[0] = 1
    assert m.job_source("a") == "nic"
    for t in m.tracks.values():
        t.at = -math.inf
    m.estimate("a")
    assert m.tracks["a"].counters == ("net:eth0",)
