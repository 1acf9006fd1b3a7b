"""Measured bandwidth per host pair and path, for performance-aware dispatchers (pure).

BandPilot-style dispatchers want what a path really delivered, not its nominal speed. The
agents' live measurement gives it for free: a job's bytes per iteration over its time on the
wire per iteration is the rate its bursts achieved from that host, and the plan says which
path (hops) the job's traffic from that host to its ring peer took. A sample taken while the
job was profiled (alone at the top priority) is the path's uncontended rate; later samples
show it under the current load. Samples are kept per (src, dst, path), newest last.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cruxd.control.records import JobAssignment, LocalJob
from cruxd.hints.fabric_view import SCHEMA_VERSION, FabricView

FORMAT = "crux.bandwidth"
# only measured figures (the NIC's, or the job's own on a shared host: `nvml+sock`, `nvml+qp`,
# `nvml+nccl`); hints and replays are not bandwidth
LIVE_SOURCE = ("nvml+nic", "nvml+sock", "nvml+qp", "nvml+nccl")


@dataclass(frozen=True, slots=True)
class BandwidthSample:
    src: str
    dst: str
    hops: tuple[str, ...]
    gbps: float
    job_id: str
    unix_ms: int
    profiled: bool  # measured while the job was alone at the top priority


def samples_from(host: str, jobs: Iterable[LocalJob],
                 assignments: Mapping[str, JobAssignment], now_ms: int
                 ) -> list[BandwidthSample]:
    """One host's report: a sample per live-measured job and route leaving this host (a
    host with several routes for one job splits the rate evenly: the NIC counter is one)."""
    out = []
    for job in jobs:
        m = job.measurement
        if not m.source.startswith(LIVE_SOURCE) or m.comm_s <= 0 or m.allreduce_bytes <= 0:
            continue
        a = assignments.get(job.job_id)
        routes = [r for r in a.routes if r.src_host == host] if a is not None else []
        if not routes:
            continue
        gbps = m.allreduce_bytes * 8 / m.comm_s / 1e9 / len(routes)
        profiled = "unprofiled" not in m.source
        out += [BandwidthSample(host, r.peer_host, r.hops, gbps, job.job_id, now_ms, profiled)
                for r in routes]
    return out


class BandwidthLog:
    """The newest `keep` samples per (src, dst, hops); a repeated report adds nothing."""

    def __init__(self, keep: int = 16) -> None:
        self.keep = keep
        self._by_path: dict[tuple[str, str, tuple[str, ...]], deque[BandwidthSample]] = {}

    def add(self, samples: Iterable[BandwidthSample]) -> int:
        added = 0
        for s in samples:
            q = self._by_path.setdefault((s.src, s.dst, s.hops), deque(maxlen=self.keep))
            if q and (q[-1].job_id, q[-1].gbps, q[-1].profiled) == (s.job_id, s.gbps,
                                                                    s.profiled):
                continue  # the same measurement reported again
            q.append(s)
            added += 1
        return added

    def samples(self) -> list[BandwidthSample]:
        return [s for key in sorted(self._by_path) for s in self._by_path[key]]

    def link_measured(self) -> dict[tuple[str, str], float]:
        """Per link, the best rate any sample's path achieved across it: a lower bound on
        what the link can carry."""
        out: dict[tuple[str, str], float] = {}
        for s in self.samples():
            nodes = (s.src, *s.hops, s.dst)
            for a, z in itertools.pairwise(nodes):
                out[(a, z)] = max(out.get((a, z), 0.0), s.gbps)
        return out


def export(view: FabricView, samples: list[BandwidthSample]) -> dict[str, Any]:
    """Samples grouped per host pair and path, with the path's nominal bottleneck."""
    groups: dict[tuple[str, str, tuple[str, ...]], list[BandwidthSample]] = {}
    for s in samples:
        groups.setdefault((s.src, s.dst, s.hops), []).append(s)
    paths = []
    for (src, dst, hops), group in sorted(groups.items()):
        nodes = (src, *hops, dst)
        links = [view.link(a, z) for a, z in itertools.pairwise(nodes)]
        nominal = min((lk.nominal_gbps / lk.cables for lk in links if lk is not None),
                      default=None)
        paths.append({"src": src, "dst": dst, "hops": list(hops),
                      "nominal_gbps": nominal,
                      "samples": [{"gbps": s.gbps, "job_id": s.job_id, "unix_ms": s.unix_ms,
                                   "profiled": s.profiled} for s in group]})
    return {"format": FORMAT, "version": SCHEMA_VERSION, "fabric": view.name,
            "generated_unix_ms": view.generated_unix_ms, "paths": paths}
