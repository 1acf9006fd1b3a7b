"""Fuzzing the state files cruxd reads at start (issue 17): the leader's state and the agent's
snapshot and journal. A damaged file is set aside or ignored, with an error logged, and the
daemon starts; it never stops the daemon or loads half of itself. See tests/fuzzing.py.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cruxd.agent.job_store import STATE_FORMAT, JobStore
from cruxd.control.cluster import ClusterState
from cruxd.control.validate import check_local_job
from cruxd.leader import store
from tests.fuzzing import MAX_PEAK, bounded, budget, json_values, variant


def leader_doc(draw: st.DrawFn) -> Any:
    keys = {"format": st.just(store.FORMAT), "agents": json_values, "jobs": json_values,
            "plan": json_values}
    return {k: draw(v) for k, v in keys.items() if draw(st.integers(0, 9))}


@st.composite
def leader_state(draw: st.DrawFn) -> bytes:
    doc = json.dumps(leader_doc(draw)).encode()
    return variant(draw, doc, 256)


def state() -> ClusterState:
    return ClusterState(agent_timeout_s=30.0, change_threshold=0.1, profiling_s=60.0)


@budget(300)
@given(leader_state())
def test_leader_state_file(tmp_path_factory: pytest.TempPathFactory, raw: bytes) -> None:
    path = tmp_path_factory.mktemp("leader") / "leader-state.json"
    path.write_bytes(raw)
    s = state()
    with bounded(MAX_PEAK):
        plan = store.load(path, s, 0.0)
    # Loaded or set aside, never half of each; what loaded can be saved again.
    assert path.exists() != path.with_suffix(".json.corrupt").exists()
    if path.exists():
        json.dumps(store.snapshot(s, plan))


AGENT_ERRORS = (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError, IndexError)

@st.composite
def agent_state(draw: st.DrawFn) -> bytes:
    entry = {"job": draw(st.one_of(json_values, st.just({"job_id": "j", "gpus": 1}))),
             "hints": draw(st.one_of(json_values, st.just({}))),
             "uid": draw(st.one_of(json_values, st.integers(0, 2**32))),
             "owners": draw(st.one_of(json_values, st.lists(st.tuples(
                 st.integers(), st.none() | st.integers()), max_size=3)))}
    doc = json.dumps({"format": STATE_FORMAT, "jobs": [entry]}).encode()
    return variant(draw, doc, 256)


@st.composite
def journals(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(st.one_of(
        st.text(max_size=8).map(lambda j: {"drop": j}),
        agent_state().map(lambda raw: {"set": _first_entry(raw)}),
        json_values), max_size=4))
    return variant(draw, b"".join(json.dumps(x).encode() + b"\n" for x in lines), 256)


def _first_entry(raw: bytes) -> Any:
    try:
        return json.loads(raw)["jobs"][0]
    except (ValueError, KeyError, TypeError, IndexError):
        return None


@budget(300)
@given(agent_state(), st.none() | journals())
def test_agent_state_file(tmp_path_factory: pytest.TempPathFactory, raw: bytes,
                          journal: bytes | None) -> None:
    path = tmp_path_factory.mktemp("agent") / "agent-state.json"
    path.write_bytes(raw)
    if journal is not None:
        path.with_name(path.name + ".journal").write_bytes(journal)
    try:
        with bounded():
            saved = JobStore(path).load()
    except AGENT_ERRORS:
        return  # the agent logs it and starts with no jobs
    for s in saved:  # restored jobs are typed records that pass a Report's checks
        assert type(s.uid) is int and all(
            type(p) is int and (t is None or type(t) is int) for p, t in s.owners)
        check_local_job(s.job)


DEEP = b"[" * 100_000  # json's C decoder recurses per level: RecursionError, not ValueError


def test_leader_state_deep_nesting(tmp_path: Path) -> None:
    path = tmp_path / "leader-state.json"
    path.write_bytes(DEEP)
    assert store.load(path, state(), 0.0) is None


def test_agent_state_deep_nesting(tmp_path: Path) -> None:
    path = tmp_path / "agent-state.json"
    path.write_bytes(DEEP)
    js = JobStore(path)
    assert js.load() == [] and "RecursionError" in js.snapshot_error


def test_agent_state_infinite_pid(tmp_path: Path) -> None:
    path = tmp_path / "agent-state.json"
    path.write_text(json.dumps({"format": STATE_FORMAT, "jobs": [
        {"job": {"job_id": "j", "gpus": 1}, "hints": {}, "uid": 0, "owners": [[1e400, None]]}]}))
    js = JobStore(path)
    assert js.load() == [] and js.skipped == 1


def _entry(job_id: str) -> dict[str, Any]:
    return {"job": {"job_id": job_id, "gpus": 8}, "hints": {}, "uid": 0, "owners": [[1, None]]}


def test_a_damaged_journal_entry_costs_that_entry_only(tmp_path: Path) -> None:
    """issue 37, item 9: a job id the leader refuses, adopted from the journal unchecked,
    had the leader refuse every Report of the host; a damaged snapshot threw away what the
    journal held; a 200 MB one-line journal cost 497 MB of RSS."""
    path = tmp_path / "agent-state.json"
    path.write_text(json.dumps({"format": STATE_FORMAT, "jobs": [_entry("a"), _entry("[/b]")]}))
    journal = path.with_name(path.name + ".journal")
    lines = [{"set": _entry("c")}, {"set": _entry("bad id with spaces")}, {"drop": "../x"},
             {"set": _entry("d")}]
    journal.write_text("".join(json.dumps(x) + "\n" for x in lines))
    js = JobStore(path)
    assert sorted(s.job.job_id for s in js.load()) == ["a", "c", "d"]
    assert js.skipped == 3 and not js.snapshot_error
    # the snapshot damaged: the journal's jobs are still restored
    path.write_text('{"format": "crux-agent-state/1", "jobs": [')
    assert sorted(s.job.job_id for s in js.load()) == ["c", "d"] and js.snapshot_error
    # a huge line is skipped without being read into memory whole, and what follows loads
    with open(journal, "w") as f:
        f.write('{"set": ' + " " * (20 << 20) + "\n" + json.dumps({"set": _entry("e")}) + "\n")
    tracemalloc.start()
    try:
        assert [s.job.job_id for s in js.load()] == ["e"] and js.skipped == 1
        assert tracemalloc.get_traced_memory()[1] < 4 << 20  # the peak: far below 20 MB
    finally:
        tracemalloc.stop()
