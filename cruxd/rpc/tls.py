"""gRPC credentials from the [tls] paths: mutual TLS when all three are set.

The leader requires a client certificate signed by the CA; agents check the
leader's certificate against the same CA. Files are read at start (and reload).
"""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

from cruxd.config.model import CONTROL_DSCP, TlsConfig
from cruxd.config.statefile import read_bounded
from cruxd.errors import CruxError, UsageError


def keepalive(seconds: float = 10.0) -> list[tuple[str, int]]:
    """Agents report only on change: an open plan stream is how the leader knows a host is
    alive, and how an agent finds a hung leader. Both ends ping every `seconds` ([control]
    keepalive_s) and give half as long for the answer (HTTP/2 PING, in gRPC's C core: no
    Python runs), so a dead peer is found within 1.5 x `seconds` either way."""
    ms = int(seconds * 1000)
    return [("grpc.keepalive_time_ms", ms), ("grpc.keepalive_timeout_ms", ms // 2),
            # grpcio 1.85's HTTP/2 transport times a ping out by this, not the above (a
            # SIGSTOPped peer went unnoticed; tests/test_liveness.py)
            ("grpc.http2.ping_timeout_ms", ms // 2),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0)]


KEEPALIVE = keepalive()


def dscp_options(dscp: int | None) -> list[tuple[str, int]]:
    """gRPC's channel argument for the DSCP of a channel's or server's packets ([control]
    dscp; None: none, the kernel's default). The C core sets IP_TOS / IPV6_TCLASS on every
    socket it connects, and on the server's listening socket, whose class its accepted
    connections inherit (SYN-ACK included); tests/test_control_dscp_rig.py checks the wire."""
    return [] if dscp is None else [("grpc.dscp", dscp)]


MAX_PEM = 1 << 20  # a CA bundle of a few hundred certificates; bounds a wrong file's cost


def _read(path: Path | None, what: str) -> bytes:
    assert path is not None
    try:
        return read_bounded(path, MAX_PEM)  # not a FIFO: one hung --check-config
    except OSError as exc:
        raise CruxError(f"tls.{what}: cannot read {path}: {exc.strerror}") from None


def check_files(tls: TlsConfig) -> None:
    """Refuse files that are not what tls.ca, tls.cert and tls.key say, each by its key.

    gRPC reads them only when the server binds or a channel connects, and then says "Failed
    to bind" or nothing at all; OpenSSL, which Python has anyway, says which file is wrong.
    """
    if not tls.enabled:
        return
    assert tls.ca is not None and tls.cert is not None and tls.key is not None
    for key, path in (("ca", tls.ca), ("cert", tls.cert), ("key", tls.key)):
        try:  # regular files of a sane size, before OpenSSL opens them (a FIFO hung)
            read_bounded(path, MAX_PEM)
        except OSError as exc:
            raise UsageError(_why(path, exc, "unreadable"), where=f"tls.{key}") from None
    for key, path in (("ca", tls.ca), ("cert", tls.cert)):
        try:  # a trust store takes any certificate: this parses the file, nothing more
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
        except OSError as exc:
            raise UsageError(_why(path, exc, "not a PEM certificate"), where=f"tls.{key}") from None
    try:  # no password prompt on a terminal: an encrypted key is refused, as gRPC would
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(tls.cert, tls.key, lambda: b"")
    except OSError as exc:
        mismatch = "KEY_VALUES_MISMATCH" in str(exc)
        raise UsageError(_why(tls.key, exc, "not the private key of tls.cert" if mismatch else
                              "not a PEM private key (unencrypted) for tls.cert"),
                         where="tls.key") from None


def _why(path: Path, exc: OSError, what: str) -> str:
    if isinstance(exc, ssl.SSLError) or not exc.strerror:
        return f"{path} is {what}"
    return f"cannot read {path}: {exc.strerror}"


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials | None:
    if not tls.enabled:
        return None
    return grpc.ssl_server_credentials(
        [(_read(tls.key, "key"), _read(tls.cert, "cert"))],
        root_certificates=_read(tls.ca, "ca"), require_client_auth=True)


def reconnect_options(max_s: float) -> list[tuple[str, int]]:
    """A channel's own reconnect backoff, capped at the caller's retry cadence. gRPC's
    default grows to 120 s, and a call on a channel waiting out that backoff fails at once
    (UNAVAILABLE): an agent retrying every second reached a leader back up only when the
    channel's next attempt came, seconds later (bench/ha.py's failover tail)."""
    ms = max(100, int(max_s * 1000))
    return [("grpc.initial_reconnect_backoff_ms", min(1000, ms)),
            ("grpc.max_reconnect_backoff_ms", ms)]


def channel(address: str, tls: TlsConfig, dscp: int | None = CONTROL_DSCP,
            keepalive_s: float = 10.0, reconnect_max_s: float = 120.0) -> grpc.aio.Channel:
    options: list[tuple[str, str | int]] = [*keepalive(keepalive_s), *dscp_options(dscp),
                                            *reconnect_options(reconnect_max_s)]
    if not tls.enabled:
        return grpc.aio.insecure_channel(address, options=options)
    creds = grpc.ssl_channel_credentials(root_certificates=_read(tls.ca, "ca"),
                                         private_key=_read(tls.key, "key"),
                                         certificate_chain=_read(tls.cert, "cert"))
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.aio.secure_channel(address, creds, options=options)


# How long a call may wait in the server's queue before Python takes it. gRPC cancels one
# after 30 s by default: at a 10,000-agent start-up the leader's one Python thread took
# calls slower than they came, and those cancelled (WatchPlan and Report CANCELLED), with
# the Reports past their own 30 s deadline, came back as retries on top of the queue (a
# storm: 120-300 s to steady state instead of 30-45 s). Queued, they are taken once, in
# turn; the queue is bounded by max_pending_requests. An agent's Report deadline is the
# same (cruxd.agent.uplink.REPORT_TIMEOUT_S).
QUEUED_CALL_MAX_S = 120


def server_options(keepalive_s: float = 10.0) -> list[tuple[str, int]]:
    ms = int(keepalive_s * 1000)
    return [
        # every agent reports at once after a failover: a 10,000-agent burst would pass
        # gRPC's default queue of 1,000 pending calls and be cancelled
        ("grpc.server.max_pending_requests", 20_000),
        ("grpc.server.max_pending_requests_hard_limit", 40_000),
        ("grpc.server_max_unrequested_time_in_server", QUEUED_CALL_MAX_S),
        ("grpc.keepalive_time_ms", ms),
        ("grpc.keepalive_timeout_ms", ms // 2),
        ("grpc.http2.ping_timeout_ms", ms // 2),
        ("grpc.keepalive_permit_without_calls", 1),
        # a plan stream carries no data for hours: without this the server stops pinging
        # after 2 pings (gRPC's default), and a stopped agent stays "connected" for ever
        ("grpc.http2.max_pings_without_data", 0),
        # the agents ping as often: allow it (their pings are how they find a hung leader)
        ("grpc.http2.min_ping_interval_without_data_ms", ms // 2),
        ("grpc.http2.max_ping_strikes", 0),
    ]
