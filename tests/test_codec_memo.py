"""codec.Memo: the leader's saves convert a frozen record once, and get the same document."""

from __future__ import annotations

import dataclasses
import itertools
import json
import typing

from hypothesis import given, settings
from hypothesis import strategies as st

from cruxd.control.cluster import AgentRecord, ClusterState, JobRecord
from cruxd.control.codec import Memo, to_dict
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
def test_the_memo_gives_the_same_document_as_converting_afresh(
        hosts: list[str], jobs: list[str], rounds: int) -> None:
    state, plan = _state(hosts, jobs)
    memo = Memo()
    want = json.dumps(store.snapshot(state, plan), sort_keys=True)
    for r in range(rounds + 1):
        if r == 2:  # a record replaced between rounds is converted again
            h = hosts[0]
            state.agents[h] = dataclasses.replace(
                state.agents[h], inventory=HostInventory(h, nics=(Nic("mlx5_1", "10.9.9.9", 1),)))
            want = json.dumps(store.snapshot(state, plan), sort_keys=True)
        assert json.dumps(store.snapshot(state, plan, memo), sort_keys=True) == want


def test_an_unchanged_record_is_converted_once() -> None:
    state, plan = _state(["h0", "h1", "h2"], ["a", "b"])
    memo = Memo()
    store.snapshot(state, plan, memo)
    first, hits = memo.misses, memo.hits  # hits: a default record shared by several
    assert first > 0
    store.snapshot(state, plan, memo)
    assert memo.misses == first  # nothing converted again
    assert memo.hits > hits
    memo.turn()
    memo.turn()  # two rounds without meeting them: the records are let go
    store.snapshot(state, plan, memo)
    assert memo.misses == 2 * first


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
    """A memoised conversion is the plain one: infinity as "inf", enums by value."""
    _, plan = _state(["h0", "h1"], ["a"])
    memo = Memo()
    doc = to_dict(plan, memo)
    assert doc == to_dict(plan)
    assert doc["jobs"][0]["intensity"] == "inf"
    assert doc["jobs"][0]["state"] == JobState.SCHEDULED.value
    assert doc["jobs"][0]["routes"][0]["sport"] == 49152
    assert to_dict(plan, memo)["jobs"][0] is doc["jobs"][0]  # the same dict, not converted again
