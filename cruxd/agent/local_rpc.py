"""The agent's local-socket edge: crux.v1.LocalRequest in, LocalReply out.

Requests are decoded into domain records for the core (core.py) and its answers encoded
back here, through cruxd.rpc.convert. What only passes through (the leader's status, plan
and hints documents; the data plane's rows, built as replies by DataPlane) stays protobuf.
"""

from __future__ import annotations

from dataclasses import replace

from cruxd.agent.local_api import AgentStatus, LocalAgent, Refusal, Refused
from cruxd.agent.local_server import PeerCred, error_reply
from cruxd.control.job_claims import DIGEST_HEX, claim_of, public
from cruxd.control.records import LocalJob
from cruxd.rpc import convert
from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.local import (
    INVALID_ARGUMENT,
    NOT_FOUND,
    PERMISSION_DENIED,
    RESOURCE_EXHAUSTED,
    UNAVAILABLE,
)

CODES = {Refusal.INVALID: INVALID_ARGUMENT, Refusal.NOT_FOUND: NOT_FOUND,
         Refusal.NOT_ALLOWED: PERMISSION_DENIED, Refusal.EXHAUSTED: RESOURCE_EXHAUSTED}
MAX_COMMAND = 256  # characters of a job's command line kept for `cruxctl status`


class LocalRpc:
    def __init__(self, agent: LocalAgent) -> None:
        self.agent = agent

    async def handle(self, req: apb.LocalRequest, cred: PeerCred) -> apb.LocalReply:
        try:
            return await self._answer(req, cred)
        except Refused as exc:
            return error_reply(CODES[exc.reason], str(exc))

    async def _answer(self, req: apb.LocalRequest, cred: PeerCred) -> apb.LocalReply:
        agent, link = self.agent, self.agent.link
        kind = req.WhichOneof("body")
        reply = apb.LocalReply(schema=cpb.SCHEMA_REVISION_CURRENT)
        if kind == "register":
            r = req.register
            job = LocalJob(r.job_id, r.gpus, r.node_rank, r.nnodes or 1,
                           command=r.command[:MAX_COMMAND], tcp_ports=tuple(r.tcp_ports),
                           claim=claim_of(r.job_key_digest[:DIGEST_HEX + 1], cred.uid))
            agent.register(job, convert.measurement_from_pb(r.hints), cred)
            reply.registered.CopyFrom(apb.RegisterReply(
                job_id=job.job_id, decision_table=str(agent.config.agent.decision_table),
                start_wait_s=agent.config.agent.start_wait_s))
        elif kind == "info":
            i = agent.start_info(req.info.job_id)
            reply.info.CopyFrom(apb.AgentInfo(
                host_id=i.host_id, decision_table=i.decision_table,
                start_wait_s=i.start_wait_s, job_registered=i.job_registered))
        elif kind == "deregister":
            agent.deregister(req.deregister.job_id, cred)
            reply.ok = True
        elif kind == "status":
            await self._status(reply.status, req.status.local_only)
        elif kind == "jobs":
            reply.jobs.jobs.extend(_shown(j) for j in agent.local_jobs())
        elif kind == "hints":
            hints, err, code = await link.hints(req.hints.format)
            if hints is None:
                return error_reply(INVALID_ARGUMENT if code == "INVALID_ARGUMENT"
                                   else UNAVAILABLE, f"leader {link.address}: {err}")
            reply.hints.CopyFrom(hints)
        elif kind == "plan":
            plan, err = await link.plan_document()
            if plan is None:
                return error_reply(UNAVAILABLE, f"leader {link.address}: {err}")
            reply.plan.CopyFrom(plan)
        else:
            return error_reply(INVALID_ARGUMENT, "empty or unknown request")
        return reply

    async def _status(self, out: apb.StatusReply, local_only: bool) -> None:
        s = self.agent.status()
        _agent_status(out.agent, s)
        dataplane = self.agent.dataplane
        overrides = dataplane.tc_overrides()  # one sysfs scan serves both fields
        out.agent.qps.extend(dataplane.qp_status(overrides))
        out.agent.sock_connects.extend(dataplane.sock_status())
        out.agent.nccl_profilers.extend(dataplane.nccl_status())
        out.agent.nic_tc_overrides.extend(overrides)
        out.agent.pcie_takeovers.CopyFrom(apb.PcieTakeovers(**dataplane.pcie_takeovers()))
        if local_only:
            return
        cluster, err = await self.agent.link.cluster_status()
        out.agent.leader_reachable = cluster is not None
        out.agent.leader_error = err
        if cluster is not None:
            out.cluster.CopyFrom(cluster)


def _agent_status(a: apb.LocalAgentStatus, s: AgentStatus) -> None:
    a.host_id, a.version, a.leader_address = s.host_id, s.version, s.leader_address
    a.decision_table = s.decision_table
    a.applied_generation = s.applied_generation
    a.measurement_source, a.probing_source = s.measurement_source, s.probing_source
    a.jobs.extend(_shown(j) for j in s.jobs)
    a.peers.extend(convert.peer_paths_to_pb(t) for t in s.peers)
    a.pcie_links = s.pcie_links
    a.last_plan_age_s = s.last_plan_age_s
    a.leader_reachable, a.leader_error = s.leader_reachable, s.leader_error
    a.late_first_decisions = s.late_first_decisions
    a.terms_refused = s.terms_refused


def _shown(job: LocalJob) -> cpb.LocalJob:
    """A local job for a local client: its claim without a key's digest (job_claims.public)."""
    return convert.local_job_to_pb(replace(job, claim=public(job.claim)))
