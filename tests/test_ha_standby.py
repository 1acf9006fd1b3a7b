"""The hot standby (cruxd/leader/standby.py) on a real etcd: two in-process leader
candidates. A standby that wins resumes from the copy it decoded while standby when etcd
still holds what it decoded, and decodes at takeover when the state moved since.

In process rather than as daemons: the test needs to know when the standby's copy was made
and to change etcd between that and the win (a daemon would refresh on its own clock).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from cruxd.config.parse import parse_config
from cruxd.control.cluster import ClusterState
from cruxd.control.codec_json import to_json
from cruxd.control.host_plans import PublishedPlan
from cruxd.control.records import (
    AgentReport,
    HostInventory,
    JobAssignment,
    JobState,
    LocalJob,
    Nic,
)
from cruxd.leader import standby, store
from cruxd.leader.election import encode_state, revisions_of
from cruxd.leader.etcd import EtcdClient
from cruxd.leader.ha import Candidate
from cruxd.leader.service import Leader
from cruxd.testing.etcd_rig import EtcdCluster, etcd_missing

needs_etcd = pytest.mark.skipif(etcd_missing() is not None, reason=etcd_missing() or "")
LEASE_S = 2
GENERATION = 7


@pytest.fixture(autouse=True)
def _no_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy at once (test_a_settling_state_is_decoded_once_it_holds tests the wait)."""
    monkeypatch.setattr(standby, "STANDBY_SETTLE_S", 0.0)


@dataclass
class Resumed:
    line: str  # "elected leader, ..."
    generation: int | None
    agents: list[str]
    heard_s: float  # the longest since an agent was last heard from, as the leader sees it


def _report(host: str, i: int) -> AgentReport:
    return AgentReport(HostInventory(host, "1", 8, (Nic("mlx5_0", f"10.0.0.{i + 1}", 0,
                                                        100.0),)),
                       (LocalJob("a", 8, node_rank=i, nnodes=2),))


def _view(hosts: int) -> str:
    """The state key's value: a view of `hosts` agents, h0 and h1 running job a."""
    state = ClusterState(30.0, 0.1, 0.0)
    for i in range(hosts):
        report = _report(f"h{i}", i)
        state.ingest(report if i < 2 else AgentReport(report.host), 1.0)
    return store.snapshot_json(state, None)


def _plan() -> str:
    return to_json(PublishedPlan(GENERATION, 1000, 1, (JobAssignment(
        "a", JobState.SCHEDULED, level=0, dscp=26, hosts=("h0", "h1"), gpus=16),)))


def _candidate(tmp_path: Path, name: str, endpoints: list[str]) -> Candidate:
    (tmp_path / name).mkdir()
    config = parse_config(f"""
[daemon]
roles = ["leader"]
state_dir = "{tmp_path / name}"
[leader]
listen = "127.0.0.1:{7470 + int(name[-1])}"
debounce_ms = 0
profiling_s = 0
agent_timeout_s = 30
ha = "etcd"
etcd_endpoints = {endpoints!r}
etcd_lease_s = {LEASE_S}
etcd_insecure = true
""", "<test>")
    leader = Leader(config, None)
    leader.address = config.leader.listen  # never served: the test calls no RPC
    return Candidate(leader, name)


async def _put(client: EtcdClient, **values: str) -> None:
    for key, text in values.items():
        value = text.encode() if key == "generation" else encode_state(text)
        await client.put(f"/crux/{key}".encode(), value)


async def _until(what: str, check: Callable[[], object], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _killed(c: Candidate) -> None:
    """What SIGKILL leaves in etcd: no resign, the lease runs out on its own."""
    assert c._task is not None
    c._task.cancel()
    await asyncio.gather(c._task, return_exceptions=True)
    await c.standby.close()
    await c.leader.deactivate()
    await c.election.client.close()


def _failover(tmp_path: Path, caplog: pytest.LogCaptureFixture,
              between: Callable[[EtcdClient], Awaitable[None]] | None = None) -> Resumed:
    """l0 active, l1 standby with its copy made; `between(client)` may change etcd; l0 is
    killed and l1 wins: what l1 resumed."""
    etcd = EtcdCluster(tmp_path, members=1).start()
    caplog.set_level(logging.DEBUG, logger="cruxd.leader")

    async def run() -> Resumed:
        client = EtcdClient(parse_config(
            f'[leader]\nha = "etcd"\netcd_endpoints = {etcd.endpoints!r}\n'
            "etcd_insecure = true\n", "<test>").leader)
        first, second = (_candidate(tmp_path, n, etcd.endpoints) for n in ("l0", "l1"))
        killed = 0.0
        try:
            await _put(client, generation=str(GENERATION), plan=_plan(), state=_view(2))
            first.start()
            await _until("l0 active", lambda: first.leader.role == "active")
            second.start()
            await _until("l1's copy", lambda: second.standby._copy is not None)
            if between is not None:
                await between(client)
            await _killed(first)
            killed = time.monotonic()
            await _until("l1 active", lambda: second.leader.role == "active", 3 * LEASE_S)
            print(f"\nl1 active {time.monotonic() - killed:.2f} s after l0's kill")
            assert second.standby._copy is None and second.standby._decode is None
            line = [r.getMessage() for r in caplog.records
                    if r.getMessage().startswith("elected leader")][-1]
            ld = second.leader
            return Resumed(line, ld.plan.generation if ld.plan else None, sorted(ld.state.agents),
                           max(time.time() - r.last_report for r in ld.state.agents.values()))
        finally:
            await second.stop()
            if not killed:
                await first.stop()
            await client.close()

    try:
        return asyncio.run(run())
    finally:
        etcd.stop()


@pytest.mark.slow
@needs_etcd
def test_a_standby_resumes_from_its_copy(tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    got = _failover(tmp_path, caplog)
    assert re.search(rf"resuming generation {GENERATION} .*from the standby's copy",
                     got.line), got.line
    assert (got.generation, got.agents) == (GENERATION, ["h0", "h1"])
    # heard from as of the takeover, not as of the copy (made a lease and more before)
    assert got.heard_s < 1.5, got.heard_s


@pytest.mark.slow
@needs_etcd
def test_a_state_written_after_the_copy_is_decoded_at_takeover(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # no refresh between the copy and the win: the revision check at the win must see it
    monkeypatch.setattr(standby, "STANDBY_REFRESH_S", 60.0)

    async def newer(client: EtcdClient) -> None:
        await _put(client, state=_view(3))

    got = _failover(tmp_path, caplog, newer)
    assert re.search(rf"resuming generation {GENERATION} .*decoded at takeover",
                     got.line), got.line
    assert (got.generation, got.agents) == (GENERATION, ["h0", "h1", "h2"])


# --- the copy's bookkeeping, on an etcd of the test's own (no I/O, no election) ----------
@dataclass
class FakeKV:
    key: bytes
    value: bytes
    mod_revision: int


class FakeElection:
    """The three keys the standby reads, as Election.read() and .revisions() see them."""

    def __init__(self) -> None:
        self.revision = 0
        self.kvs: dict[str, FakeKV] = {}

    def put(self, **values: str) -> None:
        for key, text in values.items():
            self.revision += 1
            value = text.encode() if key == "generation" else encode_state(text)
            self.kvs[key] = FakeKV(f"/crux/{key}".encode(), value, self.revision)

    async def read(self) -> tuple[FakeKV | None, ...]:
        return tuple(self.kvs.get(k) for k in ("generation", "plan", "state"))

    async def revisions(self) -> tuple[int, ...]:
        return revisions_of(await self.read())


def _standby(el: FakeElection) -> standby.Standby:
    return standby.Standby(el, lambda: ClusterState(30.0, 0.1, 0.0), time.time)  # type: ignore[arg-type]


class _Decodes:
    """store.from_document, watched: how many decodes started, and how each ended
    ("done", or "stopped" when the standby dropped it), each taking `delay_s` longer."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, delay_s: float = 0.0) -> None:
        self.started = 0
        self.ends: list[str] = []
        real = store.from_document

        def watched(*args: object) -> PublishedPlan | None:
            self.started += 1
            time.sleep(delay_s)
            try:
                got = real(*args)  # type: ignore[arg-type]
            except store.Stopped:
                self.ends.append("stopped")
                raise
            self.ends.append("done")
            return got

        monkeypatch.setattr(store, "from_document", watched)


def test_an_unreadable_state_is_not_resumed_and_the_standby_carries_on(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(standby, "STANDBY_REFRESH_S", 0.02)
    el = FakeElection()
    el.put(generation=str(GENERATION), plan=_plan())
    el.revision += 1
    el.kvs["state"] = FakeKV(b"/crux/state", b"not zlib", el.revision)

    async def run() -> None:
        sb = _standby(el)
        sb.start()
        await _until("a copy", lambda: sb._copy is not None)
        assert "/crux/state unreadable" in caplog.text
        copy = sb._copy
        assert copy is not None and not copy.state.agents and copy.plan is not None
        el.put(state=_view(2))  # a good value later: still refreshed
        await _until("a new copy", lambda: sb._copy is not None and sb._copy.state.agents)
        await sb.stop()
        got = await sb.take()
        assert got is not None and sorted(got.state.agents) == ["h0", "h1"]
        assert sb._copy is None and await sb.take() is None  # handed out once, kept nowhere

    asyncio.run(run())


def test_a_decode_under_way_at_the_win(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old leader saved just before it died: the decode of that save, started while
    standby, is waited for rather than started again; one of an older save keeps nothing."""
    monkeypatch.setattr(standby, "STANDBY_REFRESH_S", 0.02)
    decodes = _Decodes(monkeypatch, delay_s=0.3)
    el = FakeElection()
    el.put(generation=str(GENERATION), plan=_plan(), state=_view(2))

    async def run(changed: bool) -> None:
        sb = _standby(el)
        sb.start()
        await _until("a decode", lambda: sb._thread is not None and not sb._thread.done())
        await sb.stop()
        decode = sb._decode
        if changed:
            el.put(state=_view(3))
        got = await sb.take()
        assert (got is None) == changed
        assert got is None or sorted(got.state.agents) == ["h0", "h1"]
        assert sb._thread is not None
        await sb._thread
        assert decode is not None and decode.take() is None  # nothing kept either way
        # one not wanted stops at once
        assert decodes.ends.count("stopped") == (1 if changed else 0)
        decodes.ends.clear()

    asyncio.run(run(changed=False))
    asyncio.run(run(changed=True))


def test_a_settling_state_is_decoded_once_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A state still changing (a new leader saving while its agents come back) is not
    decoded at each save: only once it has held for STANDBY_SETTLE_S."""
    monkeypatch.setattr(standby, "STANDBY_REFRESH_S", 0.02)
    monkeypatch.setattr(standby, "STANDBY_SETTLE_S", 0.3)
    decodes = _Decodes(monkeypatch)
    el = FakeElection()
    el.put(generation=str(GENERATION), plan=_plan(), state=_view(2))

    async def run() -> None:
        sb = _standby(el)
        sb.start()
        for n in range(2, 8):  # a save every 0.1 s: never held 0.3 s
            el.put(state=_view(2 + n % 2))
            await asyncio.sleep(0.1)
        assert decodes.started == 0 and sb._copy is None
        await _until("a copy once the state held", lambda: sb._copy is not None)
        assert decodes.started == 1
        await sb.close()

    asyncio.run(run())


def test_a_decode_under_way_stops_when_another_candidate_wins(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The old leader's last save, decoded while another candidate takes over, is of no
    use to this standby (the winner saves its own): it stops at its next step instead of
    taking a core from the failover, and the same revisions are decoded again later if
    the winner saves nothing new."""
    monkeypatch.setattr(standby, "STANDBY_REFRESH_S", 0.02)
    decodes = _Decodes(monkeypatch, delay_s=0.3)
    el = FakeElection()
    el.put(generation=str(GENERATION), plan=_plan(), state=_view(2))

    async def run() -> None:
        sb = _standby(el)
        sb.start()
        await _until("a decode", lambda: sb._thread is not None and not sb._thread.done())
        sb.leader_changed()
        await _until("the decode stopped", lambda: "stopped" in decodes.ends)
        await _until("decoded again, whole", lambda: sb._copy is not None)
        assert decodes.ends == ["stopped", "done"]
        await sb.close()

    asyncio.run(run())


def test_only_another_candidates_new_term_drops_the_decode(tmp_path: Path) -> None:
    """The first holder a standby sees is who was active when it started (a CI run dropped
    the decode of its first copy there); a newer term of another candidate is a new
    leader; this candidate's own win is not a reason to drop the copy it is about to use."""
    from cruxd.leader.election import Holder

    async def run() -> list[int]:
        c = _candidate(tmp_path, "l0", ["127.0.0.1:1"])  # never connects: no campaign
        dropped: list[int] = []
        c.standby.leader_changed = lambda: dropped.append(len(dropped))  # type: ignore[method-assign]
        other, me = "127.0.0.1:7471", c.leader.address
        for holder in (Holder(other, "b", 5), None, Holder(other, "b", 5),
                       Holder(me, "a", 8), Holder(other, "b", 9), Holder(other, "b", 9)):
            c._seen(holder)
        await c.election.client.close()
        return dropped
    # only term 9 (another candidate, after term 5 was seen) counts; term 8 was our own
    assert asyncio.run(run()) == [0]
