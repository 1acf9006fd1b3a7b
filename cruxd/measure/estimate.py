"""A job's per-iteration figures from one window: t_j from its traffic, W_j from its GPUs.

Units: `flops_per_iter` W_j in FLOP per iteration (busy fraction x datasheet peak, see
gpu.py); `comm_s` t_j and `period_s` in seconds per iteration; `compute_s` the GPU-busy
seconds per iteration (mean busy fraction x period); `bytes_per_iter` in bytes sent by this
host per iteration. Each estimate carries the window it came from, the iteration count
and the period's confidence, so a reader can tell a solid figure from a thin one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy.typing as npt

from cruxd.measure.comm import CommEstimate, estimate_comm
from cruxd.measure.gpu_work import GpuInfo, GpuSample, busy_fraction, work_per_iteration

# A burst shorter than two samples may fill none of them wherever it falls, and if none of
# them ever fills, the burst rate is never seen: it shows as partly filled samples, and t_j
# comes out up to a whole sample long (a 7 ms ResNet burst at 100 Hz measured 20 ms on the
# emulated testbed, which ranked the job level with BERTs of a third of its intensity).
MIN_BURST_SAMPLES = 2.0
SHORT_BURSTS = "short bursts"


@dataclass(frozen=True)
class JobEstimate:
    window_s: float
    iterations: float
    period_s: float
    comm_s: float
    bytes_per_iter: float
    confidence: float
    flops_per_iter: float = 0.0  # 0: W_j unknown (no GPUs mapped, or unknown peak)
    compute_s: float = 0.0
    note: str = ""


def estimate_job(rates: npt.ArrayLike, rate_hz: float, gpu_samples: list[GpuSample],
                 inventory: list[GpuInfo], devices: set[int],
                 smooth_s: float = 0.0) -> JobEstimate | None:
    """None when the traffic shows no iteration period (too short, aperiodic, no bursts).
    `smooth_s`: for series counted as the job's sends return (cruxd/measure/comm.py)."""
    comm = estimate_comm(rates, rate_hz, smooth_s)
    if comm is None:
        return None
    note = ""
    if comm.comm_s * rate_hz < MIN_BURST_SAMPLES:
        note = (f"{SHORT_BURSTS}: about {comm.comm_s * 1e3:.3g} ms, under "
                f"{MIN_BURST_SAMPLES:g} samples at {rate_hz:g} Hz, so t_j may be up to a sample "
                f"long (raise measurement.rate_hz)")
    return job_estimate(comm, gpu_samples, inventory, devices, note)


def job_estimate(comm: CommEstimate, gpu_samples: list[GpuSample], inventory: list[GpuInfo],
                 devices: set[int], note: str = "") -> JobEstimate:
    """A job's figures from its traffic's (`comm`) and its GPUs' over the same window."""
    flops = work_per_iteration(gpu_samples, inventory, devices, comm.window_s,
                               comm.iterations) if gpu_samples else None
    busy = [b for d in sorted(devices) if (b := busy_fraction(gpu_samples, d)) is not None]
    gpu_note = ("no GPUs mapped to the job" if not devices else
                "GPU utilisation or peak unknown" if flops is None else "")
    note = "; ".join(n for n in (gpu_note, note) if n)
    return JobEstimate(comm.window_s, comm.iterations, comm.period_s, comm.comm_s,
                       comm.bytes_per_iter, comm.confidence, flops or 0.0,
                       sum(busy) / len(busy) * comm.period_s if busy else 0.0, note)


def drifted(ref: JobEstimate, est: JobEstimate, drift: float) -> bool:
    """Whether `est` shows the job behaving otherwise than its profile `ref` in a way
    contention cannot explain. Contention stretches the period and t_j, and wherever the
    GPU looks busy while it waits (NCCL's spinning kernels, a replayed GPU) it inflates
    W_j too; it cannot change the bytes per iteration, nor make the period or W_j fall."""
    def falls(a: float, b: float) -> bool:
        return a > 0 and b < a * (1 - drift)
    moved = ref.bytes_per_iter > 0 and abs(est.bytes_per_iter - ref.bytes_per_iter) > (
        drift * ref.bytes_per_iter)
    return (moved or falls(ref.period_s, est.period_s)
            or falls(ref.flops_per_iter, est.flops_per_iter))
