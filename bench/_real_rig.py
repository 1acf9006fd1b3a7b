"""bench/control_plane.py's processes for the real shape (bench/_cluster_shapes.py): the
stress shape's rig (bench/_leader_rig.py) with the leader on the clos3 topology file, the
simulated agents declaring 8 x 200 Gbps NICs and running the jobs they are handed (not
make_jobs'), optionally several agents per gRPC channel, and the real agent with 8 NICs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from _cluster_shapes import REAL_NIC_GBPS, REAL_NICS, clos3_document, clos3_pods
from _leader_rig import Bench
from _workload import JobSpec


def worker_ranges(agents: int, workers: int) -> list[list[int]]:
    """Each worker's hosts: consecutive blocks, as Bench.start_workers splits them."""
    return [[int(h) for h in r] for r in np.array_split(np.arange(agents), workers)]


class RealBench(Bench):
    nics = REAL_NICS

    def topology_document(self) -> dict[str, Any]:
        return clos3_document(clos3_pods(self.args.agents + 1))

    def start_shaped_workers(self, ranges: list[list[int]], specs: list[JobSpec],
                             per_channel: int) -> None:
        a = self.args
        self.spawn_workers([
            (hosts, a.agents, len(specs), a.seed, a.report_interval, False, self.token,
             [s for s in specs if set(hosts).intersection(s.hosts)],
             (REAL_NICS, REAL_NIC_GBPS), per_channel) for hosts in ranges])
