"""Validation of what crosses a trust boundary: agents' reports, job registrations.

Every check names the field (`jobs[2].measurement.comm_s`) so a rejected
message can be logged and answered with INVALID_ARGUMENT in one line. A message
is accepted whole or not at all: nothing of a bad report reaches the leader.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Hashable, Iterable

from cruxd.control.job_claims import valid_claim
from cruxd.control.records import AgentReport, HostPlan, LocalJob, Measurement
from cruxd.errors import UsageError
from cruxd.model.view import TcpPortSet

# Job ids end up NUL-padded in 64-byte decision-table slots and in file names.
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,62}")
_HOST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")

MAX_GPUS = 4096
MAX_NODES = 1_000_000
MAX_JOBS_PER_HOST = 4096
MAX_NICS = 64
MAX_PATH_TABLES = 100_000
MAX_PATHS_PER_PEER = 256
MAX_HOPS = 16
MAX_SPORTS = 64
MAX_TCP_SPORTS = 8  # the TCP ports a decision-table entry holds per peer
# TCP destination ports probed onto one path: the [probing] tcp_dport and at most
# tcp_dports_per_peer (32) jobs' ports; a hostile report cannot grow a path past this
MAX_TCP_DPORTS = 33
MAX_JOB_TCP_PORTS = 16  # listening ports one job reports per host (cruxd.agent.job_ports)
MAX_LINKS = 100_000
MAX_TEXT = 256
MAX_COUNTER = 2**53  # times in ms and counters: exact in a double
# Bounds on measurements: far above any real job, far below what breaks arithmetic.
LIMITS = {
    "flops_per_iter": 1e24,
    "comm_s": 1e6,
    "period_s": 1e6,
    "compute_s": 1e6,
    "allreduce_bytes": 1e15,
}


class InvalidMessage(UsageError):
    """A message with a field out of range; `field` is its dotted path."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


def check_job_id(value: str, field: str = "job_id") -> str:
    if not _JOB_ID.fullmatch(value):
        raise InvalidMessage(field, f"{value[:80]!r} is not a job id (1-63 characters from "
                             "A-Z a-z 0-9 . _ : @ / + = -, starting with a letter or digit)")
    return value


def check_host_id(value: str, field: str = "host_id") -> str:
    if not _HOST_ID.fullmatch(value):
        raise InvalidMessage(field, f"{value[:80]!r} is not a host id (1-253 characters from "
                             "A-Z a-z 0-9 . _ : -)")
    return value


def check_address(value: str, field: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise InvalidMessage(field, f"{value[:80]!r} is not an IPv4/IPv6 address") from None


def _number(value: float, field: str, hi: float, lo: float = 0.0) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value)):
        raise InvalidMessage(field, f"{value!r} is not a finite number")
    if not lo <= value <= hi:
        raise InvalidMessage(field, f"{value!r} is out of range [{lo:g}, {hi:g}]")


def _count(n: int, field: str, hi: int) -> None:
    if n > hi:
        raise InvalidMessage(field, f"{n} entries, at most {hi} allowed")


def _text(value: str, field: str) -> None:
    if len(value) > MAX_TEXT:
        raise InvalidMessage(field, f"longer than {MAX_TEXT} characters")


def _tcp_ports(ports: tuple[int, ...], dport: int, field: str) -> None:
    """TCP-probed source ports and the destination port they were probed for."""
    _number(dport, f"{field}.tcp_dport", 65535)
    _count(len(ports), f"{field}.tcp_sports", MAX_TCP_SPORTS)
    for s, port in enumerate(ports):
        _number(port, f"{field}.tcp_sports[{s}]", 65535, 1)
    _unique(ports, f"{field}.tcp_sports")
    if ports and not dport:
        raise InvalidMessage(f"{field}.tcp_dport", "0, but tcp_sports are given: ports "
                             "are probed for a destination port")


def _tcp_sets(sets: tuple[TcpPortSet, ...], field: str) -> None:
    """A path's TCP port sets: at most MAX_TCP_DPORTS, one per destination port, each with
    at least one source port (a set without any says nothing)."""
    _count(len(sets), f"{field}.tcp", MAX_TCP_DPORTS)
    for i, t in enumerate(sets):
        where = f"{field}.tcp[{i}]"
        _number(t.dport, f"{where}.dport", 65535, 1)
        if not t.sports:
            raise InvalidMessage(f"{where}.sports", "empty: a set names the ports probed")
        _count(len(t.sports), f"{where}.sports", MAX_TCP_SPORTS)
        for s, port in enumerate(t.sports):
            _number(port, f"{where}.sports[{s}]", 65535, 1)
        _unique(t.sports, f"{where}.sports")
    _unique((t.dport for t in sets), f"{field}.tcp")


def _listen_ports(ports: tuple[int, ...], field: str) -> None:
    _count(len(ports), field, MAX_JOB_TCP_PORTS)
    for i, port in enumerate(ports):
        _number(port, f"{field}[{i}]", 65535, 1)
    _unique(ports, field)


def check_measurement(m: Measurement, field: str) -> Measurement:
    for name, hi in LIMITS.items():
        _number(getattr(m, name), f"{field}.{name}", hi)
    _text(m.source, f"{field}.source")
    return m


def check_local_job(job: LocalJob, field: str = "job") -> LocalJob:
    check_job_id(job.job_id, f"{field}.job_id")
    _number(job.gpus, f"{field}.gpus", MAX_GPUS)
    _number(job.nnodes, f"{field}.nnodes", MAX_NODES, 1)
    if job.node_rank >= job.nnodes:
        raise InvalidMessage(f"{field}.node_rank",
                             f"{job.node_rank} is not below nnodes {job.nnodes}")
    check_measurement(job.measurement, f"{field}.measurement")
    if job.qps_applied > job.qps_total:
        raise InvalidMessage(f"{field}.qps_applied",
                             f"{job.qps_applied} exceeds qps_total {job.qps_total}")
    _text(job.command, f"{field}.command")
    _number(job.tcp_ports_busy, f"{field}.tcp_ports_busy", MAX_COUNTER)
    _listen_ports(job.tcp_ports, f"{field}.tcp_ports")
    if not valid_claim(job.claim):
        raise InvalidMessage(f"{field}.claim", "neither uid:N nor key: and 32 hex digits")
    return job


def _unique(names: Iterable[Hashable], field: str) -> None:
    seen: set[Hashable] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise InvalidMessage(f"{field}[{i}]", f"duplicate {name!r}")
        seen.add(name)


def check_report(r: AgentReport, max_jobs: int = MAX_JOBS_PER_HOST) -> AgentReport:
    """`max_jobs`: the jobs one host may report (leader.max_jobs_per_host), so that one
    host cannot take the cluster-wide leader.max_jobs from the others."""
    host = r.host
    check_host_id(host.host_id, "host.host_id")
    _number(host.gpus, "host.gpus", MAX_GPUS)
    _count(len(host.nics), "host.nics", MAX_NICS)
    for i, nic in enumerate(host.nics):
        check_address(nic.address, f"host.nics[{i}].address")
        _number(nic.port, f"host.nics[{i}].port", MAX_NICS - 1)
        _number(nic.speed_gbps, f"host.nics[{i}].speed_gbps", 1e5)
        _text(nic.name, f"host.nics[{i}].name")
    for name in ("agent_version", "measurement_source", "probing_source"):
        _text(getattr(host, name), f"host.{name}")
    if len(r.jobs) > max_jobs:
        raise InvalidMessage("jobs", f"{len(r.jobs)} jobs, leader.max_jobs_per_host is "
                             f"{max_jobs}")
    _count(len(r.jobs), "jobs", MAX_JOBS_PER_HOST)
    for i, job in enumerate(r.jobs):
        check_local_job(job, f"jobs[{i}]")
    _unique((j.job_id for j in r.jobs), "jobs")
    _count(len(r.paths), "paths", MAX_PATH_TABLES)
    for i, table in enumerate(r.paths):
        where = f"paths[{i}]"
        check_host_id(table.dst_host, f"{where}.dst_host")
        if table.dst_address:
            check_address(table.dst_address, f"{where}.dst_address")
        for name in ("probed_unix_ms", "probes_sent", "errors"):
            _number(getattr(table, name), f"{where}.{name}", MAX_COUNTER)
        _text(table.last_error, f"{where}.last_error")
        _count(len(table.paths), f"{where}.paths", MAX_PATHS_PER_PEER)
        for k, path in enumerate(table.paths):
            _count(len(path.hops), f"{where}.paths[{k}].hops", MAX_HOPS)
            for h, hop in enumerate(path.hops):
                check_host_id(hop, f"{where}.paths[{k}].hops[{h}]")
            _count(len(path.sports), f"{where}.paths[{k}].sports", MAX_SPORTS)
            for s, port in enumerate(path.sports):
                _number(port, f"{where}.paths[{k}].sports[{s}]", 65535, 1)
            _number(path.verified_unix_ms, f"{where}.paths[{k}].verified_unix_ms", MAX_COUNTER)
            _tcp_sets(path.tcp, f"{where}.paths[{k}]")
        _unique((p.hops for p in table.paths), f"{where}.paths")
    _unique((t.dst_host for t in r.paths), "paths")
    _count(len(r.links), "links", MAX_LINKS)
    for i, link in enumerate(r.links):
        _text(link.link, f"links[{i}].link")
        _number(link.utilization, f"links[{i}].utilization", 1.0)
        _number(link.congestion_events, f"links[{i}].congestion_events", MAX_COUNTER)
    return r


def check_host_plan(hp: HostPlan, host_id: str) -> HostPlan:
    """A plan an agent may write into its decision table (all of it, or none)."""
    if hp.unchanged:  # a watermark names no host (one message serves them all) and no job
        if hp.host_id not in ("", host_id):
            raise InvalidMessage("host_id", f"plan for {hp.host_id!r}, this host is {host_id!r}")
        if hp.jobs or hp.reprobe:
            raise InvalidMessage("unchanged", "a watermark carries no jobs and no reprobe")
        # base == generation: a new stream's first message to a host that holds the
        # current plan already (a new leader resumes its predecessor's generation)
        if not 0 < hp.base_generation <= hp.generation:
            raise InvalidMessage("base_generation", f"{hp.base_generation} is above "
                                 f"generation {hp.generation}")
        return hp
    if hp.host_id != host_id:
        raise InvalidMessage("host_id", f"plan for {hp.host_id!r}, this host is {host_id!r}")
    _number(hp.levels, "levels", 255, 1)
    _count(len(hp.jobs), "jobs", MAX_JOBS_PER_HOST)
    for i, a in enumerate(hp.jobs):
        where = f"jobs[{i}]"
        check_job_id(a.job_id, f"{where}.job_id")
        _number(a.level, f"{where}.level", hp.levels - 1)
        _number(a.dscp, f"{where}.dscp", 63)
        for k, r in enumerate(a.routes):
            _number(r.sport, f"{where}.routes[{k}].sport", 65535)
            _tcp_ports(r.tcp_sports, r.tcp_dport, f"{where}.routes[{k}]")
            for n, addr in enumerate(r.peer_addresses):
                check_address(addr, f"{where}.routes[{k}].peer_addresses[{n}]")
    _unique((a.job_id for a in hp.jobs), "jobs")
    _count(len(hp.reprobe), "reprobe", MAX_PATH_TABLES)
    for i, peer in enumerate(hp.reprobe):
        check_host_id(peer, f"reprobe[{i}]")
    return hp
