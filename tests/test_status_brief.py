"""A brief Status (StatusRequest.brief): the leader's own fields, without its agents, jobs and
refused claims, which at 10,000 hosts are about 5 MB. A real in-process leader over gRPC on
loopback, with two agents and their jobs planned."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from cruxd.control.host_plans import PublishedPlan
from cruxd.leader.auth import METADATA_KEY
from cruxd.leader.handlers import add_leader
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb
from cruxd.rpc.gen.crux.v1 import leader_pb2_grpc as lgrpc
from tests.inproc_leader import inproc_leader


def _report(host: str, job: str) -> lpb.AgentReport:
    return lpb.AgentReport(schema=cpb.SCHEMA_REVISION_CURRENT,
                           host=lpb.HostInventory(host_id=host, gpus=8), jobs=[
        cpb.LocalJob(job_id=job, gpus=1, nnodes=1,
                     measurement=cpb.JobMeasurement(flops_per_iter=1e12, comm_s=0.1,
                                                    period_s=1.0, compute_s=0.5))])


def test_a_brief_status_has_the_leaders_fields_and_no_lists(tmp_path: Path) -> None:
    plans: list[PublishedPlan] = []

    async def run() -> tuple[cpb.ClusterStatus, cpb.ClusterStatus]:
        leader = inproc_leader(tmp_path, plans)
        leader.start()
        server = grpc.aio.server()
        add_leader(leader, server, lambda rpc, field: None)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        md = ((METADATA_KEY, f"Bearer {leader.gate.token}"),)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = lgrpc.LeaderStub(ch)  # type: ignore[no-untyped-call]
                for host, job in (("h0", "a"), ("h1", "b")):
                    await stub.Report(_report(host, job), metadata=md)
                for _ in range(200):
                    if plans and len(plans[-1].jobs) == 2:
                        break
                    await asyncio.sleep(0.02)
                full = await stub.Status(lpb.StatusRequest(), metadata=md)
                brief = await stub.Status(lpb.StatusRequest(brief=True), metadata=md)
                return full, brief
        finally:
            await server.stop(None)
            await leader.stop()

    full, brief = asyncio.run(run())
    assert plans and len(plans[-1].jobs) == 2
    assert [a.host_id for a in full.agents] == ["h0", "h1"]
    assert [j.job_id for j in full.jobs] == ["a", "b"]
    assert not brief.agents and not brief.jobs and not brief.refused_claims
    # everything else as the full answer says it
    for f in ("agents", "jobs", "refused_claims"):
        full.ClearField(f)  # type: ignore[arg-type]
    assert full.plan_generation > 0
    assert brief == full
    assert brief.takeovers == {"copy": 0, "decoded": 0}  # the leader's own figures


def test_status_says_how_this_candidate_took_over_and_whom_it_holds() -> None:
    """`cruxctl status`: the takeovers by where the state came from (decoded is the slower
    one), and the calls a standby holds for agents that lost their leader; also in the
    brief answer, which carries the leader's own fields."""
    from rich.console import Console

    from cruxd.cli.status_view import print_status

    cluster = cpb.ClusterStatus(leader_host="l1", ha_role="standby", term=7,
                                takeovers={"copy": 1, "decoded": 2}, refusals_holding=12)
    console = Console(record=True, width=300)
    print_status(console, None, cluster, 0.0)
    assert ("HA: standby, term 7; active leader: none elected; took over 3 time(s): 1 from "
            "the standby's copy, 2 decoded from etcd; holding 12 call(s) of agents that "
            "lost their leader") in console.export_text()
    console = Console(record=True, width=300)
    print_status(console, None, cpb.ClusterStatus(leader_host="l1", ha_role="active", term=7),
                 0.0)
    assert "HA: active, term 7\n" in console.export_text()
