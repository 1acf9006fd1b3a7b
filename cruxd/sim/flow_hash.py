"""ECMP as switches do it: a deterministic hash of the flow's 5-tuple.

A flow with no path from its policy gets one by hashing (src, dst, UDP source
port, 4791, UDP) with the run's seed over its candidate paths. The source port is
what a NIC derives from the QP numbers when nothing sets the flow label: a random
port in RoCEv2's range, fixed per flow (job, flow index) and seed.
"""

from __future__ import annotations

import zlib

import numpy as np

from cruxd.errors import PlanningError
from cruxd.model.jobs import FlowSpec
from cruxd.model.paths import PathFinder
from transport.roce import ROCE_DPORT, ROCE_SPORT_MAX, ROCE_SPORT_MIN

UDP = 17


def source_port(job_id: str, flow_index: int, seed: int) -> int:
    spread = ROCE_SPORT_MAX - ROCE_SPORT_MIN  # all low bits set: a mask over the range
    return ROCE_SPORT_MIN | (zlib.crc32(f"{job_id}/{flow_index}/{seed}".encode()) & spread)


def hash_path(finder: PathFinder, flow: FlowSpec, sport: int, seed: int) -> np.ndarray:
    """The candidate the 5-tuple hashes onto (link indices)."""
    cands = finder.candidates(flow.src, flow.dst, flow.src_port, flow.dst_port)
    if len(cands) == 0:
        raise PlanningError(f"no path from {flow.src} to {flow.dst}")
    key = f"{flow.src}|{flow.dst}|{sport}|{ROCE_DPORT}|{UDP}".encode()
    return np.asarray(cands[zlib.crc32(key, seed & 0xFFFFFFFF) % len(cands)])
