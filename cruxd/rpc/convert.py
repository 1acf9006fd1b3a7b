"""Protobuf messages <-> domain records: the only place both kinds meet.

Decoding never trusts the peer: the records it builds still go through
`cruxd.control.validate` before anything acts on them.
"""

from __future__ import annotations

from typing import cast

from cruxd.control.records import (
    PATHS_BY_CRUX,
    AgentReport,
    HostInventory,
    HostPlan,
    JobAssignment,
    JobState,
    LinkObservation,
    LocalJob,
    Measurement,
    Nic,
    PathTable,
    PeerRoute,
    ProbedPath,
)
from cruxd.control.validate import InvalidMessage
from cruxd.model.view import TcpPortSet
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb

SCHEMA = cpb.SCHEMA_REVISION_CURRENT


def measurement_to_pb(m: Measurement) -> cpb.JobMeasurement:
    return cpb.JobMeasurement(flops_per_iter=m.flops_per_iter, comm_s=m.comm_s,
                              period_s=m.period_s, compute_s=m.compute_s,
                              allreduce_bytes=m.allreduce_bytes, source=m.source)


def measurement_from_pb(p: cpb.JobMeasurement) -> Measurement:
    return Measurement(p.flops_per_iter, p.comm_s, p.period_s, p.compute_s,
                       p.allreduce_bytes, p.source)


def local_job_to_pb(j: LocalJob) -> cpb.LocalJob:
    return cpb.LocalJob(job_id=j.job_id, gpus=j.gpus, node_rank=j.node_rank, nnodes=j.nnodes,
                        registered_unix_ms=j.registered_unix_ms,
                        measurement=measurement_to_pb(j.measurement),
                        qps_applied=j.qps_applied, qps_total=j.qps_total, command=j.command,
                        request_profiling=j.request_profiling,
                        tcp_ports_busy=j.tcp_ports_busy, tcp_ports=j.tcp_ports,
                        claim=j.claim)


def local_job_from_pb(p: cpb.LocalJob) -> LocalJob:
    return LocalJob(p.job_id, p.gpus, p.node_rank, p.nnodes or 1, p.registered_unix_ms,
                    measurement_from_pb(p.measurement), p.qps_applied, p.qps_total, p.command,
                    p.request_profiling, p.tcp_ports_busy, tuple(p.tcp_ports), p.claim)


def report_to_pb(r: AgentReport) -> lpb.AgentReport:
    h = r.host
    return lpb.AgentReport(
        schema=SCHEMA,
        host=lpb.HostInventory(
            host_id=h.host_id, agent_version=h.agent_version, gpus=h.gpus,
            nics=[lpb.Nic(name=n.name, address=n.address, port=n.port, speed_gbps=n.speed_gbps)
                  for n in h.nics],
            measurement_source=h.measurement_source, probing_source=h.probing_source),
        jobs=[local_job_to_pb(j) for j in r.jobs],
        paths=[path_table_to_pb(t) for t in r.paths],
        links=[link_to_pb(lk) for lk in r.links],
        applied_generation=r.applied_generation, seq=r.seq,
        incarnation=r.incarnation)


def link_to_pb(lk: LinkObservation) -> cpb.LinkObservation:
    return cpb.LinkObservation(link=lk.link, utilization=lk.utilization,
                               congestion_events=lk.congestion_events)


def report_from_pb(p: lpb.AgentReport) -> AgentReport:
    check_schema(p.schema)
    h = p.host
    inv = HostInventory(h.host_id, h.agent_version, h.gpus,
                        tuple(Nic(n.name, n.address, n.port, n.speed_gbps) for n in h.nics),
                        h.measurement_source, h.probing_source)
    return AgentReport(
        host=inv,
        jobs=tuple(local_job_from_pb(j) for j in p.jobs),
        paths=tuple(path_table_from_pb(t) for t in p.paths),
        links=tuple(LinkObservation(lk.link, lk.utilization, lk.congestion_events)
                    for lk in p.links),
        applied_generation=p.applied_generation, seq=p.seq,
        incarnation=p.incarnation)


def path_table_to_pb(t: PathTable) -> lpb.PathTable:
    return lpb.PathTable(
        dst_host=t.dst_host, dst_address=t.dst_address, probed_unix_ms=t.probed_unix_ms,
        probes_sent=t.probes_sent, errors=t.errors, last_error=t.last_error,
        paths=[probed_path_to_pb(p) for p in t.paths])


def probed_path_to_pb(p: ProbedPath) -> lpb.ProbedPath:
    # fields 4/5 repeat the first set for a leader that reads no `tcp` (one port per agent)
    first = p.tcp[0] if p.tcp else TcpPortSet(0, ())
    return lpb.ProbedPath(hops=p.hops, sports=p.sports, verified_unix_ms=p.verified_unix_ms,
                          tcp_sports=first.sports, tcp_dport=first.dport,
                          tcp=[lpb.TcpPortSet(dport=t.dport, sports=t.sports) for t in p.tcp])


def probed_path_from_pb(x: lpb.ProbedPath) -> ProbedPath:
    if x.tcp:
        tcp = tuple(TcpPortSet(t.dport, tuple(t.sports)) for t in x.tcp)
    else:  # an agent from before per-job ports: its one port, in fields 4/5
        tcp = (TcpPortSet(x.tcp_dport, tuple(x.tcp_sports)),) if x.tcp_sports else ()
    return ProbedPath(tuple(x.hops), tuple(x.sports), x.verified_unix_ms, tcp)


def path_table_from_pb(t: lpb.PathTable) -> PathTable:
    return PathTable(
        t.dst_host, tuple(probed_path_from_pb(x) for x in t.paths),
        t.dst_address, t.probed_unix_ms, t.probes_sent, t.errors, t.last_error)


def peer_paths_to_pb(t: PathTable) -> cpb.PeerPaths:
    """A path table as status shows it: counts, not ports."""
    return cpb.PeerPaths(peer_host=t.dst_host, address=t.dst_address, paths=len(t.paths),
                         probed_unix_ms=t.probed_unix_ms, probes_sent=t.probes_sent,
                         errors=t.errors, last_error=t.last_error)


def check_schema(revision: int) -> None:
    """Revision 0 is a peer that did not say; newer revisions only add fields."""
    if revision < 0:
        raise InvalidMessage("schema", f"unknown schema revision {revision}")


def route_to_pb(r: PeerRoute) -> cpb.PeerRoute:
    return cpb.PeerRoute(peer_host=r.peer_host, peer_addresses=r.peer_addresses, sport=r.sport,
                         hops=r.hops, nic_port=r.nic_port, src_host=r.src_host,
                         tcp_dport=r.tcp_dport, tcp_sports=r.tcp_sports)


def assignment_to_pb(a: JobAssignment) -> cpb.JobDecision:
    return cpb.JobDecision(job_id=a.job_id, state=cast(cpb.JobState, int(a.state)),
                           intensity=a.intensity, k=a.k, rank=a.rank, level=a.level, dscp=a.dscp,
                           traffic_class=a.traffic_class,
                           routes=[route_to_pb(r) for r in a.routes], hosts=a.hosts,
                           gpus=a.gpus, note=a.note, provisional=a.provisional)


def assignment_from_pb(p: cpb.JobDecision) -> JobAssignment:
    try:
        state = JobState(p.state)
    except ValueError:
        state = JobState.UNSPECIFIED  # a newer leader's state: keep the decision
    return JobAssignment(
        p.job_id, state, p.intensity, p.k, p.rank, p.level, p.dscp, tuple(p.hosts), p.gpus,
        tuple(PeerRoute(r.src_host, r.peer_host, tuple(r.peer_addresses), r.sport,
                        tuple(r.hops), r.nic_port, r.tcp_dport, tuple(r.tcp_sports))
              for r in p.routes), p.note, p.provisional)


def host_plan_to_pb(hp: HostPlan) -> lpb.HostPlan:
    return lpb.HostPlan(schema=SCHEMA, generation=hp.generation, host_id=hp.host_id,
                        planned_unix_ms=hp.planned_unix_ms, levels=hp.levels,
                        jobs=[assignment_to_pb(a) for a in hp.jobs], reprobe=hp.reprobe,
                        term=hp.term, unchanged=hp.unchanged,
                        base_generation=hp.base_generation, path_selection=hp.path_selection)


def host_plan_from_pb(p: lpb.HostPlan) -> HostPlan:
    check_schema(p.schema)
    return HostPlan(p.generation, p.host_id, p.planned_unix_ms, p.levels,
                    tuple(assignment_from_pb(j) for j in p.jobs), tuple(p.reprobe),
                    p.term, p.unchanged, p.base_generation,
                    p.path_selection or PATHS_BY_CRUX)  # "": a leader from before the key
