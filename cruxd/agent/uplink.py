"""The agent's link to the leader: reports on change, and the plan stream.

The report loop looks at the agent's state every `interval_s` (or when poked) and sends a
Report only when `why` says something the leader plans on changed (agent/report_change.py),
when a send is owed (a new plan stream to a leader whose view lacks the host's latest
report: a restarted leader, or one newly elected, says in the stream's metadata whether it
holds it), or after a failed one. The open plan stream is the host's liveness. A failed
plan stream finds where the leader went (a standby's redirect, etcd, the next configured
address) without a report, so a failover costs the new leader no report per host whose
report its view holds. Both loops reconnect with jittered exponential backoff; while the
leader is away the decision table keeps the last plan (jobs keep running as planned).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from cruxd.config.model import TlsConfig
from cruxd.control.records import AgentReport, HostPlan
from cruxd.leader.auth import (
    LEADER_TRAILER,
    LOST_METADATA,
    VIEW_CURRENT,
    VIEW_METADATA,
    call_metadata,
)
from cruxd.rpc import convert, tls
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb
from cruxd.rpc.gen.crux.v1 import leader_pb2_grpc as lgrpc
from cruxd.waits import wait_event, within

LOG = logging.getLogger(__name__)
T = TypeVar("T")
RPC_TIMEOUT_S = 5.0  # Status, GetPlan: a person waits
# A Report may queue behind 10,000 others when every agent reports at once (a failover, a
# cluster-wide start): the leader answers about 1,500 a second, and a deadline it cannot
# meet turns the queue into a retry storm. Liveness does not hang on it (the plan stream
# does), so it can wait. At 30 s, a 10,000-agent start-up whose first Reports drained in
# 20-37 s tipped into a storm in 3 of 4 runs on a 2-core box. As long as the leader keeps
# a call queued (120 s), so that a queued Report is neither cancelled nor abandoned first.
REPORT_TIMEOUT_S = float(tls.QUEUED_CALL_MAX_S)
# Reports owed because a plan stream ended or a new one opened go this much apart, at
# random: every agent sees a leader fail at the same instant
REPORT_JITTER_S = 1.0
# (the last report the leader took, or None; the report now; seconds since the last one)
# -> why to send it, or None (agent/report_change.py)
WhyReport = Callable[[AgentReport | None, AgentReport, float], str | None]


class Backoff:
    def __init__(self, cap_s: float, first_s: float = 0.2) -> None:
        self.cap_s = cap_s
        self.first_s = first_s
        self.delay = first_s

    def next(self) -> float:
        d = self.delay * random.uniform(0.5, 1.0)
        self.delay = min(self.cap_s, self.delay * 2)
        return d

    def reset(self) -> None:
        self.delay = self.first_s


class LeaderLink:
    def __init__(self, address: str, tls_config: TlsConfig, host_id: str,
                 make_report: Callable[[], AgentReport], on_plan: Callable[[HostPlan], bool],
                 interval_s: float, backoff_max_s: float,
                 have_generation: Callable[[], int], token_path: Path | None = None,
                 fallback: tuple[str, ...] = (),
                 resolve: Callable[[], Awaitable[str | None]] | None = None,
                 dscp: int | None = None, why: WhyReport | None = None,
                 keepalive_s: float = 10.0,
                 etcd_term: Callable[[], Awaitable[int | None]] | None = None) -> None:
        self.address = address
        # HA: the active leader's term as etcd records it. A plan's new term is taken only
        # when etcd vouches for it; a leader's word alone is not enough (issue 37)
        self._etcd_term = etcd_term
        self._vouched = 0  # the newest term etcd vouched for
        self.terms_refused = 0
        self._dscp = dscp  # [control] dscp of the channel's packets
        self._keepalive_s = keepalive_s  # [control] keepalive_s
        # where to look when the leader fails: etcd's record of the active leader (HA),
        # a standby's redirect, else the configured addresses in turn
        self._candidates = (address, *(a for a in fallback if a != address))
        self._resolve = resolve
        self._failures = 0
        # the leader whose stream or report found no one there, named to the next one
        # asked (LOST_METADATA): a standby then waits for the election, not sends us back
        self._lost: str | None = None
        self._call: grpc.aio.UnaryStreamCall[Any, Any] | None = None
        self._token_path = token_path  # re-read per call: the leader may start after us
        self.host_id = host_id
        self.interval_s = interval_s
        self._tls = tls_config
        self._make_report = make_report
        self._on_plan = on_plan
        self._have = have_generation
        self._backoff_max_s = backoff_max_s
        self._poke = asyncio.Event()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._channel: grpc.aio.Channel | None = None
        self._closing: asyncio.Task[None] | None = None
        self._seq = 0
        # names this process's reports: a leader restored from a view that holds the
        # latest one acked (incarnation, _acked) needs no report on the new stream
        self._incarnation = secrets.randbits(64) or 1
        self._acked = 0
        self.reachable = False
        self.last_error = "not connected yet"
        self.last_plan_mono: float | None = None
        self.rpc_errors = 0
        self.reports_skipped = 0  # new plan streams whose leader held our latest report
        # None: every look sends (the old periodic report; tests and tools)
        self._why = why
        self._sent: AgentReport | None = None  # the last report the leader took
        self._sent_mono = 0.0
        self._owed = True  # a report must go at the next look, whatever changed
        self._stream_ended = False  # a plan stream ended: the next one may be a new leader

    async def start(self) -> None:
        self._connect(self.address)
        self._tasks = [asyncio.create_task(self._report_loop(), name="report"),
                       asyncio.create_task(self._watch_loop(), name="watch")]

    async def stop(self) -> None:
        self._stop.set()
        self._poke.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._closing is not None:  # the channel of a leader followed away from
            await asyncio.gather(self._closing, return_exceptions=True)
        if self._channel is not None:
            try:
                await within(self._channel.close(grace=None), 2.0)
            except TimeoutError:
                LOG.warning("closing the channel to the leader timed out")

    def _connect(self, address: str) -> None:
        old = self._channel
        self.address = address
        # the channel's reconnects as often as this link retries: at most 1 s apart with
        # a leader to look for elsewhere (etcd, fallbacks), else the link's backoff cap
        many = self._resolve is not None or len(self._candidates) > 1
        self._channel = tls.channel(address, self._tls, self._dscp, self._keepalive_s,
                                    1.0 if many else self._backoff_max_s)
        self._stub = lgrpc.LeaderStub(self._channel)  # type: ignore[no-untyped-call]
        if self._call is not None:
            self._call.cancel()  # the plan stream starts over on the new channel
            self._call = None
        if old is not None:
            self._closing = asyncio.create_task(old.close(grace=None))

    async def _follow(self, exc: grpc.aio.AioRpcError) -> bool:
        """After a failed report: switch to where the active leader is, if that is
        elsewhere. True if switched."""
        self._failures += 1
        target = None
        if exc.code() is grpc.StatusCode.UNAVAILABLE:  # no one there: name it to the next
            self._lost = self.address
        if exc.code() is grpc.StatusCode.FAILED_PRECONDITION:  # a standby names the leader
            named = dict(exc.trailing_metadata() or ()).get(LEADER_TRAILER)
            # only a configured leader: a redirect elsewhere would take the bearer token
            # (and the host's reports) to whoever answered
            # (a standby naming itself is stale: just deposed, it has not heard who won)
            if named in self._candidates and named != self.address:
                target = named
            elif named and named != self.address:
                LOG.warning("leader %s names %.80r as the active leader, which is not in "
                            "agent.leader or agent.leader_fallback; not followed",
                            self.address, named)
        if target is None:
            target = await self._etcds_leader()
        if target is None and self._failures >= 2 and len(self._candidates) > 1:
            i = self._candidates.index(self.address) if self.address in self._candidates else -1
            target = self._candidates[(i + 1) % len(self._candidates)]
        if target is None or target == self.address or not isinstance(target, str):
            return False
        LOG.warning("leader %s: following the active leader at %s", self.address, target)
        self._failures = 0
        self._connect(target)
        return True

    async def _etcds_leader(self) -> str | None:
        """The leader etcd names, if it is a configured one (None without etcd)."""
        if self._resolve is None:
            return None
        found = None
        with contextlib.suppress(Exception):  # etcd down too: the caller's list
            found = await self._resolve()
        # etcd's word only for a configured leader, as a redirect's: whoever can write
        # the election key would otherwise get this host's token and plan (issue 37)
        if found in self._candidates:
            return found
        if found:
            LOG.warning("etcd names %.80r as the active leader, which is not in "
                        "agent.leader or agent.leader_fallback; not followed", found)
        return None

    async def _vouched_for(self, term: int) -> bool:
        """Whether etcd says `term` is the active leader's (HA); counted and said if not."""
        if self._etcd_term is None or term <= self._vouched:
            return True
        try:
            recorded: int | str | None = await self._etcd_term()
        except Exception as exc:  # etcd unreachable: no term can be vouched for now
            recorded = f"etcd unreadable: {exc}"
        if recorded == term:
            self._vouched = term
            return True
        self.terms_refused += 1
        LOG.warning("leader %s: plans of term %d refused: etcd records %s (the table keeps "
                    "its plan)", self.address, term,
                    f"term {recorded}" if isinstance(recorded, int) else
                    "no leader" if recorded is None else recorded)
        return False

    def _auth(self) -> tuple[tuple[str, str], ...]:
        md = call_metadata(self._token_path)
        if self._lost is not None and self._lost != self.address:
            md = (*md, (LOST_METADATA, self._lost))
        return md

    def poke(self, owed: bool = False) -> None:
        """Look now whether a report is due (a job arrived, a sweep ended); `owed`: send
        one whatever changed (a new plan stream, or a failed one)."""
        self._owed |= owed
        self._poke.set()

    def _poke_later(self) -> None:
        asyncio.get_running_loop().call_later(random.uniform(0, REPORT_JITTER_S),
                                              self.poke, True)

    def _reached(self) -> None:
        """A report or a plan stream got through to the leader at `address`."""
        if not self.reachable:
            LOG.info("leader %s reachable", self.address)
        self.reachable, self.last_error = True, ""
        self._failures = 0
        self._lost = None

    def _failed(self, what: str, exc: grpc.aio.AioRpcError) -> None:
        self.rpc_errors += 1
        msg = f"{what}: {exc.code().name}: {exc.details()}"
        if self.reachable or msg != self.last_error:
            LOG.warning("leader %s: %s", self.address, msg)
        self.reachable = False
        self.last_error = msg

    async def _report_loop(self) -> None:
        backoff = Backoff(self._backoff_max_s)
        # agents started together (a cluster-wide restart) spread their first reports
        await wait_event(self._stop, random.uniform(0, REPORT_JITTER_S))
        while not self._stop.is_set():
            self._poke.clear()
            report = self._make_report()
            why = ("owed" if self._owed or self._why is None else
                   self._why(self._sent, report, time.monotonic() - self._sent_mono))
            if why is None:
                await wait_event(self._poke, self.interval_s)
                continue
            self._owed = True  # until the leader has taken it
            self._seq += 1
            report = AgentReport(report.host, report.jobs, report.paths, report.links,
                                 report.applied_generation, self._seq, self._incarnation)
            try:
                await self._stub.Report(convert.report_to_pb(report),
                                        timeout=REPORT_TIMEOUT_S, metadata=self._auth())
                self._reached()
                self._sent, self._sent_mono, self._owed = report, time.monotonic(), False
                self._acked = report.seq
                LOG.debug("report %d sent: %s", self._seq, why)
                backoff.reset()
                wait = self.interval_s
            except grpc.aio.AioRpcError as exc:
                self._failed("report", exc)
                if await self._follow(exc):
                    backoff.reset()
                    wait = 0.0
                else:  # with etcd to ask, ask often: the new leader may be elected now
                    wait = min(backoff.next(), 1.0) if self._resolve else backoff.next()
            except asyncio.CancelledError:
                # the call's channel was closed under it (the plan stream moved the link to
                # another leader): report there. gRPC raises this, not an AioRpcError, and
                # it ended the loop: that host never reported again (bench/ha.py, 4 agents)
                if self._stop.is_set() or _task_cancelled():
                    raise
                LOG.debug("report %d cancelled: its leader's channel closed", self._seq)
                wait = 0.0
            await wait_event(self._poke, wait)

    async def _watch_loop(self) -> None:
        backoff = Backoff(self._backoff_max_s)
        resync = False
        while not self._stop.is_set():
            # resync: the table does not hold what a watermark built on; have 0 asks for all
            have = 0 if resync else self._have()
            resync = False
            call = self._call = self._stub.WatchPlan(
                lpb.WatchRequest(host_id=self.host_id, have_generation=have,
                                 incarnation=self._incarnation, report_seq=self._acked),
                metadata=self._auth())
            opened = False
            try:
                async for msg in call:
                    if not opened:
                        opened = True
                        if self._stream_ended:  # maybe a new or restarted leader
                            await self._stream_opened(call)
                    if not await self._vouched_for(msg.term):
                        call.cancel()  # this leader's plans are not applied: go where
                        if (named := await self._etcds_leader()) not in (None, self.address):
                            self._connect(named)  # etcd says the leader is
                        break
                    backoff.reset()
                    if not self.reachable:  # a leader whose view is current takes no
                        self._reached()  # report: its stream is how the agent learns
                    self.last_plan_mono = time.monotonic()
                    try:
                        resync = not self._on_plan(convert.host_plan_from_pb(msg))
                    except Exception as exc:  # a plan we cannot apply: keep the last one
                        LOG.error("plan generation %d not applied: %s", msg.generation, exc)
                    if resync:
                        call.cancel()
                        break
            except grpc.aio.AioRpcError as exc:
                if exc.code() is not grpc.StatusCode.CANCELLED:  # cancelled: a new leader
                    self._failed("plan stream", exc)
                    # the stream finds where the leader went (a standby's redirect, etcd,
                    # the fallback list): a report would cost the new leader one per host
                    if await self._follow(exc):
                        backoff.reset()
                        self._stream_ended = True
                        continue
            except asyncio.CancelledError:
                if self._stop.is_set() or call is self._call:
                    raise  # the task is cancelled, not just the call
            self._stream_ended = True
            if not resync:  # with etcd to ask, ask often: the new leader may be elected now
                wait = backoff.next()
                await asyncio.sleep(min(wait, 1.0) if self._resolve else wait)

    async def _stream_opened(self, call: grpc.aio.UnaryStreamCall[Any, Any]) -> None:
        """A plan stream opened after one ended: report unless the leader's view holds this
        host's latest acked report (a leader that says nothing is an older one: report)."""
        md = await call.initial_metadata()
        if dict(md or ()).get(VIEW_METADATA) == VIEW_CURRENT and not self._owed:
            self.reports_skipped += 1
            LOG.info("leader %s holds this host's report %d: none sent on the new stream",
                     self.address, self._acked)
            return
        self._poke_later()

    async def _read(self, call: Awaitable[T]) -> tuple[T | None, str, str]:
        """A read for cruxctl through this link: (answer, error, gRPC status name). A call
        whose channel closed under it (the link moved to another leader) is an error too,
        not a cancel of the caller."""
        try:
            return await call, "", ""
        except grpc.aio.AioRpcError as exc:
            return None, f"{exc.code().name}: {exc.details()}", exc.code().name
        except asyncio.CancelledError:
            if _task_cancelled():
                raise
            return None, "CANCELLED: the link moved to another leader", "CANCELLED"

    async def cluster_status(self) -> tuple[cpb.ClusterStatus | None, str]:
        doc, error, _ = await self._read(self._stub.Status(
            lpb.StatusRequest(), timeout=2.0, metadata=self._auth()))
        return doc, error

    async def plan_document(self) -> tuple[cpb.PlanDocument | None, str]:
        doc, error, _ = await self._read(self._stub.GetPlan(
            lpb.PlanRequest(), timeout=5.0, metadata=self._auth()))
        return doc, error

    async def hints(self, fmt: str) -> tuple[cpb.HintsDocument | None, str, str]:
        """(document, error, gRPC status name of the error)."""
        return await self._read(self._stub.GetHints(
            cpb.HintsRequest(format=fmt), timeout=10.0, metadata=self._auth()))


def _task_cancelled() -> bool:
    """Whether a CancelledError caught here is a cancel of the running task itself, not a
    gRPC call cancelled by its channel closing (which raises the same exception)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
