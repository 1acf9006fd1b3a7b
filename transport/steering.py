"""The steering a connection gets from the decision table: source port and DSCP.

Shared by the transports (TCP in transport/tcp.py, RoCEv2 verbs in transport/verbs.py); the C
shim does the same lookup in crux_decide.c. A per-peer decision wins over the job-wide one, and
anything unusable yields an empty Steering whose `reason` says why (fail open).
"""

from __future__ import annotations

from dataclasses import dataclass

from transport.decision_table import Decision, TableError, TableReader
from transport.roce import tos


@dataclass(frozen=True, slots=True)
class Steering:
    sport: int = 0  # 0: the kernel or NIC picks (ECMP decides)
    dscp: int = 0
    reason: str = ""  # why nothing was applied, when nothing was
    traffic_class: int = -1  # RoCE GRH traffic class; -1: derive from dscp

    @property
    def tos(self) -> int:
        return tos(self.dscp)

    @property
    def tclass(self) -> int:
        """The GRH traffic class to put on a RoCE QP (the IP TOS byte on the wire)."""
        return self.traffic_class if self.traffic_class >= 0 else self.tos


def steering_for(table_path: str, job_id: str, peer: str) -> Steering:
    """The decision for (job, peer): the per-peer entry, else the job-wide one."""
    try:
        with TableReader(table_path) as t:
            d: Decision | None = t.decision_for(job_id, peer)
    except (OSError, TableError) as exc:
        return Steering(reason=f"decision table {table_path}: {exc}")
    if d is None:
        return Steering(reason=f"no decision for job {job_id!r} toward {peer}")
    return Steering(d.sport, d.dscp, traffic_class=d.traffic_class)
