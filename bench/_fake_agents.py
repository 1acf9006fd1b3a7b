"""Simulated crux agents for bench/control_plane.py: the worker processes (their workload:
bench/_workload.py).

A simulated agent is what a real `cruxd` agent looks like to the leader: one WatchPlan
stream (opened with the generation it holds; its liveness), a Report at start, one when a
job of its host arrives, one (jittered by the real agent's REPORT_JITTER_S) when its plan
stream comes back after a failure on a leader whose view lacks its latest report (the
stream's metadata says; a failed stream follows a standby's redirect itself, naming the
leader it lost to the next one it asks, as the real agent does), and
otherwise one every `interval_s` (the real agent's refresh_s; the first one jittered):
agents report only on change
(cruxd/agent/report_change.py). With `poke_on_plan`, also one right after every full plan,
as agents did before the leader took the generation a host holds from its stream. By default
each agent has its own gRPC channel and TCP connection (a local subchannel pool), as
separate hosts would; `per_channel` > 1 multiplexes that many agents on one channel (one
TCP connection; still one WatchPlan stream and one Report call at a time per agent), for
when one connection per agent does not fit the machine the benchmark runs on.

Plans: a HostPlan is either full (the host's decisions: `jobs`) or, with `unchanged`
set, a watermark: generation G changes nothing on this host since `base_generation`,
which it holds, and carries no jobs (the leader's delta fan-out). An agent holds
generation G on either kind. A job counts as planned on a host only from a full plan
that has it in a planned state (planned_at); an unchanged plan changes nothing there:
the host keeps its last full plan's decisions. An unchanged plan whose base is not the
generation the agent holds is counted as a failure ("WatchPlan unchanged base
mismatch") but still advances it.

A worker process runs a few hundred of them on one asyncio loop and answers the
controller's commands over a multiprocessing pipe. Timestamps are
time.monotonic() (CLOCK_MONOTONIC, system-wide on Linux), so they compare across
processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from _workload import JobSpec, host_id, inventory_pb, local_job_pb, make_jobs

from cruxd.waits import wait_event

PLANNED = (1, 2, 3)  # JobState PROFILING, SCHEDULED, QUEUED: the scheduler placed it
# how often a wait_* command looks at the agents; their times are taken when a plan arrives
# (in _watch), so this only sets how soon the controller hears, at O(agents) CPU a look
POLL_S = 0.02
FOLLOW_POLL_S = 0.25  # wait_followed's looks (each walks the agents' recent events)


@dataclass
class FakeAgent:
    index: int
    jobs: list[Any]  # cpb.LocalJob
    inventory: Any
    stub: Any = None
    channel: Any = None
    metadata: tuple[tuple[str, str], ...] = ()  # the leader's bearer token
    seq: int = 0
    generation: int = 0
    gen_time: dict[int, float] = field(default_factory=dict)  # generation -> first seen
    full_plans: int = 0
    unchanged_plans: int = 0
    planned_at: dict[str, tuple[int, float]] = field(default_factory=dict)  # job -> (gen, t)
    poke: asyncio.Event = field(default_factory=asyncio.Event)
    reports: int = 0
    errors: int = 0
    codes: dict[str, int] = field(default_factory=dict)  # failed RPCs by status code
    acked: asyncio.Event = field(default_factory=asyncio.Event)
    acked_since: float = 0.0  # start time of the latest Report acked
    stream_ended: bool = False  # a plan stream ended: the next one may be a new leader
    full_at: float = 0.0  # when the latest full plan that owes a report arrived
    at: int = 0  # which of the worker's leader addresses it talks to
    last_error: Any = None  # the latest failed Report's exception
    acks: list[tuple[float, int]] = field(default_factory=list)  # recent (ack time, at)
    # the real agent's report identity: a new stream names the latest report acked, and a
    # leader whose view holds it says so (no report owed on that stream)
    incarnation: int = field(default_factory=lambda: random.getrandbits(64) or 1)
    acked_seq: int = 0
    # recent plan streams opened after one ended: (first message's time, at, view current)
    streams: list[tuple[float, int, bool]] = field(default_factory=list)
    lost: str = ""  # the leader address a call just found no one at (as the real agent's)
    report_at: int = 0  # the address the latest report went to

    def md(self) -> tuple[tuple[str, str], ...]:
        """A call's metadata: the token, and the leader lost (cruxd.leader.auth)."""
        from cruxd.leader.auth import LOST_METADATA

        return (*self.metadata, (LOST_METADATA, self.lost)) if self.lost else self.metadata

    def fail(self, what: str) -> None:
        self.errors += 1
        self.codes[what] = self.codes.get(what, 0) + 1

    def report_pb(self) -> Any:
        from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
        from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb

        self.seq += 1
        return lpb.AgentReport(schema=cpb.SCHEMA_REVISION_CURRENT, host=self.inventory,
                               jobs=self.jobs, applied_generation=self.generation,
                               seq=self.seq, incarnation=self.incarnation)

    async def report(self) -> bool:
        import grpc

        from cruxd.agent.uplink import REPORT_TIMEOUT_S

        start = time.monotonic()
        pb = self.report_pb()
        self.report_at = self.at
        try:
            await self.stub.Report(pb, timeout=REPORT_TIMEOUT_S, metadata=self.md())
        except grpc.aio.AioRpcError as exc:
            self.fail(f"Report {exc.code().name}")
            self.last_error = exc
            return False
        self.lost = ""
        self.reports += 1
        self.acked_seq = pb.seq
        self.acks = [*self.acks[-7:], (time.monotonic(), self.at)]
        self.acked_since = max(self.acked_since, start)
        self.acked.set()
        return True


def on_plan(a: FakeAgent, msg: Any, now: float) -> None:
    """Apply a HostPlan (full or unchanged) to a simulated agent's state."""
    gen = msg.generation
    if msg.unchanged:
        a.unchanged_plans += 1
        if msg.base_generation != a.generation:
            a.fail("WatchPlan unchanged base mismatch")
    else:
        a.full_plans += 1
        for d in msg.jobs:
            if d.state in PLANNED and d.job_id not in a.planned_at:
                a.planned_at[d.job_id] = (gen, now)
    a.gen_time.setdefault(gen, now)
    a.generation = gen


class Worker:
    """`address`: the leader's host:port, or the HA candidates' comma-separated: an agent
    then follows a standby's refusal to the leader it names, and moves to the next
    candidate when its leader is unreachable, as the real agent's uplink does."""

    def __init__(self, address: str, hosts: list[int], jobs: dict[int, list[Any]],
                 interval_s: float, poke_on_plan: bool, nics: tuple[int, float] | None = None,
                 per_channel: int = 1) -> None:
        from _cluster_shapes import inventory

        self.addresses = address.split(",")
        # (agent group, address) -> (channel, stub)
        self._channels: dict[tuple[int, int], tuple[Any, Any]] = {}
        self.agents = [FakeAgent(i, jobs.get(i, []), inventory_pb(i) if nics is None
                                 else inventory(i, *nics)) for i in hosts]
        self.by_index = {a.index: a for a in self.agents}
        self.interval_s = interval_s
        self.poke_on_plan = poke_on_plan
        self.per_channel = max(1, per_channel)
        self.tasks: list[asyncio.Task[None]] = []

    def _use(self, a: FakeAgent, at: int) -> None:
        """Point `a` at leader address `at`: one TCP connection per simulated host
        (per_channel 1), as separate machines would have, or per group of per_channel."""
        import grpc

        from cruxd.rpc.gen.crux.v1 import leader_pb2_grpc as lgrpc
        from cruxd.rpc.tls import KEEPALIVE, reconnect_options

        a.at = at % len(self.addresses)
        key = (a.index // self.per_channel, a.at)  # hosts are consecutive in a worker
        got = self._channels.get(key)
        if got is None:
            # reconnecting as the real agent's channel does (cruxd.agent.uplink._connect):
            # a cached channel to a leader that was down waited out gRPC's own backoff
            ch = grpc.aio.insecure_channel(
                self.addresses[a.at],
                options=[*KEEPALIVE, ("grpc.use_local_subchannel_pool", 1),
                         *reconnect_options(1.0 if len(self.addresses) > 1 else 30.0)])
            # one stub per channel: a stub registers each method with the channel, which
            # was 7 % of a simulated-agent worker's samples in a failover (py-spy)
            got = self._channels[key] = ch, lgrpc.LeaderStub(ch)  # type: ignore[no-untyped-call]
        a.channel, a.stub = got

    def _follow(self, a: FakeAgent, exc: Any, at: int) -> bool:
        """After a failed call to address `at`: a standby's named leader (True), else,
        with several candidates, the next one. Once per failure of the leader, as the real
        agent moves once though its stream and its report both fail: where one of them
        moved the agent already, the other follows it (True)."""
        import grpc

        from cruxd.leader.auth import LEADER_TRAILER

        if len(self.addresses) < 2 or exc.code() == grpc.StatusCode.CANCELLED:
            return False  # cancelled: not the leader's answer
        if at != a.at:
            return True
        named = dict(exc.trailing_metadata() or ()).get(LEADER_TRAILER)
        if exc.code() == grpc.StatusCode.FAILED_PRECONDITION and named in self.addresses:
            if self.addresses.index(named) == a.at:
                return False  # a deposed leader naming itself: wait, as the real agent
            self._use(a, self.addresses.index(named))
            return True
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            a.lost = self.addresses[a.at]  # named to the next one: a standby holds its answer
        if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            self._use(a, a.at + 1)
        return False

    async def connect(self, timeout: float = 120.0) -> int:
        for a in self.agents:
            self._use(a, 0)
            self.tasks.append(asyncio.create_task(self._watch(a)))
            self.tasks.append(asyncio.create_task(self._report_loop(a)))
        await asyncio.wait_for(asyncio.gather(*(a.acked.wait() for a in self.agents)), timeout)
        return sum(a.reports for a in self.agents)

    async def _watch(self, a: FakeAgent) -> None:
        import grpc

        from cruxd.agent.uplink import REPORT_JITTER_S, Backoff
        from cruxd.leader.auth import VIEW_CURRENT, VIEW_METADATA
        from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb

        # the real agent's schedule; with several candidates (HA), at most 1 s apart
        backoff = Backoff(30.0 if len(self.addresses) < 2 else 1.0)
        while True:
            at = a.at
            call = a.stub.WatchPlan(lpb.WatchRequest(
                host_id=host_id(a.index), have_generation=a.generation,
                incarnation=a.incarnation, report_seq=a.acked_seq), metadata=a.md())
            opened = False
            try:
                async for msg in call:
                    if not opened and a.stream_ended:  # a new or restarted leader
                        md = dict(await call.initial_metadata() or ())
                        current = md.get(VIEW_METADATA) == VIEW_CURRENT
                        a.streams = [*a.streams[-7:], (time.monotonic(), a.at, current)]
                        if not current:  # its view lacks this host's latest report
                            asyncio.get_running_loop().call_later(
                                random.uniform(0, REPORT_JITTER_S), a.poke.set)
                    opened, a.lost = True, ""
                    backoff.reset()
                    on_plan(a, msg, time.monotonic())
                    if self.poke_on_plan and not msg.unchanged:
                        a.full_at = time.monotonic()
                        a.poke.set()
            except grpc.aio.AioRpcError as exc:
                a.fail(f"WatchPlan {exc.code().name}")
                # the stream finds where the leader went, as the real agent's does
                if self._follow(a, exc, at):
                    a.stream_ended = True
                    backoff.reset()
                    continue
            a.stream_ended = True
            await asyncio.sleep(backoff.next())

    async def _report_loop(self, a: FakeAgent) -> None:
        from cruxd.agent.uplink import REPORT_JITTER_S, Backoff

        # the real agent's retry schedule; with etcd to ask (HA), at most 1 s apart
        backoff = Backoff(30.0 if len(self.addresses) < 2 else 1.0)
        first = True
        await asyncio.sleep(random.uniform(0, REPORT_JITTER_S))  # as the real agent's
        while True:
            a.poke.clear()
            if await a.report():
                backoff.reset()
                wait = self.interval_s * (random.uniform(0.0, 1.0) if first else 1.0)
                first = False
            elif self._follow(a, a.last_error, a.report_at):
                backoff.reset()
                wait = 0.0
            else:
                wait = backoff.next()
            await wait_event(a.poke, wait)  # not wait_for: it can swallow the stop's cancel

    async def flood(self, start_at: float, seconds: float) -> dict[str, Any]:
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        end = start_at + seconds
        before = [(a.reports, a.errors) for a in self.agents]

        async def one(a: FakeAgent) -> None:
            while time.monotonic() < end:
                await a.report()

        await asyncio.gather(*(one(a) for a in self.agents))
        done = time.monotonic()
        acks = sum(a.reports - r for a, (r, _) in zip(self.agents, before, strict=True))
        errs = sum(a.errors - e for a, (_, e) in zip(self.agents, before, strict=True))
        return {"acks": acks, "errors": errs, "end": done}

    async def arrive(self, spec: JobSpec) -> dict[str, Any]:
        now_ms = int(time.time() * 1000)
        members = [self.by_index[h] for h in spec.hosts]
        for a in members:
            a.jobs = [*a.jobs, local_job_pb(spec, a.index, now_ms)]
        t0 = time.monotonic()
        ok = await asyncio.gather(*(a.report() for a in members))
        return {"t0": t0, "acked": time.monotonic(), "ok": all(ok)}

    async def wait_planned(self, job_id: str, hosts: list[int], timeout: float
                           ) -> list[tuple[int, float]] | None:
        end = time.monotonic() + timeout
        members = [self.by_index[h] for h in hosts]
        while not all(job_id in a.planned_at for a in members):
            if time.monotonic() > end:
                return None
            await asyncio.sleep(POLL_S)
        return [a.planned_at[job_id] for a in members]

    async def wait_generation(self, gen: int, timeout: float) -> list[float] | None:
        """Per agent: when it first held a generation >= gen."""
        end = time.monotonic() + timeout
        while not all(a.generation >= gen for a in self.agents):
            if time.monotonic() > end:
                return None
            await asyncio.sleep(POLL_S)
        return [min(t for g, t in a.gen_time.items() if g >= gen) for a in self.agents]

    async def wait_quiet(self, timeout: float) -> bool:
        """Every agent has had a Report acked that it sent after its latest full plan (a
        watermark sends none)."""
        end = time.monotonic() + timeout
        while not all(a.acked_since >= a.full_at for a in self.agents):
            if time.monotonic() > end:
                return False
            await asyncio.sleep(POLL_S)
        return True

    def generations(self) -> list[int]:
        return [a.generation for a in self.agents]

    async def wait_followed(self, since: float, gone: str, timeout: float
                            ) -> list[float] | None:
        """Per agent: when it first followed a leader other than `gone` after `since`
        (monotonic): a plan stream open on it (a standby refuses streams), and, where that
        leader's view lacked the host's latest report, that report acked by it. A new
        leader resumes its predecessor's plan and generation, so the plan that comes on
        the stream is a watermark."""
        end = time.monotonic() + timeout
        skip = self.addresses.index(gone) if gone in self.addresses else -1

        def first(a: FakeAgent) -> float | None:
            opened = next(((t, at, cur) for t, at, cur in a.streams
                           if t > since and at != skip), None)
            if opened is None:
                return None
            if opened[2]:
                return opened[0]
            acked = next((t for t, at in a.acks if t > since and at == opened[1]), None)
            return None if acked is None else max(acked, opened[0])

        # the times are those the agents noted (above); a look costs O(agents still
        # pending), so look seldom: every 20 ms over 10,000 agents was a core of the box's 2
        got: dict[int, float] = {}
        pending = self.agents
        while True:
            left = []
            for a in pending:
                t = first(a)
                if t is None:
                    left.append(a)
                else:
                    got[a.index] = t
            pending = left
            if not pending:
                return [got[a.index] for a in self.agents]
            if time.monotonic() > end:
                return None
            await asyncio.sleep(FOLLOW_POLL_S)

    def where(self) -> dict[str, int]:
        """How many agents talk to each leader address."""
        out: dict[str, int] = {}
        for a in self.agents:
            out[self.addresses[a.at]] = out.get(self.addresses[a.at], 0) + 1
        return out

    def plans(self) -> tuple[int, int]:
        """(full, unchanged) HostPlans received so far by this worker's agents."""
        return (sum(a.full_plans for a in self.agents),
                sum(a.unchanged_plans for a in self.agents))

    def errors(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.agents:
            for k, v in a.codes.items():
                out[k] = out.get(k, 0) + v
        return out

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.gather(*(c.close() for c, _ in self._channels.values()),
                             return_exceptions=True)


def worker_main(conn: Connection, address: str, hosts: list[int], n_hosts: int, n_jobs: int,
                seed: int, interval_s: float, poke_on_plan: bool, token: str = "",
                specs: list[JobSpec] | None = None, nics: tuple[int, float] | None = None,
                per_channel: int = 1) -> None:
    """Entry point of a worker process (multiprocessing, spawn). The jobs: `specs` (the
    parts on `hosts` are used), else make_jobs(n_hosts, n_jobs, seed). nics: (NICs per
    host, Gbps) the agents declare, else _workload's. per_channel: agents per channel."""
    import ctypes
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller stops us
    with contextlib.suppress(OSError, AttributeError):  # die with the controller
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    if specs is None:
        specs = make_jobs(n_hosts, n_jobs, seed)
    asyncio.run(_serve(conn, address, hosts, specs, interval_s, poke_on_plan, token, nics,
                       per_channel))


async def _serve(conn: Connection, address: str, hosts: list[int], specs: list[JobSpec],
                 interval_s: float, poke_on_plan: bool, token: str,
                 nics: tuple[int, float] | None, per_channel: int) -> None:
    mine = set(hosts)
    now_ms = int(time.time() * 1000)
    jobs: dict[int, list[Any]] = {}
    for spec in specs:
        for h in spec.hosts:
            if h in mine:
                jobs.setdefault(h, []).append(local_job_pb(spec, h, now_ms))
    worker = Worker(address, hosts, jobs, interval_s, poke_on_plan, nics, per_channel)
    for a in worker.agents:
        a.metadata = (("authorization", f"Bearer {token}"),) if token else ()
    loop = asyncio.get_running_loop()
    conn.send(("ready", None))
    try:
        while True:
            cmd, arg = await loop.run_in_executor(None, conn.recv)
            if cmd == "stop":
                break
            try:
                if cmd == "connect":
                    res: Any = await worker.connect(*(arg or ()))
                elif cmd == "generations":
                    res = worker.generations()
                elif cmd == "errors":
                    res = worker.errors()
                elif cmd == "plans":
                    res = worker.plans()
                elif cmd == "flood":
                    res = await worker.flood(*arg)
                elif cmd == "arrive":
                    res = await worker.arrive(arg)
                elif cmd == "wait_planned":
                    res = await worker.wait_planned(*arg)
                elif cmd == "wait_quiet":
                    res = await worker.wait_quiet(arg)
                elif cmd == "wait_generation":
                    res = await worker.wait_generation(*arg)
                elif cmd == "wait_followed":
                    res = await worker.wait_followed(*arg)
                elif cmd == "where":
                    res = worker.where()
                else:
                    raise ValueError(f"unknown command {cmd!r}")
                conn.send(("ok", res))
            except Exception as exc:  # tell the controller, keep serving
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        await worker.close()
        conn.send(("stopped", None))
