"""bench/control_plane.py's processes for the real shape (bench/_cluster_shapes.py): the
stress shape's rig (bench/_leader_rig.py) with the leader on the clos3 topology file, the
simulated agents declaring 8 x 200 Gbps NICs and running the jobs they are handed (not
make_jobs'), optionally several agents per gRPC channel, and the real agent with 8 NICs.
start_leader repeats Bench.start_leader's leader config; keep the two alike.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from _cluster_shapes import REAL_NIC_GBPS, REAL_NICS, clos3_document, clos3_pods
from _fake_agents import worker_main  # bench/ is on sys.path when run as a script
from _leader_rig import Bench
from _workload import JobSpec, host_id, nic_address

from cruxd.rpc.gen.crux.v1 import leader_pb2_grpc as lgrpc
from cruxd.testing import Daemon, free_port

# the leader's Status lists every agent and job: more than gRPC's default 4 MB at 10,000
STATUS_MAX_BYTES = 512 << 20


def worker_ranges(agents: int, workers: int) -> list[list[int]]:
    """Each worker's hosts: consecutive blocks, as Bench.start_workers splits them."""
    return [[int(h) for h in r] for r in np.array_split(np.arange(agents), workers)]


class RealBench(Bench):
    def start_leader(self) -> None:
        a = self.args
        topo = self.tmp / "topology.json"
        topo.write_text(json.dumps(clos3_document(clos3_pods(a.agents + 1))))
        self.address = f"127.0.0.1:{free_port()}"
        d = Daemon(self.tmp, "leader", {
            "daemon": {"roles": ["leader"], "log_level": "warning"},
            "leader": {"listen": self.address, "topology": str(topo), "debounce_ms": 50,
                       "profiling_s": 0, "agent_timeout_s": 120}}, die_with_parent=True)
        self.leader = self._started(d, "leader.log")
        self.token_file = d.root / "state" / "leader.token"
        self.channel = grpc.insecure_channel(
            self.address, options=[("grpc.max_receive_message_length", STATUS_MAX_BYTES)])
        try:
            grpc.channel_ready_future(self.channel).result(timeout=60)
        except grpc.FutureTimeoutError:
            raise RuntimeError(f"leader did not listen on {self.address}: "
                               f"{self.log_tail('leader.log')}") from None
        self.stub = lgrpc.LeaderStub(self.channel)  # type: ignore[no-untyped-call]
        self.token = self.token_file.read_text().strip()

    def start_agent(self) -> tuple[Any, Path]:
        me = self.args.agents
        run = self.tmp / "agent" / "run"
        d = Daemon(self.tmp, "agent", {
            "daemon": {"roles": ["agent"], "host_id": host_id(me), "log_level": "warning"},
            "agent": {"leader": self.address, "leader_token": str(self.token_file),
                      "addresses": [nic_address(me, p) for p in range(REAL_NICS)],
                      "gpus": 8, "socket": str(run / "agent.sock"),
                      "decision_table": str(run / "decisions")}}, die_with_parent=True)
        return self._started(d, "agent.log"), d.socket

    def start_shaped_workers(self, ranges: list[list[int]], specs: list[JobSpec],
                             per_channel: int) -> None:
        a = self.args
        ctx = mp.get_context("spawn")
        for hosts in ranges:
            mine, theirs = ctx.Pipe()
            mine_set = set(hosts)
            parts = [s for s in specs if mine_set.intersection(s.hosts)]
            p = ctx.Process(target=worker_main, daemon=True,
                            args=(theirs, self.address, hosts, a.agents, len(specs), a.seed,
                                  a.report_interval, True, self.token, parts,
                                  (REAL_NICS, REAL_NIC_GBPS), per_channel))
            p.start()
            self.workers.append((p, mine))
        for _, conn in self.workers:
            if not conn.poll(120):
                raise RuntimeError("a worker process did not start")
            conn.recv()
