"""The leader's RPCs (crux.v1.Leader), over the state the Leader in service.py keeps.

A standby (HA) answers Status only; the rest it refuses, naming the active leader.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from cruxd.config.model import Config
from cruxd.control.cluster import ClusterState
from cruxd.control.replan_stats import ReplanStats
from cruxd.control.validate import InvalidMessage, check_host_id, check_report
from cruxd.hints.formats import FORMATS
from cruxd.leader.auth import (
    LEADER_TRAILER,
    LOST_METADATA,
    VIEW_CURRENT,
    VIEW_METADATA,
    Gate,
    metadata_values,
)
from cruxd.leader.status import cluster_status
from cruxd.rpc import convert
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb
from cruxd.rpc.gen.crux.v1 import leader_pb2_grpc as lgrpc
from cruxd.waits import wait_event

if TYPE_CHECKING:
    from cruxd.control.host_plans import LeaderPlanConfig, PublishedPlan
    from cruxd.leader.fanout import FanOut
    from cruxd.leader.hint_service import LeaderHints
    from cruxd.model.topology import Topology

LOG = logging.getLogger("cruxd.leader.service")  # the service's log, as before the split
# An agent holds one plan stream (two while it replaces one); more are refused, so one
# host's credentials cannot pin the leader's memory with streams
MAX_STREAMS_PER_HOST = 4
MAX_ADDRESS = 256  # an address in LOST_METADATA; a longer one is not one of ours


# A call held for an agent that lost its leader, when this candidate has won and is still
# reading the state to resume, is held this much longer than the lease: it is served once
# that is done (1-2 s at 10,000 hosts, 4 s under load). Refused naming this candidate, 200
# to 850 of 10,000 agents waited out a retry (bench/ha.py --simulated).
READING_HOLD_S = 10.0


class LeaderRpcs(lgrpc.LeaderServicer):
    """The RPC half of cruxd.leader.service.Leader (which sets these)."""

    config: Config
    state: ClusterState
    plan: PublishedPlan | None
    replans: ReplanStats
    topology: Topology | None
    gate: Gate
    hints: LeaderHints
    role: str
    address: str
    term: int
    active_leader: str
    not_publishing: str
    max_jobs: int
    max_jobs_per_host: int
    watchers: int
    clock: Callable[[], float]
    _on_reject: Callable[[str, str], None]
    _unheard: set[str]
    _published: asyncio.Event
    _moved: asyncio.Event  # pulsed when the election moves (Leader.seen_leader)
    streams_opened: dict[str, int]
    refusals_held: int
    refusals_holding: int  # held now: agents wait on this standby (its campaign hurries)
    takeovers: dict[str, int]
    _task: asyncio.Task[None] | None

    def _event(self, *causes: str) -> None:
        raise NotImplementedError

    def fanout(self) -> FanOut | None:
        raise NotImplementedError

    def recheck_deadlines(self) -> None:
        raise NotImplementedError

    def sent_one(self) -> None:
        raise NotImplementedError

    def plan_config(self) -> LeaderPlanConfig:
        raise NotImplementedError

    async def _reject(self, context: grpc.aio.ServicerContext[Any, Any], rpc: str,
                      exc: InvalidMessage) -> None:
        self._on_reject(rpc, exc.field.split("[")[0].split(".")[0])
        LOG.warning("%s rejected from %s: %s", rpc, context.peer(), exc)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def _refuse_standby(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """A standby serves Status only; the rest it refuses, naming the active leader
        (also in the `crux-leader` trailer, where agents follow it). An agent that names
        the leader it lost (LOST_METADATA), while this standby still counts that one (or
        no one, or itself: won, not yet serving) active, waits here until the election
        moves, a lease and a second at most. Refused at once, it went back to the dead
        leader and round again, about eight failed calls per agent in a failover. Won
        meanwhile, this leader takes the call."""
        if self.role != "standby":
            return
        lost = _lost(context)
        # this candidate itself named: it won and is reading the state to resume
        waiting = (lost, "", self.address)
        if lost is not None and self.active_leader in waiting:
            self.refusals_held += 1
            self.refusals_holding += 1
            loop = asyncio.get_running_loop()
            end = loop.time() + self.config.leader.etcd_lease_s + 1.0
            try:
                while self.role == "standby" and self.active_leader in waiting:
                    left = end - loop.time()
                    if self.active_leader == self.address:  # won: serves it once it resumed
                        left += READING_HOLD_S
                    if left <= 0:
                        break
                    await wait_event(self._moved, left)
            finally:
                self.refusals_holding -= 1
            if self.role != "standby":
                return
        active = self.active_leader
        context.set_trailing_metadata(((LEADER_TRAILER, active),))
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                            f"standby leader; the active leader is {active or 'not elected yet'}")

    async def Report(self, request: lpb.AgentReport,
                     context: grpc.aio.ServicerContext[Any, Any]) -> lpb.ReportAck:
        await self.gate.check(context, "Report", request.host.host_id)
        await self._refuse_standby(context)
        try:
            report = check_report(convert.report_from_pb(request), self.max_jobs_per_host)
        except InvalidMessage as exc:
            await self._reject(context, "Report", exc)
            raise  # abort raised already; keeps type checkers honest
        new = {j.job_id for j in report.jobs} - self.state.jobs.keys()
        if new:  # counting is O(jobs): only when the report would add some
            live_jobs = sum(1 for j in self.state.jobs.values() if j.expired_at is None)
            if live_jobs + len(new) > self.max_jobs:
                await self._reject(context, "Report", InvalidMessage(
                    "jobs", f"leader.max_jobs ({self.max_jobs}) reached"))
        self._unheard.discard(report.host.host_id)
        self._event(*self.state.ingest(report, self.clock()))
        self.hints.observe(report)
        return lpb.ReportAck(plan_generation=self.plan.generation if self.plan else 0,
                             agent_timeout_s=self.config.leader.agent_timeout_s)

    async def WatchPlan(self, request: lpb.WatchRequest,
                        context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """Writes each plan's message for the host (cruxd.leader.fanout) until the client
        leaves or this leader stops; a coroutine, not a generator (handlers._stream)."""
        await self.gate.check(context, "WatchPlan", request.host_id)
        await self._refuse_standby(context)
        try:
            host = check_host_id(request.host_id)
        except InvalidMessage as exc:
            await self._reject(context, "WatchPlan", exc)
            return
        have = request.have_generation
        state = self.state  # HA: a new term starts a new state; this stream counts in this
        if state.streams.get(host, 0) >= MAX_STREAMS_PER_HOST:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{host} already has {MAX_STREAMS_PER_HOST} plan streams open")
        # a restored or newly elected leader whose view holds the agent's latest report
        # needs none again: 10,000 re-reports were most of a failover at 10,000 hosts
        current = state.holds_report(host, request.incarnation, request.report_seq)
        if current:
            self._unheard.discard(host)
        self.streams_opened["current" if current else "stale"] += 1
        await context.send_initial_metadata(
            ((VIEW_METADATA, VIEW_CURRENT if current else "stale"),))
        state.stream_opened(host)
        self.watchers += 1
        first = True  # the first message goes even to a host on this plan already
        try:
            while True:
                published = self._published
                wire = self.fanout()
                if wire is not None and (first or wire.plan.generation != have):
                    await context.write(wire.message(host, have))
                    have, first = wire.plan.generation, False
                    state.delivered(host, have)
                    self.sent_one()
                await published.wait()
                if self._task is None or self._task.done():
                    return  # shutting down, or stepped down: agents look for the leader
        finally:
            self.watchers -= 1
            state.stream_closed(host, self.clock())
            self.recheck_deadlines()  # the host's grace starts: the planner times it
            self.sent_one()  # one stream fewer to wait for

    async def Status(self, request: lpb.StatusRequest,
                     context: grpc.aio.ServicerContext[Any, Any]) -> cpb.ClusterStatus:
        await self.gate.check(context, "Status")
        return cluster_status(self, socket.gethostname(), request.brief)

    async def GetPlan(self, request: lpb.PlanRequest,
                      context: grpc.aio.ServicerContext[Any, Any]) -> cpb.PlanDocument:
        await self.gate.check(context, "GetPlan")
        await self._refuse_standby(context)
        if self.plan is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no plan yet (no agent reported)")
            raise AssertionError("unreachable")
        doc = {"generation": self.plan.generation, "planned_unix_ms": self.plan.planned_unix_ms,
               "causes": list(self.plan.causes), "topology": self.plan.topology,
               "plan": self.plan.plan_document()}
        if doc["plan"] is None and self.plan.jobs:
            doc["note"] = ("the scheduler's full plan is not kept across a leader restart; it "
                           "returns with the next plan (decisions: cruxctl status)")
        return cpb.PlanDocument(generation=self.plan.generation,
                                json=json.dumps(doc, allow_nan=False))

    async def GetHints(self, request: cpb.HintsRequest,
                       context: grpc.aio.ServicerContext[Any, Any]) -> cpb.HintsDocument:
        await self.gate.check(context, "GetHints")
        await self._refuse_standby(context)
        if request.format not in FORMATS:
            await self._reject(context, "GetHints", InvalidMessage(
                "format", f"unknown format {request.format!r}; formats: {', '.join(FORMATS)}"))
        got = await asyncio.to_thread(self.hints.render, request.format)
        if got is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no agent has reported yet")
            raise AssertionError("unreachable")
        return cpb.HintsDocument(format=got.format, version=got.version,
                                 media_type=got.media_type, text=got.text,
                                 plan_generation=self.plan.generation if self.plan else 0,
                                 generated_unix_ms=int(self.clock() * 1000))


def _lost(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The leader the caller says it lost (LOST_METADATA), if it names one sanely."""
    return next((v for v in metadata_values(context, LOST_METADATA)
                 if 0 < len(v) <= MAX_ADDRESS), None)
