"""The TCP backend: steer a TCP collective connection by its decision.

The seed's CoCoLib carries RoCEv2 and TCP, so crux steers TCP collectives too: the
source port is bound before connect (it picks the ECMP path, as a RoCEv2 QP's flow
label does) and IP_TOS carries the level's DSCP. DSCP can change on a live
connection; the source port cannot, so a re-path of a TCP flow needs a new
connection, which the caller decides.

Fails open like the shim: no table, no entry or a table that cannot be read leaves
the socket as the application would have made it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from transport.decision_table import Decision, TableError, TableReader


@dataclass(frozen=True, slots=True)
class Steering:
    sport: int = 0  # 0: the kernel picks (ECMP decides)
    dscp: int = 0
    reason: str = ""  # why nothing was applied, when nothing was

    @property
    def tos(self) -> int:
        return self.dscp << 2  # DSCP is the TOS byte's upper six bits


def steering_for(table_path: str, job_id: str, peer: str) -> Steering:
    """The decision for (job, peer): the per-peer entry, else the job-wide one."""
    try:
        with TableReader(table_path) as t:
            d: Decision | None = t.lookup(job_id, peer) or t.lookup(job_id)
    except (OSError, TableError) as exc:
        return Steering(reason=f"decision table {table_path}: {exc}")
    if d is None:
        return Steering(reason=f"no decision for job {job_id!r} toward {peer}")
    return Steering(d.sport, d.dscp)


def set_dscp(sock: socket.socket, dscp: int) -> None:
    """Mark a (live) socket's packets with `dscp`."""
    if not 0 <= dscp <= 63:
        raise ValueError(f"dscp must be 0..63, got {dscp}")
    level = socket.IPPROTO_IPV6 if sock.family == socket.AF_INET6 else socket.IPPROTO_IP
    opt = socket.IPV6_TCLASS if sock.family == socket.AF_INET6 else socket.IP_TOS
    sock.setsockopt(level, opt, dscp << 2)


def connect(peer: str, port: int, steering: Steering = Steering(), *, src: str = "",
            timeout: float | None = 10.0) -> socket.socket:
    """A TCP connection to (peer, port) leaving from `steering.sport` with its DSCP.
    A source port already in use falls back to the kernel's choice (fail open)."""
    family = socket.AF_INET6 if ":" in peer else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        if steering.dscp:
            set_dscp(sock, steering.dscp)
        if steering.sport or src:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((src, steering.sport))
            except OSError:
                sock.close()
                return connect(peer, port, Steering(0, steering.dscp, "source port busy"),
                               src=src, timeout=timeout)
        sock.connect((peer, port))
        return sock
    except BaseException:
        sock.close()
        raise
