"""An agent takes a leader's term only when etcd records it (issue 37, item 1).

The attack: whoever could write etcd's election key named a leader of their own, whose plan
of term 2^62 emptied the agents' tables, and the agents then refused every real plan until
they were restarted. Now the term is the election key's create revision, which etcd
assigns, and an agent under `ha = "etcd"` applies a plan of a new term only when etcd says
that is the active leader's term.

Real etcd (three members), a real cruxd agent process, and a hostile leader: a gRPC server of
the test's own at a configured leader address, answering reports and streaming a plan of a
term etcd never recorded, then one of the term etcd does record.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from cruxd.control.records import HostPlan, JobAssignment, JobState
from cruxd.rpc import convert
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb
from cruxd.rpc.gen.crux.v1 import leader_pb2_grpc as lgrpc
from cruxd.testing import Daemon, cruxctl, free_port, status, wait_for
from cruxd.testing.etcd_rig import EtcdCluster, etcd_missing
from transport.decision_table import TableReader

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(etcd_missing() is not None, reason=etcd_missing() or "")]
HUGE = 2**62


class HostileLeader(lgrpc.LeaderServicer):
    """Takes every report; streams the plans it is told to on each WatchPlan call."""

    def __init__(self) -> None:
        self.plans: list[HostPlan] = []  # replaced whole by the test, read per call

    def Report(self, request: object, context: object) -> lpb.ReportAck:
        return lpb.ReportAck(plan_generation=0, agent_timeout_s=30)

    def WatchPlan(self, request: object, context: object) -> Iterator[lpb.HostPlan]:
        for hp in self.plans:
            yield convert.host_plan_to_pb(hp)
        time.sleep(1.0)  # hold the stream a moment, then end it: the agent watches again


def plan(term: int, generation: int) -> HostPlan:
    job = JobAssignment("evil", JobState.SCHEDULED, level=0, dscp=26)
    return HostPlan(generation, "h1", 0, 1, (job,), term=term)


def put_election_key(endpoint: str, address: str) -> int:
    """What the attacker did through etcd's gateway: the election key names their leader.
    Returns the key's create revision (the term etcd records)."""
    import aetcd

    async def put() -> int:
        host, port = endpoint.rsplit(":", 1)
        async with aetcd.Client(host=host, port=int(port)) as c:
            await c.put(b"/crux/leader", json.dumps({"address": address,
                                                     "host": "evil"}).encode())
            got = await c.get(b"/crux/leader")
            assert got is not None
            return int(got.create_revision)

    return asyncio.run(put())


def table_jobs(path: Path) -> tuple[int, set[str]]:
    with TableReader(path) as reader:
        return reader.header().plan_generation, {e.job_id for e in reader.snapshot()}


def test_a_term_etcd_did_not_record_is_refused(tmp_path: Path) -> None:
    etcd = EtcdCluster(tmp_path).start()  # three members, as the HA tests run it
    server = grpc.server(futures.ThreadPoolExecutor(4))
    hostile = HostileLeader()
    lgrpc.add_LeaderServicer_to_server(hostile, server)  # type: ignore[no-untyped-call]
    address = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(address)
    server.start()
    agent = Daemon(tmp_path, "h1", {
        "daemon": {"roles": ["agent"]},
        "agent": {"leader": address, "probing": "none", "gpus": 8,
                  "addresses": ["10.89.0.1"], "reconnect_max_s": 0.5},
        "leader": {"ha": "etcd", "etcd_endpoints": etcd.endpoints, "etcd_insecure": True,
                   "etcd_prefix": "/crux"}})
    try:
        term = put_election_key(etcd.endpoints[0], address)
        hostile.plans = [plan(HUGE, 7)]
        agent.start()
        agent.wait_log(f"plans of term {HUGE} refused: etcd records term {term}", timeout=30)
        assert table_jobs(agent.table) == (0, set())  # nothing of it applied
        # an operator sees it: the agent's status says so, and counts it
        local = status(agent.socket)["agent"]
        assert int(local["terms_refused"]) >= 1
        text = " ".join(cruxctl("status", "--local", socket_path=agent.socket).stdout.split())
        assert "plan stream(s) refused: their leader's term is not the one etcd records" \
            in text, text
        # the same leader with the term etcd records: taken (etcd is what vouches; a
        # leader that etcd names is the leader, which is why etcd needs TLS and auth)
        hostile.plans = [plan(term, 8)]
        wait_for("the plan of etcd's term applied",
                 lambda: table_jobs(agent.table) == (8, {"evil"}), timeout=30)
        assert agent.log_text().count(f"plans of term {HUGE} refused") >= 1
        assert "Traceback" not in agent.log_text()
    finally:
        agent.stop()
        server.stop(None)
        etcd.stop()
