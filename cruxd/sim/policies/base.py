"""What a scheduling policy sees and decides, once per epoch (arrival, departure,
or a periodic re-plan)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from cruxd.model.jobs import Job
from cruxd.model.paths import PathFinder
from cruxd.model.topology import Topology


@dataclass(frozen=True)
class Context:
    topology: Topology
    finder: PathFinder
    jobs: tuple[Job, ...]  # running now
    new: frozenset[str]  # arrived since the last decision
    now: float
    levels: int  # priority levels the fabric offers
    throughput: dict[str, float] = field(default_factory=dict)  # recent / standalone, per job
    seed: int = 0


@dataclass(frozen=True)
class Decisions:
    """level: larger = higher priority (missing: 0). paths: per job, one entry per
    network flow (job.flows without intra-host ones) with its link indices, or None
    to leave that flow to the fabric (missing job: all to the fabric). offset_s: extra
    delay before a newly arrived job starts (CASSINI). spray: what the fabric does with
    a flow left to it: False, ECMP hashes it onto one candidate path; True, it sprays
    the flow's bytes evenly over all its candidates (adaptive routing, per-packet
    spraying: Spectrum-X, InfiniBand AR, UEC)."""

    level: dict[str, int] = field(default_factory=dict)
    paths: dict[str, tuple[np.ndarray | None, ...]] = field(default_factory=dict)
    offset_s: dict[str, float] = field(default_factory=dict)
    spray: bool = False


class Policy(Protocol):
    name: str

    def decide(self, ctx: Context) -> Decisions: ...


def network_flows(job: Job) -> list[int]:
    """Indices into job.flows of the flows that leave their host."""
    return [i for i, f in enumerate(job.flows) if f.src != f.dst]
