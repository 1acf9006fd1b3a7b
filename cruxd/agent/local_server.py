"""The agent's Unix socket: framed requests, answered one at a time per connection.

Access control is the kernel's: the socket file is 0660 in the configured
group, and every connection's credentials (SO_PEERCRED: pid, uid, gid) are
checked again, since a descriptor can be passed to a process that could not
have opened the path.

Any allowed user may still be hostile, so what one can make the agent hold is bounded:
connections in all and per uid (one more is answered RESOURCE_EXHAUSTED with a retry hint,
and closed; clients try again within their deadline), a request's size (MAX_REQUEST), and
the time to send a whole request or take a reply. Accept errors (EMFILE under a flood)
back off instead of spinning; each refusal is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import socket
import struct
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from cruxd.errors import CruxError
from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.local import (
    INVALID_ARGUMENT,
    MAX_REQUEST,
    PERMISSION_DENIED,
    RESOURCE_EXHAUSTED,
    FrameError,
    frame,
    read_frame,
)

LOG = logging.getLogger(__name__)
WARN_EVERY_S = 10.0  # a flood gets one warning per kind this often, and counters
ACCEPT_BACKOFF_S = (0.01, 1.0)  # first and longest wait after a failed accept (EMFILE)
# A connection over the limits is told to come back: a launcher starting every rank of a
# host at once then registers them all (bench/registration.py) instead of most failing open.
RETRY_AFTER_MS = 20
# connections only root and the daemon's own user may use past agent.max_connections: four
# users holding 64 each filled the socket, and root's registrations fell back (issue 37)
RESERVED = 16


@dataclass(frozen=True, slots=True)
class Limits:
    """What the socket lets its users make the agent hold ([agent] keys)."""
    max_connections: int = 256
    max_connections_per_uid: int = 64
    request_timeout_s: float = 5.0


@dataclass(frozen=True, slots=True)
class PeerCred:
    pid: int
    uid: int
    gid: int


def peer_cred(sock: socket.socket) -> PeerCred:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return PeerCred(*struct.unpack("3i", raw))


def _groups(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return {int(g) for g in line.split()[1:]}
    except OSError:
        pass
    return set()


def group_id(name: str | None) -> int:
    if not name:
        return os.getegid()
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise CruxError(f"agent.socket_group: no group named {name!r} on this host") from None


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


Handler = Callable[[apb.LocalRequest, PeerCred], Awaitable[apb.LocalReply]]


class LocalServer:
    def __init__(self, path: Path, gid: int, handler: Handler,
                 limits: Limits = Limits()) -> None:
        self.path = path
        self.gid = gid
        self._handler = handler
        self.limits = limits
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._per_uid: Counter[int] = Counter()
        self._warned: dict[str, float] = {}
        self.rejected = 0  # every refusal below, and bad or unauthorised requests
        self.refused_connections = 0
        self.timed_out = 0
        self.accept_errors = 0

    def _warn(self, kind: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._warned.get(kind, -WARN_EVERY_S) >= WARN_EVERY_S:
            self._warned[kind] = now
            LOG.warning("local socket: " + msg, *args)

    def allowed(self, cred: PeerCred) -> bool:
        if cred.uid in (0, os.geteuid()) or cred.gid == self.gid:
            return True
        return self.gid in _groups(cred.pid)

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_socket():
            if await _answers(self.path):
                raise CruxError(f"another agent is listening on {self.path}")
            self.path.unlink()  # left by an agent that died
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.setblocking(False)
            sock.bind(str(self.path))
            sock.listen(min(self.limits.max_connections, socket.SOMAXCONN))
            os.chmod(self.path, 0o660)
            if self.gid != os.getegid():
                os.chown(self.path, -1, self.gid)
        except BaseException:
            sock.close()
            raise
        self._listener = sock
        self._accepting = asyncio.create_task(self._accept_loop(sock))

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            for t in list(self._conns):
                t.cancel()
            await asyncio.gather(self._accepting, *self._conns, return_exceptions=True)
            self._accepting = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        delay = ACCEPT_BACKOFF_S[0]
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS: wait for descriptors back
                self.accept_errors += 1
                self._warn("accept", "accept failed (%s, %d so far); retrying in %g s",
                           exc.strerror or exc, self.accept_errors, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, ACCEPT_BACKOFF_S[1])
                continue
            delay = ACCEPT_BACKOFF_S[0]
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        try:
            cred = peer_cred(conn)
        except OSError:
            conn.close()
            return
        lim = self.limits
        why = ""
        reserved = RESERVED if cred.uid in (0, os.geteuid()) else 0
        if len(self._conns) >= lim.max_connections + reserved:
            why = f"too many connections ({lim.max_connections}, agent.max_connections)"
        elif self._per_uid[cred.uid] >= lim.max_connections_per_uid:
            why = (f"too many connections from uid {cred.uid} "
                   f"({lim.max_connections_per_uid}, agent.max_connections_per_uid)")
        if why:
            self.rejected += 1
            self.refused_connections += 1
            self._warn("full", "refusing pid %d uid %d: %s (%d refused so far)", cred.pid,
                       cred.uid, why, self.refused_connections)
            with contextlib.suppress(OSError):  # best effort: tell it why, never wait
                conn.setblocking(False)
                conn.send(frame(error_reply(RESOURCE_EXHAUSTED, why, retry_after_ms=RETRY_AFTER_MS)
                                .SerializeToString()))
            conn.close()
            return
        self._per_uid[cred.uid] += 1
        task = asyncio.create_task(self._serve(conn, cred))
        self._conns.add(task)

    async def _serve(self, conn: socket.socket, cred: PeerCred) -> None:
        timeout = self.limits.request_timeout_s
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_unix_connection(sock=conn)
            while True:
                async with asyncio.timeout(timeout):  # a half-sent frame holds no slot long
                    payload = await read_frame(reader, MAX_REQUEST)
                if payload is None:
                    break
                reply = await self._answer(payload, cred)
                writer.write(frame(reply.SerializeToString()))
                async with asyncio.timeout(timeout):
                    await writer.drain()
        except FrameError as exc:
            self.rejected += 1
            self._warn("frame", "dropping pid %d uid %d: %s", cred.pid, cred.uid, exc)
        except TimeoutError:
            self.rejected += 1
            self.timed_out += 1
            self._warn("timeout", "dropping pid %d uid %d: no whole request or reply taken "
                       "in %g s (agent.request_timeout_s; %d so far)", cred.pid, cred.uid,
                       timeout, self.timed_out)
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception:  # a bug answering one request must not take the socket down
            LOG.exception("local socket: request from pid %d failed", cred.pid)
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._conns.discard(task)
            self._per_uid[cred.uid] -= 1
            if self._per_uid[cred.uid] <= 0:
                del self._per_uid[cred.uid]
            if writer is not None:
                writer.close()
            else:
                conn.close()

    async def _answer(self, payload: bytes, cred: PeerCred) -> apb.LocalReply:
        if not self.allowed(cred):
            self.rejected += 1
            LOG.warning("local socket: pid %d uid %d is not allowed (group %d)", cred.pid,
                        cred.uid, self.gid)
            name = group_name(self.gid)
            return error_reply(PERMISSION_DENIED, f"uid {cred.uid} is not in group {name}, "
                               f"which may use this agent (an administrator adds a user with "
                               f"`usermod -aG {name} USER`)")
        request = apb.LocalRequest()
        try:
            request.ParseFromString(payload)
        except Exception:  # protobuf's DecodeError: any undecodable input
            self.rejected += 1
            return error_reply(INVALID_ARGUMENT, "not a crux.v1.LocalRequest")
        return await self._handler(request, cred)


def error_reply(code: int, message: str, retry_after_ms: int = 0) -> apb.LocalReply:
    return apb.LocalReply(schema=cpb.SCHEMA_REVISION_CURRENT, error=apb.Error(
        code=code, message=message, retry_after_ms=retry_after_ms))


async def _answers(path: Path) -> bool:
    try:
        _, w = await asyncio.open_unix_connection(str(path))
    except OSError:
        return False
    w.close()
    return True
