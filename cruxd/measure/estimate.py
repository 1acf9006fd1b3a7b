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

from cruxd.measure.comm import estimate_comm
from cruxd.measure.gpu_work import GpuInfo, GpuSample, busy_fraction, work_per_iteration


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
                 inventory: list[GpuInfo], devices: set[int]) -> JobEstimate | None:
    """None when the traffic shows no iteration period (too short, aperiodic, no bursts)."""
    comm = estimate_comm(rates, rate_hz)
    if comm is None:
        return None
    note = ""
    flops = work_per_iteration(gpu_samples, inventory, devices, comm.window_s,
                               comm.iterations) if gpu_samples else None
    busy = [b for d in sorted(devices) if (b := busy_fraction(gpu_samples, d)) is not None]
    if not devices:
        note = "no GPUs mapped to the job"
    elif flops is None:
        note = "GPU utilisation or peak unknown"
    return JobEstimate(comm.window_s, comm.iterations, comm.period_s, comm.comm_s,
                       comm.bytes_per_iter, comm.confidence, flops or 0.0,
                       sum(busy) / len(busy) * comm.period_s if busy else 0.0, note)
