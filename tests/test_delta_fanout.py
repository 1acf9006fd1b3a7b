"""Delta fan-out: a host gets its full HostPlan only when its decisions changed since the
generation it holds, everyone else one shared watermark; agents advance on it without
touching their table, refuse plans from an older leader term, and ask for the whole plan
when a watermark does not build on what they hold."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from cruxd.agent.core import Agent, plan_decisions
from cruxd.control.host_plans import PublishedPlan
from cruxd.control.plan_delta import carry_changes, changed_hosts
from cruxd.control.records import HostPlan, JobAssignment, JobState, PeerRoute
from cruxd.leader.fanout import FanOut
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb
from tests.test_agent_sources import _config
from transport.decision_table import TableReader

HOSTS = ("h0", "h1", "h2", "h3", "h4")


def _content(plan: PublishedPlan, host: str) -> tuple[object, ...]:
    """What the host's agent acts on: its table, the profiled jobs, the peers to probe."""
    hp = plan.for_host(host)
    table = {replace(d, plan_generation=0) for d in plan_decisions(hp)}
    profiled = {a.job_id for a in hp.jobs if a.state is JobState.PROFILING}
    routes = {(a.job_id, a.routes) for a in hp.jobs}
    return hp.levels, table, profiled, routes, hp.reprobe


@st.composite
def plans(draw: st.DrawFn) -> list[PublishedPlan]:
    """A sequence of plans; each job keeps or changes its level and hosts at random."""
    jobs: dict[str, JobAssignment] = {}
    out = []
    for gen in range(1, draw(st.integers(2, 8)) + 1):
        for _ in range(draw(st.integers(0, 3))):
            jid = f"j{draw(st.integers(0, 5))}"
            if draw(st.booleans()) and jid in jobs:
                del jobs[jid]
                continue
            hosts = tuple(draw(st.lists(st.sampled_from(HOSTS), min_size=1, max_size=3,
                                        unique=True)))
            level = draw(st.integers(0, 3))
            route = PeerRoute(hosts[0], hosts[-1], ("10.0.0.9",), 49152 + level)
            state = draw(st.sampled_from((JobState.SCHEDULED, JobState.PROFILING)))
            jobs[jid] = JobAssignment(jid, state, level=level, dscp=8 * level,
                                      hosts=hosts, routes=(route,))
        for jid in draw(st.lists(st.sampled_from(sorted(jobs)), max_size=3)) if jobs else ():
            # what only the leader shows moves on every arrival: not a change for agents
            jobs[jid] = replace(jobs[jid], rank=draw(st.integers(0, 9)),
                                k=draw(st.floats(0.5, 2)), intensity=draw(st.floats(1, 9)))
        levels = draw(st.sampled_from((4, 4, 4, 3)))
        reprobe = {h: ("h9",) for h in draw(st.lists(st.sampled_from(HOSTS), max_size=1))}
        out.append(PublishedPlan(gen, gen * 1000, levels, tuple(jobs.values()),
                                 reprobe=reprobe))
    return out


@settings(max_examples=200, deadline=None)
@given(plans(), st.sampled_from(HOSTS))
def test_unchanged_is_only_said_of_hosts_whose_decisions_are_the_same(
        seq: list[PublishedPlan], host: str) -> None:
    chained: list[PublishedPlan] = []
    for p in seq:
        chained.append(carry_changes(chained[-1] if chained else None, p))
    last = chained[-1]
    for held in chained[:-1]:
        if last.unchanged_since(host, held.generation):
            assert _content(held, host) == _content(last, host)
    # and a plan that repeats the last one changes nobody
    again = carry_changes(last, PublishedPlan(last.generation + 1, 0, last.levels, last.jobs,
                                              reprobe=last.reprobe))
    assert not changed_hosts(last, again)
    assert all(again.unchanged_since(h, last.generation) for h in HOSTS) or \
        again.since == again.generation


def test_fanout_serialises_each_distinct_message_once() -> None:
    a = JobAssignment("a", JobState.SCHEDULED, level=2, dscp=16, hosts=("h0", "h1"))
    b = JobAssignment("b", JobState.SCHEDULED, level=1, dscp=8, hosts=("h2",))
    first = carry_changes(None, PublishedPlan(5, 0, 4, (a, b)))
    second = carry_changes(first, PublishedPlan(6, 0, 4, (a, JobAssignment(
        "b", JobState.SCHEDULED, level=3, dscp=24, hosts=("h2",)))))
    assert changed_hosts(first, second) == {"h2"}
    wire = FanOut(second)
    mark0, mark1 = wire.message("h0", 5), wire.message("h1", 5)
    assert mark0 is mark1  # one watermark for every unchanged host holding 5
    msg = lpb.HostPlan.FromString(mark0)
    assert (msg.generation, msg.unchanged, msg.base_generation, len(msg.jobs)) == (6, True, 5, 0)
    full = wire.message("h2", 5)
    assert wire.message("h2", 5) is full and not lpb.HostPlan.FromString(full).unchanged
    assert not lpb.HostPlan.FromString(wire.message("h0", 0)).unchanged  # holds nothing
    assert not lpb.HostPlan.FromString(wire.message("h0", 4)).unchanged  # before `since`
    assert (wire.full_sent, wire.marks_sent) == (4, 2)
    # a new stream of a host on this plan already still gets a first message: how its
    # agent learns the stream is up (and reports to a new leader that resumed generation 6)
    hello = lpb.HostPlan.FromString(wire.message("h2", 6))
    assert (hello.generation, hello.unchanged, hello.base_generation) == (6, True, 6)


def test_agent_advances_on_watermarks_and_refuses_older_terms(short_dir: Path) -> None:
    (short_dir / "run").mkdir()
    agent = Agent(_config(short_dir), "127.0.0.1:1")
    pokes: list[int] = []
    agent.link.poke = lambda: pokes.append(1)  # type: ignore[method-assign]
    try:
        a = JobAssignment("a", JobState.SCHEDULED, level=2, dscp=16, hosts=("h0",))
        assert agent.apply_plan(HostPlan(5, "h0", 0, 4, (a,), term=7))
        with TableReader(agent.config.agent.decision_table) as t:
            before = t.snapshot()
        assert agent.apply_plan(HostPlan(6, "", 0, 0, term=7, unchanged=True,
                                         base_generation=5))
        with TableReader(agent.config.agent.decision_table) as t:
            assert t.header().plan_generation == 6 and t.snapshot() == before
        # a new stream's first message to a host on the plan already: nothing changes
        assert agent.apply_plan(HostPlan(6, "", 0, 0, term=7, unchanged=True,
                                         base_generation=6))
        with TableReader(agent.config.agent.decision_table) as t:
            assert t.header().plan_generation == 6 and t.snapshot() == before
        # a watermark on a generation the table does not hold: ask for the whole plan
        assert not agent.apply_plan(HostPlan(8, "", 0, 0, term=7, unchanged=True,
                                             base_generation=7))
        # a deposed leader (older term) is not listened to
        b = JobAssignment("b", JobState.SCHEDULED, level=1, dscp=8, hosts=("h0",))
        assert agent.apply_plan(HostPlan(9, "h0", 0, 4, (b,), term=6))
        with TableReader(agent.config.agent.decision_table) as t:
            assert t.header().plan_generation == 6 and t.snapshot() == before
        assert agent.stale_refused == 1 and len(pokes) == 1  # the full plan's report only
        # a full plan numbered below the table within the term (issue 37: a restarted leader
        # served an older part): refused, the whole plan asked for again ...
        c = JobAssignment("c", JobState.SCHEDULED, level=1, dscp=8, hosts=("h0",))
        assert not agent.apply_plan(HostPlan(4, "h0", 0, 4, (c,), term=7))
        with TableReader(agent.config.agent.decision_table) as t:
            assert t.header().plan_generation == 6 and t.snapshot() == before
        assert agent.stale_refused == 2
        # ... and applied when the leader sends that number again: it is what it has
        assert agent.apply_plan(HostPlan(4, "h0", 0, 4, (c,), term=7))
        with TableReader(agent.config.agent.decision_table) as t:
            assert t.header().plan_generation == 4 and {d.key[0] for d in t.snapshot()} == {"c"}
        # a new term numbers on from the recorded generations: lower than the table is taken
        assert agent.apply_plan(HostPlan(3, "h0", 0, 4, (a,), term=8))
    finally:
        agent.table.close()
        agent.registry.close()
