"""Framing on the agent's Unix socket: a 4-byte big-endian length, then one
protobuf message (crux.v1.LocalRequest / LocalReply). Async side for the agent,
blocking client for crux-run and cruxctl (short-lived, one call each)."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import random
import socket
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cruxd.errors import CruxError
from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb

if TYPE_CHECKING:
    import asyncio

MAX_FRAME = 4 << 20  # a reply (a cluster's status can be large)
# A request: a registration's job id, hints and 256-character command line need far less.
# Bounded apart from replies, as every connected user can make the agent hold one.
MAX_REQUEST = 64 << 10
# Error codes on the socket are gRPC's status numbers (fixed by its spec, and checked against
# grpc.StatusCode in tests/test_cli_conventions.py), so both edges speak one vocabulary;
# written out, so that a client (cruxctl jobs, crux-run) does not import grpc for them.
INVALID_ARGUMENT = 3
NOT_FOUND = 5
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
UNAVAILABLE = 14
_LEN = struct.Struct(">I")
RETRY_MAX_MS = 250  # the longest wait between two tries of a refusal that passes
BUSY_RETRY_MS = 20  # the first wait after a full listen queue


class FrameError(CruxError):
    """A frame that is too large, truncated, or not the expected message."""


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME) -> bytes | None:
    """The next frame's payload (at most `limit` bytes), or None at a clean end of stream."""
    import asyncio  # the agent's side only: clients never load it for this module

    try:
        head = await reader.readexactly(_LEN.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError("connection closed inside a frame header") from None
    (size,) = _LEN.unpack(head)
    if size > limit:
        raise FrameError(f"frame of {size} bytes exceeds the {limit}-byte limit")
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise FrameError(f"connection closed inside a {size}-byte frame") from None


def frame(payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME:
        raise FrameError(f"message of {len(payload)} bytes exceeds the {MAX_FRAME}-byte limit")
    return _LEN.pack(len(payload)) + payload


class AgentUnavailable(CruxError):
    """No agent answers on the socket (not running, or no permission)."""


class LocalClient:
    """One blocking request/reply exchange per call with the local agent."""

    def __init__(self, path: str | Path, timeout: float = 5.0) -> None:
        self.path = str(path)
        self.timeout = timeout

    def call(self, request: apb.LocalRequest) -> apb.LocalReply:
        """The agent's reply. A busy agent (a refusal with `retry_after_ms`, from its
        connection limits, or a full listen queue) is tried again with growing, jittered
        waits until `timeout` has passed in all; the last refusal is returned then."""
        request.schema = cpb.SCHEMA_REVISION_CURRENT
        deadline = time.monotonic() + self.timeout
        attempt = 0
        while True:
            reply = self._once(request, max(0.05, deadline - time.monotonic()))
            if reply is None:  # the listen queue was full
                wait_ms = BUSY_RETRY_MS
            else:
                wait_ms = reply.error.retry_after_ms if reply.WhichOneof("body") == "error" \
                    else 0
                if not wait_ms:
                    return reply
            wait = min(wait_ms * 2 ** attempt, RETRY_MAX_MS) / 1e3 * random.uniform(0.5, 1.5)
            if time.monotonic() + wait >= deadline:
                if reply is None:
                    raise AgentUnavailable(f"the agent at {self.path} is busy (its listen "
                                           f"queue stayed full for {self.timeout:g} s)")
                return reply
            time.sleep(wait)
            attempt += 1

    def _once(self, request: apb.LocalRequest, timeout: float) -> apb.LocalReply | None:
        """One exchange; None when the agent's listen queue is full (EAGAIN on connect)."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                try:
                    s.connect(self.path)
                except BlockingIOError:
                    return None
                # refused before it read us (too many connections): the reply says why
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    s.sendall(frame(request.SerializeToString()))
                head = _recv_exact(s, _LEN.size)
                (size,) = _LEN.unpack(head)
                if size > MAX_FRAME:
                    raise FrameError(f"reply of {size} bytes exceeds the limit")
                reply = apb.LocalReply()
                reply.ParseFromString(_recv_exact(s, size))
                return reply
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise AgentUnavailable(f"no crux agent at {self.path} ({exc.strerror})") from None
        except PermissionError:
            raise AgentUnavailable(not_allowed(self.path)) from None
        except TimeoutError:
            raise AgentUnavailable(f"the agent at {self.path} did not answer in "
                                   f"{timeout:g} s") from None
        except OSError as exc:
            raise AgentUnavailable(f"agent socket {self.path}: {exc.strerror or exc}") from None


def not_allowed(path: str | Path) -> str:
    """Why this user cannot connect to the agent socket at `path`: the group it misses."""
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    try:
        gid = os.stat(path).st_gid
        group = grp.getgrgid(gid).gr_name
    except (OSError, KeyError):
        return f"uid {uid} ({user}) may not use the crux agent at {path}"
    return (f"uid {uid} ({user}) is not in group {group}, which may use the crux agent at "
            f"{path} (an administrator adds a user with `usermod -aG {group} USER`; it "
            "takes effect at the next login)")


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise FrameError("the agent closed the connection mid-reply")
        buf += chunk
    return bytes(buf)
