"""The NIC counter loop in C (shim/agent/crux_sampler.c), for the agent's sampling thread.

At 100 Hz a Python thread's wakeups alone cost ~1.5 % of a core; the C loop sleeps on
absolute deadlines, reads the counters itself and hands back a batch of readings (one second's
worth by default), so the Python thread wakes once per batch (bench/measure.py has the
numbers). Descriptors, failure logging and reopening stay with `CounterReader`, as in the
Python loop: the two produce the same window from the same counters.

The same loop reads the per-job byte counters (`JobBytes`, job_bytes.py): binary u64s in the
job processes' record files, whose set is refreshed once per batch.

`BatchSampler` raises `SamplerUnavailable` when the library is missing and cannot be built;
the agent then samples in Python.
"""

from __future__ import annotations

import ctypes
import errno
import math
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from cruxd.errors import CruxError
from cruxd.measure.sampling.job_bytes import JobBytes
from cruxd.measure.sampling.nic import Counter, CounterReader
from cruxd.measure.window import CounterWindow
from transport import native

_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


class SamplerUnavailable(CruxError, RuntimeError):
    """The C sampler cannot be loaded here; the message says why."""


def load_library(path: Path | None = None) -> ctypes.CDLL:
    global _lib
    with _lib_lock:
        if _lib is None:
            try:
                lib = ctypes.CDLL(str(path or native.library(native.SAMPLER)))
            except OSError as exc:
                raise SamplerUnavailable(str(exc)) from None
            i64p = ctypes.POINTER(ctypes.c_int64)
            fn = lib.crux_sample_batch
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_uint, ctypes.c_int64, i64p,
                           ctypes.c_uint, ctypes.POINTER(ctypes.c_int),
                           ctypes.POINTER(ctypes.c_double), i64p]
            try:
                at = lib.crux_sample_batch_at
            except AttributeError:  # a library built before it: a stale build, rebuild it
                raise SamplerUnavailable("crux_sample_batch_at missing: rebuild the "
                                         "sampler (make -C shim sampler)") from None
            at.restype = ctypes.c_int
            at.argtypes = [ctypes.POINTER(ctypes.c_int), i64p, ctypes.c_uint, ctypes.c_int64,
                           i64p, ctypes.c_uint, ctypes.POINTER(ctypes.c_int),
                           ctypes.POINTER(ctypes.c_double), i64p]
            _lib = lib
        return _lib


class BatchSampler:
    """Samples `counters` (and `job_bytes`' counters, if any) at `rate_hz` into a window,
    `batch_s` seconds per C call."""

    def __init__(self, counters: Sequence[Counter], rate_hz: float, reader: CounterReader,
                 batch_s: float = 1.0, job_bytes: JobBytes | None = None) -> None:
        if not counters and job_bytes is None:
            raise ValueError("no counters to sample")
        self.fn = load_library().crux_sample_batch_at
        self.counters, self.reader, self.job_bytes = list(counters), reader, job_bytes
        self.period_ns = round(1e9 / rate_hz)
        self.ticks = max(1, round(batch_s * rate_hz))
        self._t = (ctypes.c_double * self.ticks)()
        self._values = (ctypes.c_int64 * 0)()  # sized per batch: per-job counters come and go
        self._scale = np.array([c.scale for c in self.counters], dtype=float)
        self._stop = ctypes.c_int(0)  # read by the C loop every tick

    def stop(self) -> None:
        """End `run` within one tick (callable from any thread)."""
        self._stop.value = 1

    def run(self, window: CounterWindow, stop: threading.Event) -> None:
        """Sample until `stop` is set or `stop()` is called; closes nothing (the reader's
        descriptors belong to the caller)."""
        n = len(self.counters)
        deadline = ctypes.c_int64(0)
        while not stop.is_set() and not self._stop.value:
            fds, open_errors = self._descriptors()
            extra = self.job_bytes.descriptors() if self.job_bytes is not None else []
            width = n + len(extra)
            if len(self._values) < self.ticks * width:
                self._values = (ctypes.c_int64 * (self.ticks * width))()
            offsets = [-1] * n + [off for _, off in extra]
            got = self.fn((ctypes.c_int * width)(*fds, *(fd for fd, _ in extra)),
                          (ctypes.c_int64 * width)(*offsets), width, self.period_ns,
                          ctypes.byref(deadline), self.ticks, ctypes.byref(self._stop),
                          self._t, self._values)
            if got < 0:
                raise OSError(-got, f"crux_sample_batch_at: {os.strerror(-got)}")
            if not got:
                continue
            raw = np.ctypeslib.as_array(self._values)[:got * width].reshape(got, width)
            if n:
                window.extend(self._t[:got], self._rows(raw[:, :n], open_errors))
            if self.job_bytes is not None and extra:
                self.job_bytes.add(self._t[:got], raw[:, n:].copy())

    def _descriptors(self) -> tuple[list[int], dict[int, OSError]]:
        fds, errors = [], {}
        for k, c in enumerate(self.counters):
            try:
                fds.append(self.reader.fd(c))
            except OSError as exc:
                fds.append(-1)
                errors[k] = exc
        return fds, errors

    def _rows(self, raw: npt.NDArray[np.int64], open_errors: dict[int, OSError]
              ) -> npt.NDArray[np.float64]:
        bad = raw < 0
        for k, c in enumerate(self.counters):
            failed = int(bad[:, k].sum())
            if not failed:
                self.reader.success(c)
                continue
            code = -int(raw[bad[:, k], k][0])
            exc = open_errors.get(k) or OSError(code, os.strerror(code) if code != errno.EINVAL
                                                else "not a number")
            self.reader.failure(c, exc, failed)
        return np.where(bad, math.nan, raw * self._scale)
