"""What a run measures: GPU utilisation, per-job slowdown, network utilisation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cruxd.model.topology import Topology


@dataclass
class JobRecord:
    job: str
    gpus: int
    arrival_s: float
    start_s: float
    standalone_period_s: float
    iterations_goal: float | None
    end_s: float = math.nan
    busy_gpu_s: float = 0.0
    iterations: float = 0.0

    @property
    def active_s(self) -> float:
        return max(0.0, self.end_s - self.start_s)

    @property
    def throughput_ratio(self) -> float:
        """Iterations per second achieved over those of the job running alone."""
        if self.active_s <= 0:
            return math.nan
        return self.iterations / self.active_s * self.standalone_period_s

    @property
    def jct_s(self) -> float:
        return self.end_s - self.arrival_s

    @property
    def standalone_jct_s(self) -> float:
        goal = self.iterations_goal if self.iterations_goal is not None else self.iterations
        return goal * self.standalone_period_s


@dataclass
class SimResult:
    policy: str
    horizon_s: float
    jobs: list[JobRecord]
    series: list[tuple[float, float, float, float]]  # (t0, t1, busy GPU-s, allocated GPU-s)
    link_bytes: np.ndarray
    topology: Topology = field(repr=False)

    @property
    def gpu_utilization(self) -> float:
        """Busy GPU-seconds over allocated GPU-seconds, whole run."""
        alloc = sum(s[3] for s in self.series)
        return sum(s[2] for s in self.series) / alloc if alloc > 0 else math.nan

    def utilization_over_time(self, bins: int = 200) -> tuple[np.ndarray, np.ndarray]:
        """(bin centres, utilisation per bin): busy over allocated inside each bin."""
        if not self.series:
            empty: np.ndarray = np.zeros(0)
            return empty, empty
        t0, t1 = self.series[0][0], self.series[-1][1]
        edges = np.linspace(t0, t1, bins + 1)
        busy = np.zeros(bins)
        alloc = np.zeros(bins)
        for a, b, bu, al in self.series:
            if b <= a:
                continue
            lo = np.clip(edges[:-1], a, b)
            hi = np.clip(edges[1:], a, b)
            share = (hi - lo) / (b - a)
            busy += share * bu
            alloc += share * al
        with np.errstate(invalid="ignore", divide="ignore"):
            util: np.ndarray = np.where(alloc > 0, busy / alloc, np.nan)
        centres: np.ndarray = (edges[:-1] + edges[1:]) / 2
        return centres, util

    def _ratios(self) -> np.ndarray:
        r = np.array([j.throughput_ratio for j in self.jobs if j.active_s > 0])
        finite: np.ndarray = r[np.isfinite(r)]
        return finite

    @property
    def starved_jobs(self) -> int:
        """Jobs that completed no iteration at all while running."""
        return int(np.sum(self._ratios() <= 0))

    @property
    def mean_slowdown(self) -> float:
        """Mean of standalone over achieved iteration rate, over the jobs that made
        progress (starved jobs are counted by `starved_jobs`)."""
        r = self._ratios()
        r = r[r > 0]
        return float(np.mean(1.0 / r)) if len(r) else math.nan

    @property
    def max_slowdown(self) -> float:
        """inf when a job starved."""
        r = self._ratios()
        if not len(r):
            return math.nan
        return math.inf if r.min() <= 0 else float(np.max(1.0 / r))

    @property
    def worst_throughput_ratio(self) -> float:
        r = self._ratios()
        return float(r.min()) if len(r) else math.nan

    @property
    def network_utilization(self) -> float:
        """Bytes carried by fabric (switch-to-switch) links over what they could carry."""
        topo = self.topology
        fabric = np.array([not topo.is_host(lk.src) and not topo.is_host(lk.dst)
                           for lk in topo.links])
        if not fabric.any() or self.horizon_s <= 0:
            return math.nan
        cap = topo.capacity[fabric].sum() * 1e9 / 8.0 * self.horizon_s
        return float(self.link_bytes[fabric].sum() / cap)

    def summary(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return None if not math.isfinite(x) else round(x, 6)

        return {
            "policy": self.policy,
            "horizon_s": num(self.horizon_s),
            "jobs": len(self.jobs),
            "gpu_utilization": num(self.gpu_utilization),
            "mean_slowdown": num(self.mean_slowdown),
            "max_slowdown": num(self.max_slowdown),
            "starved_jobs": self.starved_jobs,
            "worst_throughput_ratio": num(self.worst_throughput_ratio),
            "network_utilization": num(self.network_utilization),
        }
