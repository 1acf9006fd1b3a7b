"""The agent's core knows its sources only by their protocols and speaks no protobuf: a
source written against `MeasurementSource` / `ProbingSource` alone plugs into an unchanged
core, and every hook the core offers reaches it, through the local socket too."""

from __future__ import annotations

import ast
import asyncio
import os
from pathlib import Path

import pytest

from cruxd.agent.core import Agent
from cruxd.agent.local_api import Refusal, Refused
from cruxd.agent.local_server import PeerCred
from cruxd.agent.source_choice import SourceInputs
from cruxd.agent.sources import MeasurementSource, ProbingSource
from cruxd.config.model import Config
from cruxd.config.parse import parse_config
from cruxd.control.records import (
    HostPlan,
    JobAssignment,
    JobState,
    LinkObservation,
    LocalJob,
    Measurement,
    PathTable,
    ProbedPath,
)
from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from cruxd.rpc.local import NOT_FOUND, LocalClient

CORE = Path(__file__).resolve().parent.parent / "cruxd" / "agent" / "core.py"
SOURCE_CLASSES = {"LiveMeasurement", "StaticMeasurement", "ReplayMeasurement",
                  "SweepProbing", "StaticPaths", "NoProbing"}


def _core() -> ast.Module:
    return ast.parse(CORE.read_text())


def test_the_core_asks_no_source_what_it_is() -> None:
    for call in ast.walk(_core()):
        if isinstance(call, ast.Call) and ast.unparse(call.func) == "isinstance":
            text = ast.unparse(call)
            assert ast.unparse(call.args[0]) not in ("self.measurement", "self.probing"), text
            assert not SOURCE_CLASSES & {n.id for n in ast.walk(call)
                                         if isinstance(n, ast.Name)}, text


def test_the_core_imports_no_protobuf_and_no_concrete_source() -> None:
    modules = set()
    for node in ast.walk(_core()):
        if isinstance(node, ast.Import):
            modules |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    assert not {m for m in modules if m.startswith(("cruxd.rpc.gen", "google.protobuf"))}
    assert not {m for m in modules if m.startswith(("cruxd.agent.measuring",
                                                     "cruxd.agent.sweeper"))}
    assert not {m.rsplit(".", 1)[-1] for m in modules} & SOURCE_CLASSES


class Calls:
    def __init__(self) -> None:
        self.log: list[str] = []


class TallyMeasurement:
    """Implements the protocol and nothing else: no base class from cruxd."""

    name = "tally (test)"

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.live: set[str] = set()

    def start(self) -> None:
        self.calls.log.append("measurement start")

    def stop(self) -> None:
        self.calls.log.append("measurement stop")

    def reconfigure(self, config: Config) -> None:
        self.calls.log.append(f"reconfigure {config.agent.report_interval_s}")

    def plan_changed(self, hp: HostPlan) -> None:
        self.calls.log.append(f"measurement plan {hp.generation}")

    def forget(self, live: set[str]) -> None:
        self.live = live

    def measure(self, job: LocalJob, hints: Measurement) -> Measurement:
        return Measurement(flops_per_iter=2e12, comm_s=0.1, period_s=0.5, source="tally")

    def wants_profile(self, job_id: str) -> bool:
        return job_id == "j"

    def links(self) -> tuple[LinkObservation, ...]:
        return (LinkObservation("net:eth9", 0.25),)


class FixedProbing:
    name = "fixed (test)"

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    async def start(self) -> None:
        self.calls.log.append("probing start")

    async def stop(self) -> None:
        self.calls.log.append("probing stop")

    def plan_changed(self, hp: HostPlan) -> None:
        self.calls.log.append(f"probing plan {hp.generation}")

    def paths(self) -> tuple[PathTable, ...]:
        return (PathTable("h1", (ProbedPath(("leaf0", "h1"), (49152,)),)),)


def _config(d: Path, interval: float = 5.0) -> Config:
    return parse_config(
        f'[daemon]\nhost_id = "h0"\nstate_dir = "{d}/state"\nruntime_dir = "{d}/run"\n'
        f'[agent]\nleader = "127.0.0.1:1"\ngpus = 0\naddresses = ["127.0.0.1"]\n'
        f"report_interval_s = {interval}\n", "<t>")


def test_a_source_that_only_implements_the_protocol_plugs_into_the_core(
        short_dir: Path) -> None:
    calls = Calls()
    tally, fixed = TallyMeasurement(calls), FixedProbing(calls)
    made: list[SourceInputs] = []

    def measurement(inputs: SourceInputs) -> MeasurementSource:
        made.append(inputs)
        return tally

    def probing(inputs: SourceInputs) -> ProbingSource:
        return fixed

    config = _config(short_dir)
    (short_dir / "run").mkdir()
    agent = Agent(config, "127.0.0.1:1", measurement, probing)
    assert made[0].config is config
    me = PeerCred(os.getpid(), os.getuid(), os.getgid())

    async def run() -> None:
        await agent.start()
        try:
            agent.register(LocalJob("j", 2), Measurement(), me)
            report = agent.report()
            assert [j.measurement.source for j in report.jobs] == ["tally"]
            assert [j.request_profiling for j in report.jobs] == [True]
            assert report.host.measurement_source == "tally (test)"
            assert report.host.probing_source == "fixed (test)"
            assert [t.dst_host for t in report.paths] == ["h1"]
            assert report.links == (LinkObservation("net:eth9", 0.25),)
            agent.apply_plan(HostPlan(3, "h0", 0, 4, (JobAssignment("j", JobState.PROFILING),)))
            agent.reload(_config(short_dir, interval=2.0))
            # the edge: a request on the real socket reaches the core and the sources
            client = LocalClient(config.agent.socket)
            reply = await asyncio.to_thread(client.call, apb.LocalRequest(
                status=apb.LocalStatusRequest(local_only=True)))
            a = reply.status.agent
            assert (a.measurement_source, a.probing_source) == ("tally (test)", "fixed (test)")
            assert [(j.job_id, j.measurement.source) for j in a.jobs] == [("j", "tally")]
            assert [(p.peer_host, p.paths) for p in a.peers] == [("h1", 1)]
            gone = await asyncio.to_thread(client.call, apb.LocalRequest(
                deregister=apb.DeregisterJob(job_id="nope")))
            assert gone.error.code == NOT_FOUND
            with pytest.raises(Refused) as refused:
                agent.register(LocalJob("", 2), Measurement(), me)
            assert refused.value.reason is Refusal.INVALID and agent.rejected == 1
            agent.deregister("j", me)
            assert agent.local_jobs() == [] and tally.live == set()
        finally:
            await agent.stop()

    asyncio.run(run())
    assert calls.log == ["measurement start", "probing start", "probing plan 3",
                         "measurement plan 3", "reconfigure 2.0", "probing stop",
                         "measurement stop"]
