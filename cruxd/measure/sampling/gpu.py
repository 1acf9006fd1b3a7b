"""GPU sampling for W_j: device inventory, busy fraction per device, which pids use which GPU.

Backends behind one small interface (`GpuBackend`):
  - `NvmlBackend` (pynvml): real NVML. Every metric is read on its own and an NVML error
    (NOT_SUPPORTED on consumer or virtual GPUs, GPU_IS_LOST, ...) leaves that metric None for
    that sample; only a failing nvmlInit makes the backend unavailable.
  - `ReplayBackend`: a JSON recording ({"inventory": [...], "samples": [...]}) played back in
    order, so tests and CI run without a GPU and an operator can record a real host
    (`Recorder`) and replay it.

W_j (FLOPs per iteration on this host) = sum over the job's GPUs of busy fraction x peak
throughput x window / iterations. Busy fraction is GPM's SM activity (NVML_GPM_METRIC_SM_UTIL:
the share of SMs busy, averaged over the interval) on GPUs that support GPM (Hopper and later),
else NVML's utilization.gpu (share of the sample period in which any kernel ran), which makes
W_j an upper bound on useful work: a kernel that runs but does not fill the SMs counts fully.
Peak throughput: dense BF16/FP16 tensor TFLOPS from
NVIDIA's datasheets (PEAK_TFLOPS), overridable per device name.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from cruxd.errors import CruxError, UsageError
from cruxd.measure.gpu_work import GpuInfo, GpuSample, peak_tflops

LOG = logging.getLogger(__name__)


class GpuBackend(Protocol):
    name: str

    def inventory(self) -> list[GpuInfo]: ...

    def sample(self) -> GpuSample: ...


class NvmlUnavailable(CruxError, RuntimeError):
    """No NVML here (no driver, no GPU): the reason, for a skip or a status line."""


class GpuSourceError(UsageError, ValueError):
    """A GPU source that cannot be opened as configured: an unknown source, a missing or
    malformed recording. ValueError too: what open_backend raised before."""


class NvmlBackend:
    name = "nvml"

    def __init__(self, overrides: dict[str, float] | None = None) -> None:
        try:
            import pynvml  # type: ignore[import-untyped]
            pynvml.nvmlInit()
        except Exception as exc:  # pynvml raises NVMLError_* or OSError without a driver
            raise NvmlUnavailable(f"NVML unavailable: {exc}") from None
        self._nv: Any = pynvml
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                         for i in range(pynvml.nvmlDeviceGetCount())]
        self._overrides = overrides
        self._gpm = [self._gpm_start(h) for h in self._handles]

    def _gpm_start(self, handle: Any) -> list[Any] | None:
        """[previous sample, spare] for a GPM-capable device; None where GPM is absent."""
        nv = self._nv
        support = self._get(nv.nvmlGpmQueryDeviceSupport, handle)
        if support is None or not support.isSupportedDevice:
            return None
        pair = [self._get(nv.nvmlGpmSampleAlloc), self._get(nv.nvmlGpmSampleAlloc)]
        if None in pair or self._get(nv.nvmlGpmSampleGet, handle, pair[0]) is None:
            return None
        return pair

    def _sm_active(self, i: int, handle: Any) -> float | None:
        """SM activity since the previous sample (GPM needs two samples to difference)."""
        nv, pair = self._nv, self._gpm[i]
        if pair is None or self._get(nv.nvmlGpmSampleGet, handle, pair[1]) is None:
            return None
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = 1
        req.sample1, req.sample2 = pair[0], pair[1]
        req.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
        pair.reverse()  # the newer sample is the next interval's start
        got = self._get(nv.nvmlGpmMetricsGet, req)
        if got is None or got.metrics[0].nvmlReturn != nv.NVML_SUCCESS:
            return None
        return float(got.metrics[0].value)

    def _get(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nv.NVMLError:
            return None

    def inventory(self) -> list[GpuInfo]:
        nv, out = self._nv, []
        for i, h in enumerate(self._handles):
            name = str(self._get(nv.nvmlDeviceGetName, h) or "unknown")
            pci = self._get(nv.nvmlDeviceGetPciInfo, h)
            bus = pci.busId if pci is not None else ""
            out.append(GpuInfo(i, name, str(self._get(nv.nvmlDeviceGetUUID, h) or ""),
                               bus.decode() if isinstance(bus, bytes) else str(bus),
                               peak_tflops(name, self._overrides)))
        return out

    def sample(self) -> GpuSample:
        nv = self._nv
        util: list[float | None] = []
        sm: list[float | None] = []
        pids: dict[int, list[int]] = {}
        for i, h in enumerate(self._handles):
            u = self._get(nv.nvmlDeviceGetUtilizationRates, h)
            util.append(float(u.gpu) if u is not None else None)
            sm.append(self._sm_active(i, h))
            for p in self._get(nv.nvmlDeviceGetComputeRunningProcesses, h) or []:
                pids.setdefault(int(p.pid), []).append(i)
        return GpuSample(time.monotonic(), tuple(util),
                         {p: tuple(d) for p, d in pids.items()},
                         tuple(sm) if any(v is not None for v in sm) else ())


class ReplayBackend:
    """Plays a recording back sample by sample; past the end, the last sample repeats.

    A recording that is rewritten while it plays (a test rig that learns its jobs' pids only
    once they run) is read again and played from its start; a rewrite that does not parse is
    logged once and the old recording plays on. The inventory stays the first one's."""
    name = "replay"

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._mtime = self._stamp()
        self._inv, self._samples = self._load()
        self._next = 0
        self._bad_at: int | None = None

    def _stamp(self) -> int:
        try:
            return self._path.stat().st_mtime_ns
        except OSError:
            return 0

    def _load(self) -> tuple[list[GpuInfo], list[GpuSample]]:
        try:
            doc = json.loads(self._path.read_text())
            inv = [GpuInfo(**g) for g in doc["inventory"]]
            samples = [GpuSample(float(s["t"]), tuple(s["util"]),
                                 {int(p): tuple(d) for p, d in s.get("pids", {}).items()},
                                 tuple(s.get("sm_active", ())))
                       for s in doc["samples"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise GpuSourceError(f"not a GPU recording: {exc}", where=str(self._path)) from None
        if not samples:
            raise GpuSourceError("the recording has no samples", where=str(self._path))
        return inv, samples

    def inventory(self) -> list[GpuInfo]:
        return list(self._inv)

    def sample(self) -> GpuSample:
        stamp = self._stamp()
        if stamp != self._mtime and stamp != self._bad_at:
            try:
                _, self._samples = self._load()
                self._mtime, self._next = stamp, 0
            except GpuSourceError as exc:
                self._bad_at = stamp
                LOG.warning("GPU recording rewritten but unreadable (%s); playing the old one",
                            exc)
        s = self._samples[min(self._next, len(self._samples) - 1)]
        self._next += 1
        return s


class PeakOverride:
    """A backend whose devices all have the configured peak (hosts the table misses)."""

    def __init__(self, inner: GpuBackend, peak: float) -> None:
        self.inner, self.peak, self.name = inner, peak, inner.name

    def inventory(self) -> list[GpuInfo]:
        return [GpuInfo(g.index, g.name, g.uuid, g.pci_bus_id, self.peak)
                for g in self.inner.inventory()]

    def sample(self) -> GpuSample:
        return self.inner.sample()


def open_backend(kind: str, replay_file: str | Path | None = None,
                 peak_tflops: float = 0.0) -> GpuBackend | None:
    """The backend a configuration names ("nvml", "replay" with its file, "none": None),
    every device at `peak_tflops` when that is set. Raises NvmlUnavailable, or GpuSourceError
    for a bad source or recording."""
    if kind == "none":
        return None
    if kind == "replay":
        if replay_file is None:
            raise GpuSourceError("replaying GPUs needs a recording")
        backend: GpuBackend = ReplayBackend(replay_file)
    elif kind == "nvml":
        backend = NvmlBackend()
    else:
        raise GpuSourceError(f"unknown GPU source {kind!r}; sources: nvml, replay, none")
    return PeakOverride(backend, peak_tflops) if peak_tflops > 0 else backend


class Recorder:
    """Wraps a backend and keeps what it returned, to save as a replayable recording."""

    def __init__(self, backend: GpuBackend) -> None:
        self.backend, self.name = backend, f"recording {backend.name}"
        self.samples: list[GpuSample] = []

    def inventory(self) -> list[GpuInfo]:
        return self.backend.inventory()

    def sample(self) -> GpuSample:
        s = self.backend.sample()
        self.samples.append(s)
        return s

    def save(self, path: str | Path) -> None:
        doc = {"inventory": [asdict(g) for g in self.inventory()],
               "samples": [{"t": s.t, "util": list(s.util),
                            "pids": {str(p): list(d) for p, d in s.pids.items()},
                            **({"sm_active": list(s.sm_active)} if s.sm_active else {})}
                           for s in self.samples]}
        Path(path).write_text(json.dumps(doc, indent=1))
