"""What the agent's core answers local-socket requests with: domain values and refusals,
and the face of the core that the socket edge sees (LocalAgent).

The socket edge (local_rpc.py) turns these into crux.v1 replies, so the core never
touches protobuf; it knows the core only through LocalAgent, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from cruxd.control.records import LocalJob, Measurement, PathTable

if TYPE_CHECKING:
    from cruxd.agent.dataplane import DataPlane
    from cruxd.agent.local_server import PeerCred
    from cruxd.agent.uplink import LeaderLink
    from cruxd.config.model import Config


class Refusal(Enum):
    INVALID = "invalid"  # a malformed request, or one the host cannot act on
    NOT_FOUND = "not found"
    NOT_ALLOWED = "not allowed"
    EXHAUSTED = "exhausted"  # a limit of this host's (agent.max_jobs, descriptors)


class Refused(Exception):
    """A local request the agent will not carry out; `str()` says why."""

    def __init__(self, reason: Refusal, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class AgentStatus:
    """The agent's own part of `cruxctl status` (the data plane's rows come from DataPlane)."""

    host_id: str
    version: str
    leader_address: str
    decision_table: str
    applied_generation: int
    measurement_source: str
    probing_source: str
    jobs: tuple[LocalJob, ...]
    peers: tuple[PathTable, ...]
    pcie_links: int
    last_plan_age_s: float  # -1: no plan seen since the agent started
    leader_reachable: bool  # as of the last call to the leader
    leader_error: str
    late_first_decisions: int = 0  # jobs that started before their first decision arrived
    terms_refused: int = 0  # plan streams whose term etcd did not record (HA)


@dataclass(frozen=True, slots=True)
class StartInfo:
    """What a launcher needs before a job starts: where its decisions appear, how long to
    wait for the first one, and whether the job is registered here at all."""

    host_id: str
    decision_table: str
    start_wait_s: float
    job_registered: bool


class LocalAgent(Protocol):
    """The agent core as its local socket uses it (core.Agent)."""

    config: Config
    link: LeaderLink
    dataplane: DataPlane

    def register(self, job: LocalJob, hints: Measurement, cred: PeerCred) -> LocalJob: ...

    def deregister(self, job_id: str, cred: PeerCred) -> None: ...

    def local_jobs(self) -> list[LocalJob]: ...

    def status(self) -> AgentStatus: ...

    def start_info(self, job_id: str) -> StartInfo: ...
