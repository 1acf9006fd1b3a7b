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

from transport.roce import tos
from transport.steering import Steering, steering_for

__all__ = ["Steering", "connect", "set_dscp", "steering_for"]


def set_dscp(sock: socket.socket, dscp: int) -> None:
    """Mark a (live) socket's packets with `dscp`."""
    if not 0 <= dscp <= 63:
        raise ValueError(f"dscp must be 0..63, got {dscp}")
    level = socket.IPPROTO_IPV6 if sock.family == socket.AF_INET6 else socket.IPPROTO_IP
    opt = socket.IPV6_TCLASS if sock.family == socket.AF_INET6 else socket.IP_TOS
    sock.setsockopt(level, opt, tos(dscp))


def connect(peer: str, port: int, steering: Steering | None = None, *, src: str = "",
            timeout: float | None = 10.0) -> socket.socket:
    """A TCP connection to (peer, port) leaving from `steering.sport` with its DSCP.
    A source port already in use falls back to the kernel's choice (fail open)."""
    steering = steering or Steering()
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
