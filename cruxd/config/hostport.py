"""`host:port` text as written in configuration and on command lines.

One parser for every address crux reads, so `[::1]:7470`, `10.0.0.1:7470` and
`leader-1.example:7470` mean the same everywhere and a typo fails before any socket
is opened. IPv6 literals need brackets: without them the last ':' would be ambiguous.
"""

from __future__ import annotations

import ipaddress
import re

_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def parse_hostport(text: str) -> tuple[str, int]:
    """(host, port) from `host:port`; port 0..65535 (0: let the OS pick). ValueError if bad.

    The host comes back as written, without brackets; it is checked to be an IPv4
    address, a bracketed IPv6 address or a DNS name, not resolved.
    """
    if text.startswith("["):
        host, close, rest = text[1:].partition("]")
        if not (close and rest.startswith(":")):
            raise ValueError(f"expected [IPv6 address]:port, got {text!r}")
        port_text = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} in brackets is not an IPv6 address") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"expected host:port, got {text!r}")
        if ":" in host:
            raise ValueError(f"an IPv6 address needs brackets, as in [{host}]:{port_text}")
        _check_name(host)
    if not port_text:
        raise ValueError(f"no port after the host in {text!r}")
    if not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"port {port_text!r} is not a number")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"port {port} is out of range [0, 65535]")
    return host, port


def format_hostport(host: str, port: int) -> str:
    """The inverse of parse_hostport: brackets around IPv6 literals."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_name(host: str) -> None:
    if not host:
        raise ValueError("the host is empty")
    labels = host.split(".")
    # All-numeric names are IPv4 attempts: '10.0.0.256' is a typo, not a hostname.
    if all(label.isascii() and label.isdigit() for label in labels):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv4 address") from None
        return
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"{host!r} is not a valid host name or address")
