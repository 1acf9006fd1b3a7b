"""Planning waits while many hosts join at once (cruxd/leader/join_burst.py): the rule on
its own, and a real in-process leader taking a burst of joins in one plan."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from cruxd.control.host_plans import PublishedPlan
from cruxd.control.records import AgentReport, HostInventory, Nic
from cruxd.leader.join_burst import JOIN_BURST, JOIN_HOLD_MAX_S, JOIN_WINDOW_S, JoinBurst
from tests.inproc_leader import inproc_leader


def test_a_few_joins_never_hold_a_plan() -> None:
    b = JoinBurst()
    b.joined(0.0, JOIN_BURST - 1)
    assert b.holding(0.1) == 0.0


def test_a_burst_holds_until_it_ends_or_for_the_cap() -> None:
    b = JoinBurst()
    b.joined(0.0, JOIN_BURST)
    assert 0 < b.holding(0.5) <= JOIN_WINDOW_S  # look again when the oldest join leaves
    assert b.holding(JOIN_WINDOW_S + 0.02) == 0.0  # it left: the burst is over
    # a burst that goes on (a quarter of a burst every quarter second): it is one from
    # its fourth quarter on, held JOIN_HOLD_MAX_S from then, and then plans go as ever
    t, start = 10.0, 10.75
    while t < start + JOIN_HOLD_MAX_S + 3:
        b.joined(t, JOIN_BURST // 4)
        assert (b.holding(t) > 0) == (start <= t < start + JOIN_HOLD_MAX_S), t
        t += 0.25


@given(st.lists(st.tuples(st.floats(0, 0.5), st.integers(0, 400)), max_size=60))
def test_no_burst_holds_longer_than_the_cap(steps: list[tuple[float, int]]) -> None:
    """Whatever the joins, a held stretch (holding > 0 at every look) is bounded."""
    b, t, held_since = JoinBurst(), 0.0, None
    for dt, n in steps:
        t += dt
        b.joined(t, n)
        if b.holding(t) > 0:
            held_since = t if held_since is None else held_since
            assert t - held_since <= JOIN_HOLD_MAX_S + 1e-9
        else:
            held_since = None


def _report(i: int) -> AgentReport:
    return AgentReport(HostInventory(f"h{i}", "1.0", 8,
                                     (Nic("mlx5_0", f"10.{i // 250}.{i % 250}.1", 0, 100.0),)))


def test_a_leader_takes_the_rest_of_a_burst_in_one_plan(tmp_path: Path) -> None:
    """400 hosts join in 8 batches 50 ms apart. Before the burst is seen (200 joins within
    a second) plans go as ever; every join after it lands in one plan, made once the
    burst is over, not in one plan per batch."""
    async def run() -> list[PublishedPlan]:
        plans: list[PublishedPlan] = []
        ld = inproc_leader(tmp_path, plans)
        ld.start()
        try:
            for batch in range(8):
                for i in range(batch * 50, batch * 50 + 50):
                    ld._event(*ld.state.ingest(_report(i), ld.clock()))
                await asyncio.sleep(0.05)
            for _ in range(250):  # the burst ends a window after it: one plan then
                if any("agent joined: h399" in p.causes for p in plans):
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)
            return plans
        finally:
            await ld.stop()

    plans = asyncio.run(run())
    late = [p for p in plans if any(c.startswith("agent joined: h") and
                                     int(c.rsplit("h", 1)[1]) >= 250 for c in p.causes)]
    assert len(late) == 1, [len(p.causes) for p in plans]
    assert {f"agent joined: h{i}" for i in range(250, 400)} <= set(late[0].causes)
