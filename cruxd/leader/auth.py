"""Who may speak for a host at the leader (docs/control-plane.md, "Authentication").

Without TLS every RPC carries `authorization: Bearer <token>`, the token being the
contents of `<state_dir>/leader.token`: a file only root and the daemon's group can
read, so a local user outside that group (`nobody`) is refused. With mutual TLS the
client certificate is the identity: a host may only report as, and watch the plan of,
the host its certificate names. An optional allow-list (`leader.hosts`) narrows
either case. Every refusal is counted like an invalid message.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from cruxd.config.hostport import parse_hostport
from cruxd.config.model import Config
from cruxd.config.statefile import read_small
from cruxd.errors import UsageError

LOG = logging.getLogger(__name__)
TOKEN_FILE = "leader.token"
METADATA_KEY = "authorization"
LEADER_TRAILER = "crux-leader"  # a standby's refusal names the active leader here
# A plan stream's initial metadata: VIEW_CURRENT when the leader's view holds the report the
# agent named (WatchRequest.incarnation, report_seq), so the agent need not report again
VIEW_METADATA, VIEW_CURRENT = "crux-view", "current"
# An agent names the leader it just lost (its stream or report found no one there): a
# standby that still counts that one active holds its refusal until the election moves
# (cruxd.leader.rpcs), so the agent is not sent back to the dead leader while its lease runs
LOST_METADATA = "crux-lost"
_SCHEME = "Bearer "
_MAX_TOKEN = 4096  # a token file is 64 hex digits; never read more than this


# --- the token file ------------------------------------------------------------------

def _usable(path: Path) -> str | None:
    """The token in `path` if it is one this leader may keep using, else None."""
    try:
        raw, st = read_small(path, _MAX_TOKEN, follow=False)
    except OSError:
        return None  # missing, a symlink (ELOOP) or not a regular file
    if st.st_uid != os.geteuid() or st.st_mode & 0o007:
        return None
    token = raw.decode("ascii", "replace").strip()
    return token if len(token) >= 32 and token.isalnum() else None


def ensure_token(path: Path) -> str:
    """Reuse the token in `path`, or write a new one atomically (mode 0640, the
    process's group): a symlink, a non-regular file, a file of another owner or one
    others can read is replaced, never followed or trusted."""
    token = _usable(path)
    if token is not None:
        return token
    token = secrets.token_hex(32)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o640)
        try:
            os.fchmod(fd, 0o640)  # whatever the umask
            os.write(fd, token.encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)  # replaces a symlink itself, not its target
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot write the leader token {path}: {exc.strerror}",
                         where="daemon.state_dir") from None
    LOG.info("wrote a new leader token to %s", path)
    return token


def read_token(path: Path) -> str | None:
    """A client's token from `path` (None if it cannot be read: the call then goes out
    without one and the leader answers UNAUTHENTICATED, which the caller reports)."""
    try:
        raw, _ = read_small(path, _MAX_TOKEN)
    except OSError:
        return None
    return raw.decode("ascii", "replace").strip() or None


def call_metadata(path: Path | None) -> tuple[tuple[str, str], ...]:
    """The metadata a call to the leader carries: the bearer token, if one is readable."""
    token = read_token(path) if path is not None else None
    return ((METADATA_KEY, _SCHEME + token),) if token else ()


# --- the server's check ----------------------------------------------------------------

def metadata_values(context: grpc.aio.ServicerContext[Any, Any], key: str) -> Iterator[str]:
    """The text values the caller sent under `key`, in order (binary ones skipped)."""
    for k, value in context.invocation_metadata() or ():
        if k == key and isinstance(value, str):
            yield value


def _loopback(listen: str) -> bool:
    host, _ = parse_hostport(listen)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cert_identities(context: grpc.aio.ServicerContext[Any, Any]) -> frozenset[str]:
    """The verified client certificate's names: SAN DNS names and URIs, else its CN."""
    ctx = context.auth_context()
    san = [*ctx.get("x509_subject_alternative_name", [])]
    names = san or [*ctx.get("x509_common_name", [])]
    return frozenset(n.decode("utf-8", "replace") for n in names)


class Gate:
    """The check every leader RPC makes first; raises (aborts) the call if refused."""

    def __init__(self, config: Config, on_reject: Callable[[str, str], None]) -> None:
        lc = config.leader
        self.tls = config.tls.enabled
        if not self.tls and not _loopback(lc.listen) and not lc.insecure_remote:
            raise UsageError(
                f"{lc.listen} is not a loopback address and TLS is off: any host could "
                "report as any other; set tls.ca/cert/key, or leader.insecure_remote = true "
                "(labs only)", where="leader.listen")
        self.hosts = frozenset(lc.hosts)
        self.token = ensure_token(config.state_dir / TOKEN_FILE)
        self._on_reject = on_reject

    def _token_ok(self, context: grpc.aio.ServicerContext[Any, Any]) -> bool:
        for value in metadata_values(context, METADATA_KEY):
            if value.startswith(_SCHEME):
                return hmac.compare_digest(value[len(_SCHEME):].encode(), self.token.encode())
        return False

    async def _deny(self, context: grpc.aio.ServicerContext[Any, Any], rpc: str,
                    code: grpc.StatusCode, why: str) -> None:
        self._on_reject(rpc, code.name.lower())
        LOG.warning("%s refused from %s: %s", rpc, context.peer(), why)
        await context.abort(code, why)
        raise AssertionError("unreachable")  # abort raises

    async def check(self, context: grpc.aio.ServicerContext[Any, Any], rpc: str,
                    host_id: str | None = None) -> None:
        """Let the call through or abort it. `host_id`: the host a Report or WatchPlan
        speaks for (None: a read of the cluster's status, plan or hints)."""
        names = cert_identities(context) if self.tls else frozenset()
        if not names and not self._token_ok(context):
            await self._deny(context, rpc, grpc.StatusCode.UNAUTHENTICATED,
                             "no valid leader token (authorization: Bearer <token> from "
                             "the leader's state_dir/leader.token) or client certificate")
        if host_id is None:
            return
        if names and host_id not in names:
            await self._deny(context, rpc, grpc.StatusCode.PERMISSION_DENIED,
                             f"the client certificate names {', '.join(sorted(names))}, "
                             f"not host {host_id!r}")
        if self.hosts and host_id not in self.hosts:
            await self._deny(context, rpc, grpc.StatusCode.PERMISSION_DENIED,
                             f"host {host_id!r} is not in leader.hosts")
