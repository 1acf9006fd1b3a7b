"""What bench/control_plane.py reads: CPU time and memory of its processes from /proc, and
the number formats its report (bench/_cp_report.py) prints them in."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

TICK = os.sysconf("SC_CLK_TCK")


# --- /proc ------------------------------------------------------------------------

def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


def sched_s(pid: int) -> float:
    """CPU time of all the process's threads in ns resolution (/proc/PID/task/*/schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def mem_mb(pid: int) -> dict[str, float]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) / 1024
    return out


@contextlib.contextmanager
def cpu_window(pids: Sequence[int]) -> Iterator[dict[str, float]]:
    """CPU seconds used by `pids` (summed) and wall seconds, over the with-block."""
    out: dict[str, float] = {}
    c0, t0 = sum(cpu_s(p) for p in pids), time.monotonic()
    yield out
    out["cpu_s"] = sum(cpu_s(p) for p in pids) - c0
    out["wall_s"] = time.monotonic() - t0
    out["pct"] = 100 * out["cpu_s"] / out["wall_s"]


# --- report ------------------------------------------------------------------------

def ms(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{1e3 * x:.0f}"


def dist_row(name: str, xs: Sequence[float], target: str = "") -> list[str]:
    a = np.array([x for x in xs if math.isfinite(x)])
    if len(a) == 0:
        return [name, "-", "-", "-", "-", target]
    return [name, ms(float(np.median(a))), ms(float(np.percentile(a, 99))), ms(float(a.max())),
            ms(float(a.min())), target]
