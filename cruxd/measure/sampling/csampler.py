"""The NIC counter loop in C (shim/agent/crux_sampler.c), for the agent's sampling thread.

At 100 Hz a Python thread's wakeups alone cost ~1.5 % of a core; the C loop sleeps on
absolute deadlines, reads the counters itself and hands back a batch of readings (one second's
worth by default), so the Python thread wakes once per batch (bench/measure.py has the
numbers). Descriptors, failure logging and reopening stay with `CounterReader`, as in the
Python loop: the two produce the same window from the same counters.

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
            _lib = lib
        return _lib


class BatchSampler:
    """Samples `counters` at `rate_hz` into a window, `batch_s` seconds per C call."""

    def __init__(self, counters: Sequence[Counter], rate_hz: float, reader: CounterReader,
                 batch_s: float = 1.0) -> None:
        if not counters:
            raise ValueError("no counters to sample")
        self.fn = load_library().crux_sample_batch
        self.counters, self.reader = list(counters), reader
        self.period_ns = round(1e9 / rate_hz)
        self.ticks = max(1, round(batch_s * rate_hz))
        n = len(self.counters)
        self._t = (ctypes.c_double * self.ticks)()
        self._values = (ctypes.c_int64 * (self.ticks * n))()
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
            got = self.fn((ctypes.c_int * n)(*fds), n, self.period_ns, ctypes.byref(deadline),
                          self.ticks, ctypes.byref(self._stop), self._t, self._values)
            if got < 0:
                raise OSError(-got, f"crux_sample_batch: {os.strerror(-got)}")
            if got:
                window.extend(self._t[:got], self._rows(got, open_errors))

    def _descriptors(self) -> tuple[list[int], dict[int, OSError]]:
        fds, errors = [], {}
        for k, c in enumerate(self.counters):
            try:
                fds.append(self.reader.fd(c))
            except OSError as exc:
                fds.append(-1)
                errors[k] = exc
        return fds, errors

    def _rows(self, got: int, open_errors: dict[int, OSError]
              ) -> npt.NDArray[np.float64]:
        raw = np.ctypeslib.as_array(self._values)[:got * len(self.counters)]
        raw = raw.reshape(got, len(self.counters))
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
