"""gRPC credentials from the [tls] paths: mutual TLS when all three are set.

The leader requires a client certificate signed by the CA; agents check the
leader's certificate against the same CA. Files are read at start (and reload).
"""

from __future__ import annotations

from pathlib import Path

import grpc

from cruxd.config.model import TlsConfig
from cruxd.errors import CruxError

KEEPALIVE = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


def _read(path: Path | None, what: str) -> bytes:
    assert path is not None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CruxError(f"tls.{what}: cannot read {path}: {exc.strerror}") from None


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials | None:
    if not tls.enabled:
        return None
    return grpc.ssl_server_credentials(
        [(_read(tls.key, "key"), _read(tls.cert, "cert"))],
        root_certificates=_read(tls.ca, "ca"), require_client_auth=True)


def channel(address: str, tls: TlsConfig) -> grpc.aio.Channel:
    options: list[tuple[str, str | int]] = list(KEEPALIVE)
    if not tls.enabled:
        return grpc.aio.insecure_channel(address, options=options)
    creds = grpc.ssl_channel_credentials(root_certificates=_read(tls.ca, "ca"),
                                         private_key=_read(tls.key, "key"),
                                         certificate_chain=_read(tls.cert, "cert"))
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.aio.secure_channel(address, creds, options=options)

KEEPALIVE_SERVER = [
    # every agent reports right after each plan: a 1,000-agent burst would pass gRPC's
    # default queue of 1,000 pending calls and be cancelled (bench/control_plane.py)
    ("grpc.server.max_pending_requests", 20_000),
    ("grpc.server.max_pending_requests_hard_limit", 40_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
]
