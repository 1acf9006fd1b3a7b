"""codec_json: the leader's saves encode a frozen record once, and write the same text as
json.dumps of the plain conversion."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import typing

from hypothesis import given, settings
from hypothesis import strategies as st

from cruxd.control.cluster import AgentRecord, ClusterState, JobRecord
from cruxd.control.codec import to_dict
from cruxd.control.codec_json import Memo, to_json
from cruxd.control.host_plans import PublishedPlan
from cruxd.control.records import (
    HostInventory,
    JobAssignment,
    JobState,
    LocalJob,
    Nic,
    PeerRoute,
)
from cruxd.leader import store

names = st.text("abcdefgh", min_size=1, max_size=4)


def _state(hosts: list[str], jobs: list[str]) -> tuple[ClusterState, PublishedPlan]:
    s = ClusterState(60.0, 0.05, 10.0)
    for i, h in enumerate(hosts):
        s.agents[h] = AgentRecord(HostInventory(h, nics=(Nic("mlx5_0", f"10.0.0.{i}", 1),)),
                                  {j: LocalJob(j, 8) for j in jobs}, {})
    for j in jobs:
        s.jobs[j] = JobRecord(j, 1.0)
    plan = PublishedPlan(3, 1000, 4, tuple(
        JobAssignment(j, JobState.SCHEDULED, intensity=float("inf"), hosts=tuple(hosts),
                      routes=tuple(PeerRoute(a, b, ("10.0.0.1",), sport=49152 + k)
                                   for k, (a, b) in enumerate(itertools.pairwise(hosts))))
        for j in jobs))
    return s, plan


@settings(max_examples=50, deadline=None)
@given(st.lists(names, min_size=1, max_size=5, unique=True),
       st.lists(names, max_size=4, unique=True), st.integers(0, 3))
def test_the_memo_gives_the_same_text_as_converting_afresh(
        hosts: list[str], jobs: list[str], rounds: int) -> None:
    state, plan = _state(hosts, jobs)
    memo = Memo()
    for r in range(rounds + 1):
        if r == 2:  # a record replaced between rounds is encoded again
            h = hosts[0]
            state.agents[h] = dataclasses.replace(
                state.agents[h], inventory=HostInventory(h, nics=(Nic("mlx5_1", "10.9.9.9", 1),)))
        want = _dumps(store.snapshot(state, plan))
        assert store.snapshot_json(state, plan, memo) == want
        assert store.snapshot_json(state, None, memo) == _dumps(store.snapshot(state, None))


def test_the_stepwise_snapshot_is_the_same_text() -> None:
    state, plan = _state(["h0", "h1", "h2", "h3"], ["a", "b", "c"])
    memo = Memo()
    got = asyncio.run(store.snapshot_json_stepwise(state, plan, memo, step=2))
    assert got == _dumps(store.snapshot(state, plan))
    assert asyncio.run(store.snapshot_json_stepwise(state, None, memo, step=1)) == _dumps(
        store.snapshot(state, None))


def test_an_unchanged_record_is_encoded_once() -> None:
    state, plan = _state(["h0", "h1", "h2"], ["a", "b"])
    memo = Memo()
    store.snapshot_json(state, plan, memo)
    first, hits = memo.misses, memo.hits  # hits: a default record shared by several
    assert first > 0
    store.snapshot_json(state, plan, memo)
    assert memo.misses == first  # nothing encoded again
    assert memo.hits > hits
    memo.turn()
    memo.turn()  # two rounds without meeting them: the records are let go
    store.snapshot_json(state, plan, memo)
    assert memo.misses == 2 * first


def _dumps(doc: object) -> str:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False)


def _reachable(cls: type) -> set[type]:
    seen: set[type] = set()
    todo = [cls]
    while todo:
        c = todo.pop()
        if c in seen or not dataclasses.is_dataclass(c):
            continue
        seen.add(c)
        hints = typing.get_type_hints(c)
        for f in dataclasses.fields(c):
            if f.repr:  # repr=False fields are caches, never persisted
                todo.extend(a for a in _args(hints[f.name]) if isinstance(a, type))
    return seen


def _args(hint: object) -> list[object]:
    out, todo = [], [hint]
    while todo:
        h = todo.pop()
        out.append(typing.get_origin(h) or h)
        todo.extend(typing.get_args(h))
    return out


def test_the_persisted_frozen_records_hold_nothing_that_changes_in_place() -> None:
    """The memo keeps a frozen record's conversion for as long as the record lives: that is
    only right where the record cannot change, so none of them may hold a dict, list or
    set (a mutable record, like AgentRecord, is converted every time)."""
    checked = 0
    for root in (AgentRecord, JobRecord, PublishedPlan):
        for c in _reachable(root):
            if not c.__dataclass_params__.frozen:  # type: ignore[attr-defined]
                continue
            checked += 1
            hints = typing.get_type_hints(c)
            for f in dataclasses.fields(c):
                if f.repr:
                    kinds = set(_args(hints[f.name]))
                    assert not kinds & {dict, list, set}, f"{c.__name__}.{f.name}"
    assert checked >= 8


def test_the_memo_keeps_the_codec_rules() -> None:
    """A memoised encoding is the plain one: infinity as "inf", enums by value."""
    _, plan = _state(["h0", "h1"], ["a"])
    memo = Memo()
    text = to_json(plan, memo)
    assert text == _dumps(to_dict(plan))
    doc = json.loads(text)
    assert doc["jobs"][0]["intensity"] == "inf"
    assert doc["jobs"][0]["state"] == JobState.SCHEDULED.value
    assert doc["jobs"][0]["routes"][0]["sport"] == 49152
    misses = memo.misses
    memo.turn()
    assert to_json(plan, memo) == text
    assert memo.misses == misses  # the plan itself was kept: nothing encoded again


@settings(max_examples=200, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=6)
    | st.floats(allow_nan=True, allow_infinity=True),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4) | st.integers(0, 9), inner, max_size=4),
    max_leaves=20))
def test_to_json_writes_what_json_dumps_writes_of_to_dict(value: object) -> None:
    """Any nesting of the scalars and containers the records hold, NaN and infinities
    included (to_dict writes them as strings)."""
    assert to_json(value) == _dumps(to_dict(value))
    assert to_json(value, Memo()) == _dumps(to_dict(value))
