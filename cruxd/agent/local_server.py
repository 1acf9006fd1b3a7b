"""The agent's Unix socket: framed requests, answered one at a time per connection.

Access control is the kernel's: the socket file is 0660 in the configured
group, and every connection's credentials (SO_PEERCRED: pid, uid, gid) are
checked again, since a descriptor can be passed to a process that could not
have opened the path.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from cruxd.errors import CruxError
from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.local import (
    INVALID_ARGUMENT,
    PERMISSION_DENIED,
    FrameError,
    frame,
    read_frame,
)

LOG = logging.getLogger(__name__)


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


Handler = Callable[[apb.LocalRequest, PeerCred], Awaitable[apb.LocalReply]]


class LocalServer:
    def __init__(self, path: Path, gid: int, handler: Handler) -> None:
        self.path = path
        self.gid = gid
        self._handler = handler
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self.rejected = 0

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
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        os.chmod(self.path, 0o660)
        if self.gid != os.getegid():
            os.chown(self.path, -1, self.gid)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for t in list(self._conns):
                t.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            cred = peer_cred(writer.get_extra_info("socket"))
            while True:
                payload = await read_frame(reader)
                if payload is None:
                    break
                reply = await self._answer(payload, cred)
                writer.write(frame(reply.SerializeToString()))
                await writer.drain()
        except FrameError as exc:
            LOG.warning("local socket: dropping a connection: %s", exc)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()

    async def _answer(self, payload: bytes, cred: PeerCred) -> apb.LocalReply:
        if not self.allowed(cred):
            self.rejected += 1
            LOG.warning("local socket: pid %d uid %d is not allowed (group %d)", cred.pid,
                        cred.uid, self.gid)
            return error_reply(PERMISSION_DENIED, "not in the agent's socket group")
        request = apb.LocalRequest()
        try:
            request.ParseFromString(payload)
        except Exception:  # protobuf's DecodeError: any undecodable input
            self.rejected += 1
            return error_reply(INVALID_ARGUMENT, "not a crux.v1.LocalRequest")
        return await self._handler(request, cred)


def error_reply(code: int, message: str) -> apb.LocalReply:
    return apb.LocalReply(schema=cpb.SCHEMA_REVISION_CURRENT,
                          error=apb.Error(code=code, message=message))


async def _answers(path: Path) -> bool:
    try:
        _, w = await asyncio.open_unix_connection(str(path))
    except OSError:
        return False
    w.close()
    return True
