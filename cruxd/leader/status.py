"""The leader's answer to `cruxctl status`: agents, jobs and the last plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cruxd import __version__
from cruxd.control.job_notes import ENDED_NOTE, LOST_NOTE
from cruxd.control.records import JobAssignment, JobState
from cruxd.rpc import convert
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.scheduler.dscp import level_dscp

if TYPE_CHECKING:
    from cruxd.config.model import LeaderConfig
    from cruxd.leader.view import LeaderView


def _fabric_levels(out: cpb.ClusterStatus, lc: LeaderConfig) -> None:
    """Where the levels land on the fabric: what an operator checks against the switches."""
    pfc = lc.lossless_priorities
    out.lossless = "unchecked" if pfc is None else "declared" if pfc else "lossy"
    out.fabric_levels.extend(cpb.FabricLevel(dscp=d, priority=d >> 3,
                                             lossless=pfc is not None and d >> 3 in pfc)
                             for d in level_dscp(lc.levels, lc.dscp))


def cluster_status(leader: LeaderView, hostname: str, brief: bool = False) -> cpb.ClusterStatus:
    """`brief`: the leader's own fields only (StatusRequest.brief)."""
    now = leader.clock()
    st = leader.state
    out = cpb.ClusterStatus(schema=convert.SCHEMA, leader_host=hostname,
                            leader_version=__version__, leader_address=leader.address,
                            levels=leader.config.leader.levels,
                            ha_role="" if leader.role == "single" else leader.role,
                            term=leader.term, active_leader=leader.active_leader,
                            not_publishing=leader.not_publishing,
                            path_selection=leader.config.leader.path_selection)
    _fabric_levels(out, leader.config.leader)
    out.claims_refused_total = st.claims_refused_total
    out.takeovers.update(leader.takeovers)
    out.refusals_holding = leader.refusals_holding
    if brief:
        _plan_fields(out, leader)
        return out
    out.refused_claims.extend(cpb.RefusedClaim(job_id=jid, host_id=r.host, reason=r.reason)
                              for jid, parts in sorted(st.refused.items()) for r in parts)
    for host, rec in sorted(st.agents.items()):
        inv = rec.inventory
        out.agents.append(cpb.AgentStatus(
            host_id=host, version=inv.agent_version, last_report_age_s=now - rec.last_report,
            addresses=inv.addresses, gpus=inv.gpus, measurement_source=inv.measurement_source,
            probing_source=inv.probing_source, applied_generation=rec.applied_generation,
            expired=rec.expired, connected=host in st.streams,
            peers=[convert.peer_paths_to_pb(t) for _, t in sorted(rec.paths.items())],
            links=[convert.link_to_pb(lk) for lk in rec.links]))
    plan = leader.plan
    planned = {a.job_id: a for a in plan.jobs} if plan else {}
    applied: dict[str, tuple[int, int]] = {}  # job -> (qps applied, total) summed over hosts
    busy = ports_busy(leader)
    for agent in st.live_agents().values():
        for j in agent.jobs.values():
            done, total = applied.get(j.job_id, (0, 0))
            applied[j.job_id] = (done + j.qps_applied, total + j.qps_total)
    merged = {m.job_id: m.measurement for m in st.merged_jobs()}
    for jid, job in sorted(st.jobs.items()):
        decided = planned.get(jid)
        if job.expired_at is not None:
            decided = JobAssignment(jid, JobState.EXPIRED,
                                    note=ENDED_NOTE if job.ended else LOST_NOTE)
        elif decided is None:
            decided = JobAssignment(jid, JobState.QUEUED, note="waiting for the next plan")
        msg = convert.assignment_to_pb(decided)
        msg.qps_applied, msg.qps_total = applied.get(jid, (0, 0))
        msg.decision_changes = leader.replans.decision_changes.get(jid, 0)
        msg.tcp_ports_busy = busy.get(jid, 0)
        if jid in merged:
            msg.measurement.CopyFrom(convert.measurement_to_pb(merged[jid]))
        out.jobs.append(msg)
    _plan_fields(out, leader)
    return out


def _plan_fields(out: cpb.ClusterStatus, leader: LeaderView) -> None:
    plan = leader.plan
    if plan is not None:
        out.plan_generation = plan.generation
        out.planned_unix_ms = plan.planned_unix_ms
        out.plan_latency_s = plan.latency_s
        out.plan_causes.extend(plan.causes)
        out.topology = plan.topology
    out.replans.update(leader.replans.replans)
    out.plans_unchanged = leader.replans.unchanged


def ports_busy(leader: LeaderView) -> dict[str, int]:
    """Per job, its TCP connects that fell back to kernel ports for busy decided ports,
    summed over the live agents' last reports (status and the leader's metrics)."""
    out: dict[str, int] = {}
    for agent in leader.state.live_agents().values():
        for j in agent.jobs.values():
            if j.tcp_ports_busy:
                out[j.job_id] = out.get(j.job_id, 0) + j.tcp_ports_busy
    return out
