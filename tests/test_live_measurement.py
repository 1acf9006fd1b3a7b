"""The agent's live measurement, pure parts and threads on a fixture sysfs tree: the counter
window, per-job counters and GPUs, the profiling window and the drift that asks for another."""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cruxd.agent.measuring import LiveMeasurement
from cruxd.agent.process_tree import belongs
from cruxd.config.model import MeasureConfig
from cruxd.control.records import HostPlan, JobAssignment, JobState, LocalJob, Measurement
from cruxd.measure.estimate import JobEstimate, drifted, estimate_job
from cruxd.measure.gpu_work import GpuInfo, GpuSample
from cruxd.measure.sampling.csampler import SamplerUnavailable, load_library
from cruxd.measure.window import CounterWindow
from transport.qp_records import ProcessRecords, QpRecord

FIXTURE = Path(__file__).parent / "fixtures" / "sysfs"


def bursts(n: int, rate_hz: float, period_s: float, on_s: float, level: float) -> np.ndarray:
    t = np.arange(n) / rate_hz
    return np.where((t % period_s) < on_s, level, 0.0)


def test_window_rates_sum_counters_and_mark_failures() -> None:
    w = CounterWindow(["a", "b"], rate_hz=10, keep_s=100)
    for i in range(6):
        a = None if i == 3 else 100 * i
        b = 5 if i == 5 else 10 * i  # b goes backwards at i = 5: a reset
        w.add(i * 0.1, [a, b])
    start, r = w.rates(["a", "b"])
    assert start == 0.0
    np.testing.assert_allclose(r[:2], [1100.0, 1100.0])
    assert math.isnan(r[2]) and math.isnan(r[3]) and math.isnan(r[4])  # a failed at i=3
    start, r = w.rates(["a"], since=0.35)
    assert start == pytest.approx(0.4) and r.size == 1 and r[0] == pytest.approx(1000.0)


@given(st.lists(st.tuples(st.floats(0.001, 1.0), st.none() | st.integers(0, 10**6),
                          st.none() | st.integers(0, 10**6)), min_size=0, max_size=40),
       st.floats(-1.0, 30.0))
def test_window_each_counter_alone_matches_rates(
        steps: list[tuple[float, int | None, int | None]], since: float) -> None:
    w = CounterWindow(["a", "b"], rate_hz=10, keep_s=100)
    t = 0.0
    for dt, a, b in steps:
        t += dt
        w.add(t, [a, b])
    each = w.rates_each(since)
    for name in ("a", "b"):
        np.testing.assert_array_equal(each[name], w.rates([name], since)[1])


def test_window_is_bounded_and_checks_its_input() -> None:
    w = CounterWindow(["a"], rate_hz=10, keep_s=1)
    for i in range(100):
        w.add(i / 10, [i])
    assert len(w) == 11
    with pytest.raises(ValueError, match="expected 1 values"):
        w.add(1.0, [1, 2])
    with pytest.raises(ValueError):
        CounterWindow([], 10, 1)


def test_estimate_job_units() -> None:
    rate_hz, period, on = 100.0, 0.5, 0.15
    rates = bursts(3000, rate_hz, period, on, 1e9)
    inv = [GpuInfo(0, "A100", "u0", "b0", 312.0), GpuInfo(1, "A100", "u1", "b1", 312.0)]
    gpu = [GpuSample(float(t), (60.0, 60.0)) for t in range(30)]
    est = estimate_job(rates, rate_hz, gpu, inv, {0, 1})
    assert est is not None
    assert est.period_s == pytest.approx(period, rel=0.01)
    assert est.comm_s == pytest.approx(on, rel=0.05)
    # W_j: 2 GPUs x 60 % x 312 TFLOPS x 0.5 s per iteration
    assert est.flops_per_iter == pytest.approx(2 * 0.6 * 312e12 * period, rel=0.01)
    assert est.compute_s == pytest.approx(0.6 * period, rel=0.01)
    assert est.bytes_per_iter == pytest.approx(1e9 * on, rel=0.05)
    none = estimate_job(rates, rate_hz, gpu, inv, set())
    assert none is not None and none.flops_per_iter == 0 and "no GPUs" in none.note
    assert estimate_job(np.full(3000, 5e8), rate_hz, gpu, inv, {0}) is None
    assert "short bursts" not in est.note  # 15 samples per burst


def test_bursts_under_two_samples_are_flagged() -> None:
    """A 7 ms burst every 0.12 s at 100 Hz: one or two partly filled samples per burst, so
    t_j comes out a sample or more long, and the estimate says so; at 1 kHz it does not."""
    rate_hz, fine = 100.0, 10_000.0
    wire = bursts(300_000, fine, 0.12, 0.007, 2.5e7)  # 30 s at 0.1 ms
    rates = wire.reshape(-1, int(fine / rate_hz)).mean(axis=1)  # what a 10 ms counter sees
    inv = [GpuInfo(0, "A100", "u0", "b0", 312.0)]
    est = estimate_job(rates, rate_hz, [GpuSample(float(t), (100.0,)) for t in range(30)],
                       inv, {0})
    assert est is not None and est.period_s == pytest.approx(0.12, rel=0.02)
    assert est.comm_s > 0.009  # the bias the note warns of
    assert "short bursts" in est.note and "raise measurement.rate_hz" in est.note
    at_1k = wire.reshape(-1, int(fine / 1000)).mean(axis=1)
    est = estimate_job(at_1k, 1000.0, [], inv, {0})
    assert est is not None and est.comm_s == pytest.approx(0.007, rel=0.15)
    assert "short bursts" not in est.note


def test_belongs_follows_parents(tmp_path: Path) -> None:
    for pid, ppid in ((10, 1), (11, 10), (12, 11), (20, 1)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (py thon) S {ppid} 0 0\n")
    assert belongs(12, {10}, str(tmp_path))
    assert not belongs(20, {10}, str(tmp_path))
    assert not belongs(99, {10}, str(tmp_path))  # gone: not ours


def config(sysfs: Path, **kw: object) -> MeasureConfig:
    base: dict[str, object] = dict(rate_hz=100.0, sampler="auto", window_s=10.0, gpu="none",
                                   gpu_file=None,
                                   gpu_interval_s=1.0, interfaces=("eth0",), rdma=True,
                                   peak_tflops=0.0, settle_s=0.0, sysfs=sysfs)
    base.update(kw)
    return MeasureConfig(**base)  # type: ignore[arg-type]


def qp(job: str, device: str, port: int, pid: int = 4242) -> ProcessRecords:
    """A QP record of process `pid` (4242: the job's registered process in `live`)."""
    rec = QpRecord(pid=pid, job_id=job, device=device, port=port, sgid_index=1, qpn=1,
                   dest_qpn=2, peer="10.0.0.2", outcome="applied", sport=0xC001,
                   flow_label=1, orig_flow_label=0, traffic_class=0, orig_traffic_class=0,
                   level=0, dscp=0, plan_generation=1, table_generation=1, created_ns=0)
    return ProcessRecords(pid, job, {}, 1, (rec,))


def live(tmp_path: Path, records: list[ProcessRecords], jobs: int = 1) -> LiveMeasurement:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURE, root)
    return LiveMeasurement(config(root), (), lambda job: [4242], lambda: records,
                           lambda: jobs)


def feed(m: LiveMeasurement, names: dict[str, np.ndarray], rate_hz: float = 100.0) -> None:
    """Readings ending now, as if the sampler thread had taken them."""
    n = len(next(iter(names.values())))
    now = time.monotonic()
    totals = {k: np.concatenate([[0.0], np.cumsum(v / rate_hz)]) for k, v in names.items()}
    for i in range(n + 1):
        m.window.add(now - (n - i) / rate_hz,
                     [totals[c.name][i] if c.name in totals else 0 for c in m.counters])


def test_job_counters_come_from_qp_records(tmp_path: Path) -> None:
    m = live(tmp_path, [qp("a", "mlx5_0", 1)])
    assert {c.name for c in m.counters} >= {"net:eth0", "rdma:mlx5_0/1"}
    assert m.job_counters("a") == ("rdma:mlx5_0/1",)
    assert m.job_counters("b") == ("net:eth0",)  # no QPs: the netdevs carry its traffic


def test_a_record_from_outside_the_job_chooses_no_counter(tmp_path: Path) -> None:
    # pid 1 is no process of job b (its registered 4242 and their descendants): its record
    # names b and a NIC, which would have made b's t_j be read there (issue 37, item 7)
    m = live(tmp_path, [qp("a", "mlx5_0", 1), qp("b", "mlx5_0", 1, pid=1)])
    assert m.job_counters("a") == ("rdma:mlx5_0/1",)
    assert m.job_counters("b") == ("net:eth0",)


def test_gpus_by_process_and_the_only_job_fallback(tmp_path: Path) -> None:
    m = live(tmp_path, [])
    m.inventory = [GpuInfo(i, "H100", f"u{i}", f"b{i}", 989.0) for i in range(4)]
    m.gpu_samples.append(GpuSample(0.0, (1.0,) * 4, {4242: (1, 2), 777: (3,)}))
    assert m.job_devices("a") == {1, 2}
    m.gpu_samples.clear()
    m.gpu_samples.append(GpuSample(0.0, (1.0,) * 4))  # no process list
    assert m.job_devices("a") == {0, 1, 2, 3}
    m.job_count = lambda: 2
    assert m.job_devices("a") == set()  # two jobs, no processes: cannot tell


def plan(job: str, state: JobState) -> HostPlan:
    return HostPlan("h0", 1, 0, 4, (JobAssignment(job, state, level=3, dscp=46),))


def test_profiled_figures_are_kept_and_drift_asks_again(tmp_path: Path) -> None:
    m = live(tmp_path, [qp("a", "mlx5_0", 1)])
    job = LocalJob("a", 8)
    m.plan_changed(plan("a", JobState.PROFILING))
    feed(m, {"rdma:mlx5_0/1": bursts(900, 100.0, 0.5, 0.15, 1e9)})
    got = m.measure(job, Measurement())
    assert got.period_s == 0.0  # the window started after these samples: nothing yet
    m.tracks["a"].profiling_since = time.monotonic() - 20
    m.tracks["a"].at = -math.inf
    got = m.measure(job, Measurement())
    assert got.source == "nvml+nic"
    assert got.period_s == pytest.approx(0.5, rel=0.02)
    assert got.comm_s == pytest.approx(0.15, rel=0.1)
    m.plan_changed(plan("a", JobState.SCHEDULED))  # window over: figures kept
    profiled = got

    def windows(period_s: float, on_s: float, level: float) -> Measurement:
        for _ in range(3):
            feed(m, {"rdma:mlx5_0/1": bursts(900, 100.0, period_s, on_s, level)})
            m.tracks["a"].at = m.tracks["a"].drift_at = -math.inf
            got = m.measure(job, Measurement())
            assert got == profiled  # every figure stays the profiled one
        return got

    # contention stretches the period and the bursts (the same bytes, at a quarter of the
    # rate): nothing the job does itself changed, so it is not profiled again
    windows(1.0, 0.6, 0.25e9)
    assert not m.wants_profile("a")
    # twice the bytes per iteration: the job itself changed (a new batch size, say)
    windows(0.5, 0.3, 1e9)
    assert m.wants_profile("a")
    m.plan_changed(plan("a", JobState.PROFILING))
    assert not m.wants_profile("a")


@pytest.mark.parametrize(("period", "nbytes", "flops", "changed"), [
    (0.5, 1e8, 1e12, False),   # the profile itself
    (0.9, 1e8, 1.8e12, False),  # contention: longer, and the GPU looks busier
    (0.35, 1e8, 1e12, True),   # faster than alone: not contention
    (0.5, 1.3e8, 1e12, True),  # more bytes per iteration
    (0.5, 0.7e8, 1e12, True),  # fewer
    (0.5, 1e8, 0.7e12, True),  # less work per iteration
])
def test_drift_is_what_contention_cannot_explain(period: float, nbytes: float, flops: float,
                                                 changed: bool) -> None:
    ref = JobEstimate(10.0, 20.0, 0.5, 0.15, 1e8, 0.9, 1e12, 0.3)
    est = JobEstimate(10.0, 10.0 / period, period, 0.2, nbytes, 0.9, flops, 0.3)
    assert drifted(ref, est, 0.25) is changed


@pytest.mark.parametrize("sampler", ["auto", "python"])
def test_threads_sample_the_fixture_and_stop(tmp_path: Path, sampler: str) -> None:
    m = live(tmp_path, [])
    m.cfg = config(m.cfg.sysfs or tmp_path, sampler=sampler)
    m.start()
    try:
        deadline = time.monotonic() + 5
        while len(m.window) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(m.window) >= 20
        _, r = m.window.rates(["net:eth0"])
        assert np.all(r[np.isfinite(r)] == 0)  # the fixture's counters do not move
    finally:
        m.stop()
    assert not any(t.is_alive() for t in m._threads)
    assert m.sampler == ("c" if sampler == "auto" and c_sampler_here() else "python")


def c_sampler_here() -> bool:
    try:
        load_library()
    except SamplerUnavailable:
        return False
    return True
