"""The scheduler's output: per job priority decisions, per flow paths."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from transport.roce import tos


@dataclass(frozen=True, slots=True)
class JobDecision:
    job: str
    intensity: float  # I_j = W_j / t_j (FLOP/s of compute unlocked per second on the wire)
    comm_s: float  # t_j, s per iteration on the job's busiest link
    period_s: float  # standalone iteration time
    k: float  # correction factor (reference job: 1)
    priority: float  # P_j = k_j * I_j
    rank: int  # 0 = highest unique priority
    level: int  # compressed level, 0 lowest
    dscp: int
    network: bool  # False: no inter-host traffic, intensity is unbounded

    @property
    def traffic_class(self) -> int:
        """GRH traffic class / IP TOS byte, ECN bits left to the NIC."""
        return tos(self.dscp)


@dataclass(frozen=True, slots=True)
class FlowDecision:
    job: str
    src: str
    dst: str
    bytes: float
    src_port: int | None
    path: tuple[int, ...]  # link indices
    hops: tuple[str, ...]  # switches crossed
    sport: int | None  # UDP source port from the path table, when probed
    candidates: int


@dataclass(frozen=True, slots=True)
class LinkLoad:
    link: str
    capacity_gbps: float
    demand_gbps: float  # mean offered load from all jobs at their standalone rates
    jobs: tuple[str, ...]

    @property
    def utilization(self) -> float:
        return self.demand_gbps / self.capacity_gbps


@dataclass(frozen=True)
class Plan:
    jobs: tuple[JobDecision, ...]  # by rank
    flows: tuple[FlowDecision, ...]
    links: tuple[LinkLoad, ...]  # busiest first
    levels: int
    reference_job: str | None
    cut_weight: float  # contention (intensity) separated by distinct levels
    contention_weight: float  # all contention weight in the DAG
    # `flows` by job, each job's own tuple: the incremental planner hands the same tuple
    # again for a job whose choices did not change (the leader keeps its routes then)
    job_flows: Mapping[str, tuple[FlowDecision, ...]] = field(
        default_factory=dict, compare=False, repr=False)

    def job(self, job_id: str) -> JobDecision:
        for d in self.jobs:
            if d.job == job_id:
                return d
        raise KeyError(job_id)

    def to_dict(self) -> dict[str, Any]:
        def clean(v: Any) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return None  # JSON has no infinity: a job with no network traffic
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, list | tuple):
                return [clean(x) for x in v]
            return v

        return {
            "version": 1,
            "levels": self.levels,
            "reference_job": self.reference_job,
            "cut_weight": clean(self.cut_weight),
            "contention_weight": clean(self.contention_weight),
            "jobs": [clean({**asdict(d), "traffic_class": d.traffic_class}) for d in self.jobs],
            "flows": [clean(asdict(f)) for f in self.flows],
            "links": [clean({**asdict(lk), "utilization": lk.utilization}) for lk in self.links],
        }
