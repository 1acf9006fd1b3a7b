"""W_j from GPU samples (pure): peak throughput per device, busy share, FLOPs per iteration.

The samplers that produce `GpuSample`s (NVML, replay) are in cruxd/measure/sampling/gpu.py;
the estimate is here so the pure estimators never import the I/O half.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Dense (no sparsity) BF16/FP16 tensor-core TFLOPS, NVIDIA datasheets; the longest name
# fragment that matches wins ("H100 PCIe" before "H100").
PEAK_TFLOPS = {
    "H200": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "H800": 989.0, "H20": 148.0,
    "A100": 312.0, "A800": 312.0, "A30": 165.0, "A10": 125.0, "L40S": 362.0, "L40": 181.0,
    "L4": 121.0, "V100": 125.0, "T4": 65.0,
}


def peak_tflops(name: str, overrides: dict[str, float] | None = None) -> float:
    """Peak dense tensor TFLOPS for a device name; 0.0 when unknown (W_j stays unknown)."""
    table = {**PEAK_TFLOPS, **(overrides or {})}
    hits = [k for k in table if k.lower() in name.lower()]
    return table[max(hits, key=len)] if hits else 0.0


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    peak_tflops: float


@dataclass(frozen=True)
class GpuSample:
    t: float  # monotonic seconds
    util: tuple[float | None, ...]  # percent busy per device index; None: not readable
    pids: dict[int, tuple[int, ...]] = field(default_factory=dict)  # pid -> device indices
    sm_active: tuple[float | None, ...] = ()  # GPM SM activity percent per device, if any



def job_gpus(samples: list[GpuSample], pids: set[int]) -> set[int]:
    """The devices any of the job's pids ran on during the samples."""
    return {d for s in samples for p, devs in s.pids.items() if p in pids for d in devs}


def _busy(s: GpuSample, device: int) -> float | None:
    if device < len(s.sm_active) and s.sm_active[device] is not None:
        return s.sm_active[device]
    return s.util[device] if device < len(s.util) else None


def busy_fraction(samples: list[GpuSample], device: int) -> float | None:
    """Mean busy share of one device over the samples (0..1), GPM SM activity where a
    sample has it, else utilization.gpu; None if never readable."""
    vals = [v for s in samples if (v := _busy(s, device)) is not None]
    return sum(vals) / 100.0 / len(vals) if vals else None


def work_per_iteration(samples: list[GpuSample], inventory: list[GpuInfo], devices: set[int],
                       window_s: float, iterations: float) -> float | None:
    """W_j in FLOPs per iteration on these devices; None when it cannot be known (no
    iterations, a device never readable, or a device of unknown peak)."""
    if iterations <= 0 or window_s <= 0 or not devices:
        return None
    total = 0.0
    for d in sorted(devices):
        busy = busy_fraction(samples, d)
        peak = inventory[d].peak_tflops if d < len(inventory) else 0.0
        if busy is None or peak <= 0:
            return None
        total += busy * peak * 1e12 * window_s
    return total / iterations
