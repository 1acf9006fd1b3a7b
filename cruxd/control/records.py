"""Records exchanged between agents and the leader, as domain dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum

from cruxd.model.view import TcpPortSet
from transport.roce import tos


class JobState(IntEnum):
    """Mirrors crux.v1.JobState (same numbers)."""

    UNSPECIFIED = 0
    PROFILING = 1
    SCHEDULED = 2
    QUEUED = 3
    EXPIRED = 4
    UNMEASURED = 5

    @property
    def label(self) -> str:
        return self.name.lower()


# Measurement.source of figures a job declared at registration: nobody measured them
DECLARED_SOURCE = "hints"
# Who picks the fabric path of a job's traffic ([leader] path_selection): crux, by the source
# ports its agents probed onto the path it chose; or the fabric (adaptive routing, packet
# spraying), where a steered port buys nothing, so crux decides levels and DSCP only.
PATHS_BY_CRUX = "crux"
PATHS_BY_FABRIC = "fabric"
PATH_SELECTIONS = (PATHS_BY_CRUX, PATHS_BY_FABRIC)


FIGURES = ("flops_per_iter", "comm_s", "period_s", "compute_s", "allreduce_bytes")


@dataclass(frozen=True, slots=True)
class Measurement:
    """Per-iteration figures of a job on one host; 0 means unknown."""

    flops_per_iter: float = 0.0  # W_j share of this host's GPUs
    comm_s: float = 0.0  # t_j seen from this host
    period_s: float = 0.0
    compute_s: float = 0.0
    allreduce_bytes: float = 0.0
    source: str = ""

    @property
    def known(self) -> bool:
        return self.flops_per_iter > 0

    def moved(self, other: Measurement, tolerance: float) -> bool:
        """Some figure of `other` is known where this one's is not (or the reverse), or
        moved by more than `tolerance` of this one's: the leader's change_threshold and the
        agent's report_change judge by this same rule."""
        for name in FIGURES:
            x, y = getattr(self, name), getattr(other, name)
            if (x == 0) != (y == 0) or (x and abs(y - x) > tolerance * abs(x)):
                return True
        return False


@dataclass(frozen=True, slots=True)
class LocalJob:
    job_id: str
    gpus: int
    node_rank: int = 0
    nnodes: int = 1
    registered_unix_ms: int = 0
    measurement: Measurement = Measurement()
    qps_applied: int = 0
    qps_total: int = 0
    command: str = ""
    request_profiling: bool = False  # its behaviour changed since it was profiled
    # TCP connects that got a kernel port: every decided port of the route was in use
    tcp_ports_busy: int = 0
    # TCP ports it listens on at this host: declared (crux-run --tcp-port) first, then
    # those the interposer saw it listen on; peers probe toward them (cruxd.agent.job_ports)
    tcp_ports: tuple[int, ...] = ()
    # who this part is: "uid:N" or "key:<digest>" (cruxd.control.job_claims); "": an agent
    # from before claims, merged with any part
    claim: str = ""


@dataclass(frozen=True, slots=True)
class Nic:
    name: str
    address: str
    port: int
    speed_gbps: float = 0.0


@dataclass(frozen=True, slots=True)
class HostInventory:
    host_id: str
    agent_version: str = ""
    gpus: int = 0
    nics: tuple[Nic, ...] = ()
    measurement_source: str = ""
    probing_source: str = ""

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(n.address for n in self.nics)


@dataclass(frozen=True, slots=True)
class ProbedPath:
    hops: tuple[str, ...]
    sports: tuple[int, ...]
    verified_unix_ms: int = 0  # when a probe last confirmed it
    # per TCP destination port probed toward the peer, the source ports onto this path
    tcp: tuple[TcpPortSet, ...] = ()


@dataclass(frozen=True, slots=True)
class PathTable:
    dst_host: str
    paths: tuple[ProbedPath, ...]
    dst_address: str = ""
    probed_unix_ms: int = 0  # when the last sweep toward dst_host ended
    probes_sent: int = 0
    errors: int = 0  # replies ignored or missing in that sweep
    last_error: str = ""

    def shape(self) -> tuple[object, ...]:
        """What planning depends on: a re-verified table with the same paths and
        ports has the same shape, so re-probing alone does not re-plan."""
        return (self.dst_address, tuple((p.hops, p.sports, p.tcp) for p in self.paths))


@dataclass(frozen=True, slots=True)
class LinkObservation:
    link: str
    utilization: float = 0.0
    congestion_events: int = 0


@dataclass(frozen=True, slots=True)
class AgentReport:
    host: HostInventory
    jobs: tuple[LocalJob, ...] = ()
    paths: tuple[PathTable, ...] = ()
    links: tuple[LinkObservation, ...] = ()
    applied_generation: int = 0
    seq: int = 0
    incarnation: int = 0  # random per agent process: (incarnation, seq) names the report


@dataclass(frozen=True, slots=True)
class PeerRoute:
    src_host: str
    peer_host: str
    peer_addresses: tuple[str, ...]
    sport: int = 0  # 0: no probed port, ECMP decides
    hops: tuple[str, ...] = ()
    nic_port: int = -1
    # the job's listening port at peer_host (0: none known): TCP connections to it leave
    # from one of tcp_sports, and the source host's agent probes toward it
    tcp_dport: int = 0
    tcp_sports: tuple[int, ...] = ()  # the chosen path's ports probed for it; (): ECMP


@dataclass(frozen=True, slots=True)
class JobAssignment:
    """The leader's decision for one job (the routes: those leaving one host)."""

    job_id: str
    state: JobState
    intensity: float = 0.0
    k: float = 1.0
    rank: int = 0
    level: int = 0
    dscp: int = 0
    hosts: tuple[str, ...] = ()
    gpus: int = 0
    routes: tuple[PeerRoute, ...] = ()
    note: str = ""
    # not every host of the job reported yet, or no probed path between them: a fuller
    # decision follows on its own (crux-run waits for it before starting the job)
    provisional: bool = False

    @property
    def traffic_class(self) -> int:
        return tos(self.dscp)

    def for_host(self, host: str) -> JobAssignment:
        """The same decision, keeping only the routes leaving `host`."""
        return replace(self, routes=tuple(r for r in self.routes if r.src_host == host))


@dataclass(frozen=True, slots=True)
class HostPlan:
    generation: int
    host_id: str
    planned_unix_ms: int
    levels: int
    jobs: tuple[JobAssignment, ...] = field(default=())
    reprobe: tuple[str, ...] = ()  # peers to probe again: a link on their paths went down
    term: int = 0  # the leader's term (HA: its election's etcd revision); agents refuse older
    # a watermark: decisions unchanged since base_generation (jobs, reprobe empty)
    unchanged: bool = False
    base_generation: int = 0
    path_selection: str = PATHS_BY_CRUX  # PATHS_BY_FABRIC: no ports in routes, no sweeps
