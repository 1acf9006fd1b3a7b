"""The agent's link to the leader: periodic reports and the plan stream.

Both loops reconnect with jittered exponential backoff; while the leader is
away the decision table keeps the last plan (jobs keep running as planned).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from cruxd.config.model import TlsConfig
from cruxd.control.records import AgentReport, HostPlan
from cruxd.leader.auth import call_metadata
from cruxd.rpc import convert, tls
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb
from cruxd.rpc.gen.crux.v1 import leader_pb2_grpc as lgrpc

LOG = logging.getLogger(__name__)
RPC_TIMEOUT_S = 5.0


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
                 make_report: Callable[[], AgentReport], on_plan: Callable[[HostPlan], None],
                 interval_s: float, backoff_max_s: float,
                 have_generation: Callable[[], int], token_path: Path | None = None) -> None:
        self.address = address
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
        self._seq = 0
        self.reachable = False
        self.last_error = "not connected yet"
        self.last_plan_mono: float | None = None
        self.rpc_errors = 0

    async def start(self) -> None:
        self._channel = tls.channel(self.address, self._tls)
        self._stub = lgrpc.LeaderStub(self._channel)  # type: ignore[no-untyped-call]
        self._tasks = [asyncio.create_task(self._report_loop(), name="report"),
                       asyncio.create_task(self._watch_loop(), name="watch")]

    async def stop(self) -> None:
        self._stop.set()
        self._poke.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._channel is not None:
            try:
                await asyncio.wait_for(self._channel.close(grace=None), 2.0)
            except TimeoutError:
                LOG.warning("closing the channel to the leader timed out")

    def _auth(self) -> tuple[tuple[str, str], ...]:
        return call_metadata(self._token_path)

    def poke(self) -> None:
        """Report now (a job arrived or left)."""
        self._poke.set()

    def _failed(self, what: str, exc: grpc.aio.AioRpcError) -> None:
        self.rpc_errors += 1
        msg = f"{what}: {exc.code().name}: {exc.details()}"
        if self.reachable or msg != self.last_error:
            LOG.warning("leader %s: %s", self.address, msg)
        self.reachable = False
        self.last_error = msg

    async def _report_loop(self) -> None:
        backoff = Backoff(self._backoff_max_s)
        while not self._stop.is_set():
            self._poke.clear()
            self._seq += 1
            report = self._make_report()
            report = AgentReport(report.host, report.jobs, report.paths, report.links,
                                 report.applied_generation, self._seq)
            try:
                await self._stub.Report(convert.report_to_pb(report), timeout=RPC_TIMEOUT_S,
                                        metadata=self._auth())
                if not self.reachable:
                    LOG.info("leader %s reachable", self.address)
                self.reachable, self.last_error = True, ""
                backoff.reset()
                wait = self.interval_s
            except grpc.aio.AioRpcError as exc:
                self._failed("report", exc)
                wait = backoff.next()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), wait)

    async def _watch_loop(self) -> None:
        backoff = Backoff(self._backoff_max_s)
        while not self._stop.is_set():
            call = self._stub.WatchPlan(lpb.WatchRequest(host_id=self.host_id,
                                                         have_generation=self._have()),
                                       metadata=self._auth())
            try:
                async for msg in call:
                    backoff.reset()
                    self.last_plan_mono = time.monotonic()
                    try:
                        self._on_plan(convert.host_plan_from_pb(msg))
                    except Exception as exc:  # a plan we cannot apply: keep the last one
                        LOG.error("plan generation %d not applied: %s", msg.generation, exc)
            except grpc.aio.AioRpcError as exc:
                self._failed("plan stream", exc)
            await asyncio.sleep(backoff.next())

    async def cluster_status(self) -> tuple[cpb.ClusterStatus | None, str]:
        try:
            return await self._stub.Status(lpb.StatusRequest(), timeout=2.0,
                                           metadata=self._auth()), ""
        except grpc.aio.AioRpcError as exc:
            return None, f"{exc.code().name}: {exc.details()}"

    async def plan_document(self) -> tuple[cpb.PlanDocument | None, str]:
        try:
            return await self._stub.GetPlan(lpb.PlanRequest(), timeout=5.0,
                                            metadata=self._auth()), ""
        except grpc.aio.AioRpcError as exc:
            return None, f"{exc.code().name}: {exc.details()}"

    async def hints(self, fmt: str) -> tuple[cpb.HintsDocument | None, str, str]:
        """(document, error, gRPC status name of the error)."""
        try:
            doc = await self._stub.GetHints(cpb.HintsRequest(format=fmt), timeout=10.0,
                                            metadata=self._auth())
            return doc, "", ""
        except grpc.aio.AioRpcError as exc:
            return None, f"{exc.code().name}: {exc.details()}", exc.code().name
