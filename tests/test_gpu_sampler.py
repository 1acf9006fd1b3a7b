"""GPU sampling for W_j: the peak table, record/replay, the W_j arithmetic, and real NVML where
a GPU exists (skipped with NVML's own reason elsewhere)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cruxd.measure.gpu_work import busy_fraction, job_gpus, peak_tflops, work_per_iteration
from cruxd.measure.sampling.gpu import NvmlBackend, NvmlUnavailable, Recorder, ReplayBackend

RECORDING = Path(__file__).resolve().parent / "fixtures" / "gpu_recording.json"


def test_peak_table() -> None:
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0  # the longer fragment wins
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops("Some Future GPU") == 0.0
    assert peak_tflops("Some Future GPU", {"Future": 2000.0}) == 2000.0


def test_replay_reproduces_a_recording_exactly(tmp_path: Path) -> None:
    rec = Recorder(ReplayBackend(RECORDING))
    got = [rec.sample() for _ in range(20)]
    rec.save(tmp_path / "again.json")
    again = ReplayBackend(tmp_path / "again.json")
    assert again.inventory() == ReplayBackend(RECORDING).inventory()
    assert [again.sample() for _ in range(20)] == got
    assert got[7].util[1] is None  # an unreadable metric survives the round trip


def test_work_per_iteration_follows_the_duty_cycle() -> None:
    b = ReplayBackend(RECORDING)
    samples = [b.sample() for _ in range(20)]
    inv = b.inventory()
    assert job_gpus(samples, {4242}) == {0} and job_gpus(samples, {1, 2}) == set()
    assert busy_fraction(samples, 0) == pytest.approx(0.6)
    assert busy_fraction(samples, 1) == pytest.approx(6 / 19)  # one sample unreadable
    w = work_per_iteration(samples, inv, {0}, window_s=10.0, iterations=20)
    assert w == pytest.approx(0.6 * 989e12 * 10 / 20)
    assert work_per_iteration(samples, inv, {0}, 10.0, 0) is None
    unknown = [inv[0].__class__(0, "Mystery", "", "", 0.0)]
    assert work_per_iteration(samples, unknown, {0}, 10.0, 5) is None


def test_bad_recordings(tmp_path: Path) -> None:
    for text in ("not json", '{"inventory": []}', '{"inventory": [], "samples": []}'):
        (tmp_path / "r.json").write_text(text)
        with pytest.raises(ValueError, match=r"r\.json"):
            ReplayBackend(tmp_path / "r.json")


def test_a_rewritten_recording_is_played_from_its_start(tmp_path: Path) -> None:
    """A rig that learns its jobs' pids once they run writes them in; the replay follows,
    and a rewrite it cannot read leaves the old recording playing."""
    import json
    import os

    def write(pids: dict[str, list[int]], mtime_ns: int) -> None:
        doc = {"inventory": [{"index": 0, "name": "A100", "uuid": "u", "pci_bus_id": "b",
                              "peak_tflops": 312.0}],
               "samples": [{"t": 0.0, "util": [50.0], "pids": pids}]}
        path.write_text(json.dumps(doc))
        os.utime(path, ns=(mtime_ns, mtime_ns))

    path = tmp_path / "r.json"
    write({}, 1_000_000_000)
    b = ReplayBackend(path)
    assert b.sample().pids == {}
    write({"4242": [0]}, 2_000_000_000)
    assert b.sample().pids == {4242: (0,)}
    path.write_text("{")
    os.utime(path, ns=(3_000_000_000, 3_000_000_000))
    assert b.sample().pids == {4242: (0,)} and b.inventory()[0].peak_tflops == 312.0


@pytest.mark.gpu
def test_nvml_backend_on_real_gpus() -> None:
    try:
        nv = NvmlBackend()
    except NvmlUnavailable as exc:
        pytest.skip(str(exc))
    inv = nv.inventory()
    assert inv and all(g.uuid.startswith("GPU-") for g in inv)
    s = nv.sample()
    assert len(s.util) == len(inv)
    assert all(u is None or 0 <= u <= 100 for u in s.util)


@pytest.mark.gpu
@pytest.mark.parametrize("duty", [0.3, 0.7])
def test_nvml_busy_follows_a_cuda_duty_cycle(tmp_path: Path, duty: float) -> None:
    """A kernel spinning `duty` of every 200 ms: the busy fraction NVML reports, and so W_j,
    must follow it (utilization.gpu counts time with a kernel running; GPM SM activity counts
    busy SMs, and the kernel fills every SM)."""
    import shutil
    import subprocess
    import time

    try:
        nv = NvmlBackend()
    except NvmlUnavailable as exc:
        pytest.skip(str(exc))
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).exists():
        pytest.skip("nvcc (CUDA toolkit) not installed: cannot build the duty-cycle workload")
    exe = tmp_path / "duty"
    subprocess.run([nvcc, "-O2", "-o", str(exe), str(Path(__file__).parent / "c" / "duty.cu")],
                   check=True)
    job = subprocess.Popen([str(exe), str(200 * duty), "200", "8"])
    try:
        time.sleep(1.5)  # let the first kernels start
        samples = []
        for _ in range(25):
            time.sleep(0.2)
            samples.append(nv.sample())
    finally:
        job.wait(timeout=30)
    busy = busy_fraction(samples, 0)
    assert busy is not None
    print(f"duty {duty}: NVML busy {busy:.3f} (GPM: {bool(samples[-1].sm_active)})")
    assert abs(busy - duty) <= 0.1
    w = work_per_iteration(samples, nv.inventory(), {0}, window_s=5.0, iterations=25)
    if nv.inventory()[0].peak_tflops > 0:
        assert w == pytest.approx(busy * nv.inventory()[0].peak_tflops * 1e12 * 5 / 25)


class _FakeGpm:
    """Just the GPM calls' shapes (no GPU here); checks our sequence, not NVML's numbers."""

    NVML_SUCCESS = 0
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2

    class NVMLError(Exception):
        pass

    class _Metric:
        def __init__(self) -> None:
            self.metricId, self.nvmlReturn, self.value = 0, 0, 0.0

    class c_nvmlGpmMetricsGet_t:
        def __init__(self) -> None:
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [_FakeGpm._Metric()]

    def __init__(self) -> None:
        self.taken = 0
        self.pairs: list[tuple[object, object]] = []

    def nvmlGpmQueryDeviceSupport(self, h: object) -> object:
        return type("S", (), {"isSupportedDevice": 1})()

    def nvmlGpmSampleAlloc(self) -> object:
        return object()

    def nvmlGpmSampleGet(self, h: object, s: object) -> object:
        self.taken += 1
        return s

    def nvmlGpmMetricsGet(self, req: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
        assert req.metrics[0].metricId == self.NVML_GPM_METRIC_SM_UTIL and req.numMetrics == 1
        self.pairs.append((req.sample1, req.sample2))
        req.metrics[0].value = 42.0
        return req


def test_gpm_differences_consecutive_samples_and_wins_over_utilization() -> None:
    nv = object.__new__(NvmlBackend)
    fake = _FakeGpm()
    nv._nv = fake
    pair = nv._gpm_start("h0")
    assert pair is not None and fake.taken == 1  # the first sample opens the interval
    nv._gpm = [pair]
    assert nv._sm_active(0, "h0") == 42.0
    assert nv._sm_active(0, "h0") == 42.0
    (a1, b1), (a2, b2) = fake.pairs
    assert a2 is b1 and b2 is a1  # each interval starts where the last ended
    from cruxd.measure.gpu_work import GpuSample

    s = [GpuSample(0.0, (100.0,), {}, (42.0,)), GpuSample(1.0, (100.0,), {}, (None,))]
    assert busy_fraction(s, 0) == pytest.approx((0.42 + 1.0) / 2)  # util where GPM missed
