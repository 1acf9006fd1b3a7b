"""A standby's refusal, held for an agent that lost the leader (cruxd.leader.rpcs): an agent
whose stream found no one at the leader names it (`crux-lost`), and a standby that still
counts that one active answers only once the election moved, naming the new leader, or
takes the call itself when it won meanwhile. Refused at once, the agent went back to the
dead leader and round again while the lease ran (about eight failed calls per agent in
`bench/ha.py --simulated`). A real in-process leader in the standby role, over gRPC on
loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc

from cruxd.control.host_plans import PublishedPlan
from cruxd.leader.auth import LEADER_TRAILER, LOST_METADATA, METADATA_KEY
from cruxd.leader.handlers import add_leader
from cruxd.leader.service import Leader
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb
from cruxd.rpc.gen.crux.v1 import leader_pb2_grpc as lgrpc
from tests.inproc_leader import inproc_leader

DEAD, NEXT = "10.0.0.1:7470", "10.0.0.3:7470"


@asynccontextmanager
async def _standby(tmp_path: Path, lease_s: int = 3) -> AsyncIterator[tuple[Leader, Any]]:
    plans: list[PublishedPlan] = []
    leader = inproc_leader(tmp_path, plans, etcd_lease_s=lease_s)
    leader.role, leader.active_leader = "standby", DEAD
    server = grpc.aio.server()
    add_leader(leader, server, lambda rpc, field: None)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    leader.address = f"127.0.0.1:{port}"
    channel = grpc.aio.insecure_channel(leader.address)
    try:
        yield leader, _Authed(lgrpc.LeaderStub(channel), leader.gate.token)  # type: ignore[no-untyped-call]
    finally:
        await channel.close()
        if leader.role == "active":
            await leader.stop()
        await server.stop(None)


class _Authed:
    """The stub's calls with the leader's token and the caller's other metadata."""

    def __init__(self, stub: Any, token: str) -> None:
        self._stub, self._md = stub, ((METADATA_KEY, f"Bearer {token}"),)

    def __getattr__(self, rpc: str) -> Callable[..., Any]:
        def call(request: Any, metadata: tuple[tuple[str, str], ...] = ()) -> Any:
            return getattr(self._stub, rpc)(request, metadata=(*self._md, *metadata))
        return call


async def _refusal(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), dict(exc.trailing_metadata() or ()).get(LEADER_TRAILER, "")
    return grpc.StatusCode.OK, ""


def _watch(stub: Any, lost: str | None) -> Callable[[], Awaitable[Any]]:
    md = ((LOST_METADATA, lost),) if lost else ()

    async def first() -> Any:
        async for msg in stub.WatchPlan(lpb.WatchRequest(host_id="h0"), metadata=md):
            return msg
    return first


def test_without_a_lost_leader_the_refusal_is_at_once(tmp_path: Path) -> None:
    async def run() -> list[tuple[grpc.StatusCode, str]]:
        async with _standby(tmp_path) as (_, stub):
            # no name; a name that is not the one this standby counts active
            return [await asyncio.wait_for(_refusal(_watch(stub, lost)()), 2.0)
                    for lost in (None, NEXT)]
    assert asyncio.run(run()) == [(grpc.StatusCode.FAILED_PRECONDITION, DEAD)] * 2


def test_the_refusal_waits_for_the_election_and_names_the_winner(tmp_path: Path) -> None:
    async def run() -> tuple[bool, tuple[grpc.StatusCode, str]]:
        async with _standby(tmp_path) as (leader, stub):
            call = asyncio.create_task(_refusal(_watch(stub, DEAD)()))
            await asyncio.sleep(0.5)
            held = not call.done()
            # an agent waits here: this standby's campaign hurries (cruxd.leader.campaign)
            assert leader.refusals_holding == 1
            leader.seen_leader(NEXT)  # what the campaign thread reports on the new holder
            got = await asyncio.wait_for(call, 2.0)
            assert leader.refusals_held == 1  # crux_leader_refusals_held_total
            assert leader.refusals_holding == 0
            return held, got
    held, got = asyncio.run(run())
    assert held, "the refusal went before the election moved"
    assert got == (grpc.StatusCode.FAILED_PRECONDITION, NEXT)


def test_a_hold_ends_with_the_lease_if_the_leader_lives(tmp_path: Path) -> None:
    """The lost leader may be alive (only this agent's path to it failed): after a lease
    and a poll the standby names it, and the agent goes back."""
    async def run() -> tuple[bool, tuple[grpc.StatusCode, str]]:
        async with _standby(tmp_path, lease_s=2) as (_, stub):
            call = asyncio.create_task(_refusal(_watch(stub, DEAD)()))
            await asyncio.sleep(0.5)
            return not call.done(), await asyncio.wait_for(call, 10.0)
    held, got = asyncio.run(run())
    assert held
    assert got == (grpc.StatusCode.FAILED_PRECONDITION, DEAD)


def test_a_standby_that_wins_meanwhile_takes_the_held_call(tmp_path: Path) -> None:
    async def run() -> tuple[bool, Any]:
        async with _standby(tmp_path) as (leader, stub):
            call = asyncio.create_task(_refusal(stub.GetPlan(
                lpb.PlanRequest(), metadata=((LOST_METADATA, DEAD),))))
            await asyncio.sleep(0.5)
            held = not call.done()
            leader.activate(9, 0, None, "test")  # the win (cruxd.leader.ha), nothing to resume
            return held, await asyncio.wait_for(call, 2.0)
    held, got = asyncio.run(run())
    assert held
    # served by this leader, not refused: it has no plan yet, and says so
    assert got == (grpc.StatusCode.UNAVAILABLE, "")


def test_a_call_held_while_this_standby_reads_the_state_it_won_is_served(
        tmp_path: Path) -> None:
    """Won (the campaign names this candidate) and still reading the state to resume,
    past a lease and a second: the held call waits for the takeover and is served."""
    async def run() -> tuple[bool, Any]:
        async with _standby(tmp_path, lease_s=2) as (leader, stub):
            leader.active_leader = leader.address
            call = asyncio.create_task(_refusal(stub.GetPlan(
                lpb.PlanRequest(), metadata=((LOST_METADATA, DEAD),))))
            await asyncio.sleep(2.0 + 1.0 + 0.5)  # the lease, the second, and some
            held = not call.done()
            leader.activate(9, 0, None, "test")
            return held, await asyncio.wait_for(call, 2.0)
    held, got = asyncio.run(run())
    assert held, "refused while this candidate was reading the state it won"
    assert got == (grpc.StatusCode.UNAVAILABLE, "")  # served: no plan yet
