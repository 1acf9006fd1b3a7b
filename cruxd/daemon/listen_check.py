"""Whether the leader's gRPC port can be bound, asked with a plain socket before gRPC is.

gRPC's C core logs its own `E... add_port.cc] Failed to add port` line to stderr
before `add_insecure_port` raises, so the operator saw that ahead of cruxd's one-line
refusal. Binding a plain socket the way gRPC will (SO_REUSEADDR, no SO_REUSEPORT: the
server is created with grpc.so_reuseport 0; IPv6 sockets dual-stack, as gRPC's wildcard
listener is) finds a taken or foreign address first and says why (the errno's text).
A port taken between this check and gRPC's own bind still fails there, with gRPC's line.
"""

from __future__ import annotations

import errno
import socket

from cruxd.config.hostport import parse_hostport


def bind_problem(listen: str) -> str | None:
    """None when `listen` (host:port) can be bound; else why not, as one phrase.

    A name that resolves to several addresses is usable when one binds and none is in
    use: gRPC would serve on the free ones alone, and clients dialling the name would
    reach the other process half the time (the split SO_REUSEPORT would have made)."""
    host, port = parse_hostport(listen)
    if port == 0:  # the kernel picks a free one
        return None
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve {host}: {exc.strerror}"
    why, bound = "", False
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                s.bind(address)
                bound = True
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return exc.strerror or "address in use"
            why = why or (exc.strerror or str(exc))
    return None if bound else why or "no address to bind"
