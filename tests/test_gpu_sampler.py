"""GPU sampling for W_j: the peak table, record/replay, the W_j arithmetic, and real NVML where
a GPU exists (skipped with NVML's own reason elsewhere)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cruxd.measure.gpu import (
    NvmlBackend,
    NvmlUnavailable,
    Recorder,
    ReplayBackend,
    busy_fraction,
    job_gpus,
    peak_tflops,
    work_per_iteration,
)

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
