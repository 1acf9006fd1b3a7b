"""Root and the daemon's own user keep connections to the agent when the other users have
taken agent.max_connections (issue 37, item 12: four users holding 64 each starved root's
registrations, which then fell back silently)."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

import cruxd.agent.local_server as ls
from cruxd.agent.local_server import RESERVED, Limits, LocalServer, PeerCred
from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb


def test_root_and_the_agents_user_have_reserved_slots(short_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    uids: dict[int, int] = {}  # fd of the server's end -> the uid it pretends to be

    def cred(sock: socket.socket) -> PeerCred:
        return PeerCred(os.getpid(), uids.pop(sock.fileno(), os.geteuid()), 0)

    monkeypatch.setattr(ls, "peer_cred", cred)

    async def handler(req: apb.LocalRequest, c: PeerCred) -> apb.LocalReply:
        return apb.LocalReply()

    async def run() -> None:
        server = LocalServer(short_dir / "agent.sock", os.getegid(), handler,
                             Limits(max_connections=3, max_connections_per_uid=64))
        kept: list[socket.socket] = []

        async def connect(uid: int) -> bool:
            """Whether a connection of `uid` is admitted (kept open if so)."""
            before = server.refused_connections
            a, b = socket.socketpair()
            uids[b.fileno()] = uid
            server._admit(b)  # as the accept loop would
            await asyncio.sleep(0)
            if server.refused_connections != before:
                a.close()
                return False
            kept.append(a)
            return True

        try:
            for k in range(3):  # three users fill agent.max_connections
                assert await connect(1000 + k)
            assert not await connect(2000)  # a fourth user is told to come back
            assert await connect(0)  # root still gets in ...
            assert await connect(os.geteuid())  # ... and so does the agent's own user
            assert not await connect(2001)  # the others still do not
            while len(kept) < 3 + RESERVED:
                assert await connect(0)
            assert not await connect(0)  # the reserve is bounded too
            for a in kept:
                a.close()
        finally:
            await server.stop()

    asyncio.run(run())
