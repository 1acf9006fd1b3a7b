"""The C counter loop (shim/agent/crux_sampler.c) through its binding: readings and their scale,
deadlines, failures that recover, early stop, and bad arguments. Counter files are regular
files here; sysfs files answer pread at offset 0 the same way (the agent rig reads real ones)."""

from __future__ import annotations

import ctypes
import errno
import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from cruxd.measure.sampling.csampler import BatchSampler, SamplerUnavailable, load_library
from cruxd.measure.sampling.nic import Counter, CounterReader
from cruxd.measure.window import CounterWindow

try:
    load_library()
except SamplerUnavailable as exc:
    pytest.skip(f"C sampler unavailable: {exc}", allow_module_level=True)

WIDTH = 24  # counters are rewritten in place at a fixed width, so no read sees a short file


def write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, text.rjust(WIDTH - 1).encode() + b"\n", 0)
    finally:
        os.close(fd)


def counters(tmp_path: Path) -> list[Counter]:
    out = []
    for name, scale in (("net:eth0", 1), ("rdma:mlx5_0/1", 4)):
        f = tmp_path / name.replace(":", "_").replace("/", "_")
        f.write_text("0".rjust(WIDTH - 1) + "\n")
        out.append(Counter(name, f, scale))
    return out


@contextmanager
def sampling(cs: list[Counter], rate_hz: float = 200.0
             ) -> Iterator[tuple[CounterWindow, CounterReader, BatchSampler]]:
    window = CounterWindow([c.name for c in cs], rate_hz, 30)
    reader = CounterReader()
    sampler = BatchSampler(cs, rate_hz, reader, batch_s=0.05)
    stop = threading.Event()
    th = threading.Thread(target=sampler.run, args=(window, stop))
    th.start()
    try:
        yield window, reader, sampler
    finally:
        stop.set()
        sampler.stop()
        th.join(timeout=5)
        reader.close()
    assert not th.is_alive()


def wait_for_rows(window: CounterWindow, n: int) -> None:
    deadline = time.monotonic() + 10
    while len(window) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(window) >= n


def test_readings_are_scaled_and_on_the_grid(tmp_path: Path) -> None:
    cs = counters(tmp_path)
    with sampling(cs) as (window, reader, _):
        wait_for_rows(window, 10)
        write(cs[0].path, "1000")
        write(cs[1].path, "250")  # IB data counters count 4-byte words
        n = len(window)
        wait_for_rows(window, n + 10)
    start, eth = window.rates(["net:eth0"])
    _, ib = window.rates(["rdma:mlx5_0/1"])
    lo, _hi = window.span() or (0.0, 0.0)
    assert start == lo
    assert reader.failed == 0 and not reader.failing
    assert window._readings[-1][1] == (1000.0, 1000.0)  # IB words x 4
    # each write shows up as one interval's rate, and nowhere else
    assert np.isfinite(eth).all() and np.isfinite(ib).all()
    assert np.count_nonzero(eth) == 1 and np.count_nonzero(ib) == 1


def test_a_failing_counter_reads_nan_is_logged_once_and_recovers(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cs = counters(tmp_path)
    with sampling(cs) as (window, reader, _):
        wait_for_rows(window, 5)
        write(cs[0].path, "garbage")
        n = len(window)
        wait_for_rows(window, n + 20)
        assert "net:eth0" in reader.failing and reader.failed >= 10
        write(cs[0].path, "7")
        n = len(window)
        wait_for_rows(window, n + 20)
        assert not reader.failing
    _, eth = window.rates(["net:eth0"])
    _, ib = window.rates(["rdma:mlx5_0/1"])
    assert np.isnan(eth).sum() >= 10 and np.isfinite(eth[-5:]).all()
    assert np.isfinite(ib).all()  # the other counter is unaffected
    warnings = [r for r in caplog.records if "cannot read" in r.getMessage()]
    assert len(warnings) == 1 and "not a number" in warnings[0].getMessage()


def test_a_missing_file_names_the_open_error(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    cs = counters(tmp_path)
    gone = Counter("net:gone", tmp_path / "missing", 1)
    with sampling([cs[0], gone]) as (window, reader, _):
        wait_for_rows(window, 5)
    _, r = window.rates(["net:gone"])
    assert np.isnan(r).all() and reader.failing == {"net:gone"}
    assert any("No such file" in r.getMessage() for r in caplog.records)


def test_stop_ends_a_long_batch_within_a_tick(tmp_path: Path) -> None:
    cs = counters(tmp_path)
    reader = CounterReader()
    sampler = BatchSampler(cs, 100.0, reader, batch_s=60)
    window = CounterWindow([c.name for c in cs], 100.0, 120)
    th = threading.Thread(target=sampler.run, args=(window, threading.Event()))
    th.start()
    time.sleep(0.2)
    sampler.stop()
    th.join(timeout=5)
    assert not th.is_alive()  # the batch alone would have run for 60 s
    assert 0 < len(window) < 6000
    reader.close()


def test_bad_arguments_are_refused() -> None:
    fn = load_library().crux_sample_batch
    deadline, stop = ctypes.c_int64(0), ctypes.c_int(0)
    t = (ctypes.c_double * 1)()
    values = (ctypes.c_int64 * 1)()
    fds = (ctypes.c_int * 1)(-1)
    assert fn(fds, 1, 0, ctypes.byref(deadline), 1, ctypes.byref(stop), t, values) == \
        -errno.EINVAL
    assert fn(fds, 1, 1_000_000, None, 1, ctypes.byref(stop), t, values) == -errno.EINVAL
    # a closed descriptor is a failed reading, not a crash
    assert fn(fds, 1, 1_000_000, ctypes.byref(deadline), 1, ctypes.byref(stop), t,
              values) == 1
    assert values[0] == -errno.EBADF and not math.isnan(t[0])
