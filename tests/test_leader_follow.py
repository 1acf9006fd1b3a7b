"""Where an agent goes when its leader fails (HA): a standby's redirect, but only to a
configured leader; etcd's record; else the configured leaders in turn."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
from grpc.aio import AioRpcError, Metadata

from cruxd.agent.uplink import LeaderLink
from cruxd.config.model import TlsConfig
from cruxd.control.records import AgentReport, HostInventory
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb
from cruxd.rpc.gen.crux.v1 import leader_pb2_grpc as lgrpc

NO_TLS = TlsConfig(None, None, None, None)


def _link(resolve: object = None) -> LeaderLink:
    def report() -> AgentReport:
        raise AssertionError("not called")
    return LeaderLink("10.0.0.1:7470", NO_TLS, "h0", report, lambda hp: True, 1.0, 1.0,
                      lambda: 0, fallback=("10.0.0.2:7470", "10.0.0.3:7470"),
                      resolve=resolve)  # type: ignore[arg-type]


def _refused(named: str) -> AioRpcError:
    return AioRpcError(grpc.StatusCode.FAILED_PRECONDITION, Metadata(),
                       Metadata(("crux-leader", named)), "standby leader")


def test_redirects_only_to_configured_leaders() -> None:
    async def run() -> list[str]:
        link = _link()
        seen = []
        for named in ("10.0.0.3:7470", "203.0.113.9:7470"):
            await link._follow(_refused(named))
            seen.append(link.address)
        await link.stop()
        return seen
    # the second redirect names a host nobody configured: the agent stays (and does not
    # hand it the bearer token)
    assert asyncio.run(run()) == ["10.0.0.3:7470", "10.0.0.3:7470"]


def test_etcd_first_then_the_list_in_turn() -> None:
    async def run() -> list[str]:
        answers = iter(["10.0.0.2:7470", None, None])

        async def resolve() -> str | None:
            return next(answers)
        link = _link(resolve)
        down = AioRpcError(grpc.StatusCode.UNAVAILABLE, Metadata(), Metadata(), "refused")
        seen = []
        for _ in range(3):  # etcd names .2; then no record: the list after two failures
            await link._follow(down)
            seen.append(link.address)
        await link.stop()
        return seen
    assert asyncio.run(run()) == ["10.0.0.2:7470", "10.0.0.2:7470", "10.0.0.3:7470"]


def test_a_standby_naming_itself_is_stale_so_etcd_is_asked() -> None:
    """A leader just deposed refuses reports before its campaign has heard who won; if
    it names itself, the agent asks etcd instead of staying (a CI run once waited 15 s
    on that)."""
    async def run() -> str:
        async def resolve() -> str | None:
            return "10.0.0.3:7470"
        link = _link(resolve)
        await link._follow(_refused("10.0.0.1:7470"))
        await link.stop()
        return link.address
    assert asyncio.run(run()) == "10.0.0.3:7470"


def test_etcd_naming_an_unconfigured_leader_is_not_followed() -> None:
    """issue 37, item 1: whoever could write etcd's election key took the agents (their
    token, and a plan of term 2^62 that emptied their tables). etcd's word counts only for
    a configured leader, as a redirect's does."""
    async def run() -> list[str]:
        answers = iter(["203.0.113.9:7470", "203.0.113.9:7470", "10.0.0.2:7470"])

        async def resolve() -> str | None:
            return next(answers)
        link = _link(resolve)
        down = AioRpcError(grpc.StatusCode.UNAVAILABLE, Metadata(), Metadata(), "refused")
        seen = []
        for _ in range(3):  # the planted address twice (the list after two failures), then .2
            await link._follow(down)
            seen.append(link.address)
        await link.stop()
        return seen
    assert asyncio.run(run()) == ["10.0.0.1:7470", "10.0.0.2:7470", "10.0.0.2:7470"]


def test_the_next_leader_asked_hears_which_one_was_lost() -> None:
    """A standby holds its refusal for an agent that names the leader it lost (until the
    election moves: tests/test_standby_hold.py); the name goes only to another leader,
    and only until a leader is reached again."""
    async def run() -> list[tuple[str, str | None]]:
        link = _link()
        down = AioRpcError(grpc.StatusCode.UNAVAILABLE, Metadata(), Metadata(), "refused")
        seen = []
        for _ in range(2):  # no etcd: the next configured leader after two failures
            await link._follow(down)
            seen.append((link.address, dict(link._auth()).get("crux-lost")))
        link._reached()
        seen.append((link.address, dict(link._auth()).get("crux-lost")))
        await link.stop()
        return seen
    assert asyncio.run(run()) == [("10.0.0.1:7470", None), ("10.0.0.2:7470", "10.0.0.1:7470"),
                                  ("10.0.0.2:7470", None)]


def test_the_channel_reconnects_as_often_as_the_link_retries(monkeypatch: Any) -> None:
    """gRPC's own reconnect backoff grows to 120 s, and a call on a channel waiting it out
    fails at once: the link caps it at its own cadence (1 s with another leader to look
    for, else its backoff cap), and tls.channel turns that into the channel's arguments."""
    from cruxd.rpc import tls

    made: list[float] = []
    real = tls.channel

    def channel(*args: Any, **kw: Any) -> Any:
        made.append(args[4] if len(args) > 4 else kw["reconnect_max_s"])
        return real(*args, **kw)

    monkeypatch.setattr(tls, "channel", channel)

    async def run() -> None:
        ha = _link()  # two fallbacks
        alone = LeaderLink("10.0.0.1:7470", NO_TLS, "h0", lambda: None,  # type: ignore[arg-type]
                           lambda hp: True, 1.0, 7.0, lambda: 0)
        for link in (ha, alone):
            link._connect(link.address)
            await link.stop()
    asyncio.run(run())
    assert made == [1.0, 7.0]
    assert dict(tls.reconnect_options(7.0)) == {"grpc.initial_reconnect_backoff_ms": 1000,
                                                 "grpc.max_reconnect_backoff_ms": 7000}


class _Leader(lgrpc.LeaderServicer):
    """A leader on loopback whose Report holds the call (`hold`) or records it; its plan
    stream stays open and silent."""

    def __init__(self, hold: bool) -> None:
        self.hold, self.reports = hold, 0
        self.server = grpc.aio.server()
        lgrpc.add_LeaderServicer_to_server(self, self.server)  # type: ignore[no-untyped-call]
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"

    async def Report(self, request: Any, context: Any) -> Any:
        self.reports += 1
        if self.hold:
            await asyncio.sleep(60)
        return lpb.ReportAck()

    async def WatchPlan(self, request: Any, context: Any) -> None:
        await asyncio.sleep(60)

    async def Status(self, request: Any, context: Any) -> Any:
        await asyncio.sleep(60)


@asynccontextmanager
async def _moving_link() -> AsyncIterator[tuple[_Leader, _Leader, LeaderLink]]:
    """An old leader that holds every call, a new one that answers, and a link at the old
    one with the new one as its fallback (not started)."""
    old, new = _Leader(hold=True), _Leader(hold=False)
    for s in (old, new):
        await s.server.start()
    link = LeaderLink(old.address, NO_TLS, "h0",
                      lambda: AgentReport(HostInventory("h0", "1.0", 8)),
                      lambda hp: True, 30.0, 1.0, lambda: 0, fallback=(new.address,))
    try:
        yield old, new, link
    finally:
        await link.stop()
        for s in (old, new):
            await s.server.stop(None)


def test_a_report_in_flight_when_the_link_moves_is_sent_to_the_new_leader() -> None:
    """The plan stream moves the link (a redirect) while a report waits at the old leader
    (a standby holding it): closing the old channel cancels that call, and the report goes
    to the new leader. The cancel came as asyncio.CancelledError and ended the report loop:
    that host never reported again."""
    async def run() -> tuple[int, int, bool]:
        async with _moving_link() as (old, new, link):
            await link.start()
            for _ in range(100):
                if old.reports:
                    break
                await asyncio.sleep(0.05)
            link._connect(new.address)  # what a redirect of the stream does
            for _ in range(100):
                if new.reports:
                    break
                await asyncio.sleep(0.05)
            return old.reports, new.reports, all(not t.done() for t in link._tasks)

    old_reports, new_reports, alive = asyncio.run(run())
    assert old_reports == 1
    assert new_reports >= 1, "the report held at the old leader was not sent again"
    assert alive


def test_a_status_read_cut_by_the_link_moving_is_an_error_for_cruxctl() -> None:
    async def run() -> tuple[object, str]:
        async with _moving_link() as (_, new, link):
            link._connect(link.address)
            read = asyncio.create_task(link.cluster_status())
            await asyncio.sleep(0.3)
            link._connect(new.address)
            return await asyncio.wait_for(read, 5.0)
    assert asyncio.run(run()) == (None, "CANCELLED: the link moved to another leader")
