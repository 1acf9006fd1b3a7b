"""What the agent's core answers local-socket requests with: domain values and refusals.

The socket edge (local_rpc.py) turns these into crux.v1 replies, so the core never
touches protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from cruxd.control.records import LocalJob, PathTable


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
