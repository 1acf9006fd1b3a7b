"""The leader's state file: the cluster view and the current plan, so a restarted
leader resumes the same plan (same generation) instead of starting over.

Written by temp file + fsync + rename, so a crash leaves the old file or the new
one, never half of one. A file that does not decode is moved aside (kept for
people to inspect) and the leader starts empty; it never half-loads.

The file is input like any other (a full disk, an editor, an attacker with the
state dir): its size is bounded before it is read, its nesting before it is
parsed, and every integer must fit the uint64 the wire carries it in, so a bad
file is refused at start rather than failing every later RPC.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from cruxd.config.statefile import read_small, write_atomic
from cruxd.control.cluster import AgentRecord, ClusterState, JobRecord
from cruxd.control.codec import from_dict, persisted_fields, to_dict
from cruxd.control.codec_json import Memo, to_json
from cruxd.control.host_plans import PublishedPlan
from cruxd.errors import UsageError
from cruxd.leader.gc_pause import gc_paused
from cruxd.rpc import convert

LOG = logging.getLogger(__name__)
T = TypeVar("T")
FORMAT = "crux-leader-state/1"
MAX_BYTES = 256 << 20  # far above a large cluster's view; bounds what a bad file costs
MAX_DEPTH = 64  # the records nest about 8 deep
MAX_GENERATION = 1 << 63  # uint64 on the wire, with room to count on for ever
__all__ = ["load", "snapshot", "write_atomic"]


def high_water_file(state_file: Path) -> Path:
    """Beside the state file: the highest plan generation ever published. A few bytes,
    written before each plan goes out, so the (large) state can be saved after it."""
    return state_file.with_name(state_file.name + ".generation")


def load_high_water(state_file: Path) -> int:
    """The highest generation published so far; 0 when unknown or unreadable."""
    path = high_water_file(state_file)
    try:
        raw, _ = read_small(path, 64, follow=False)
    except OSError:
        return 0
    try:
        gen = json.loads(raw)["generation"]
    except (ValueError, KeyError, TypeError):
        LOG.warning("%s is not a generation record; ignored", path)
        return 0
    return gen if type(gen) is int and 0 <= gen < MAX_GENERATION else 0


def save_high_water(state_file: Path, generation: int) -> None:
    write_atomic(high_water_file(state_file), {"generation": generation})


def snapshot(state: ClusterState, plan: PublishedPlan | None) -> dict[str, Any]:
    """The state as a document (snapshot_json writes the same as text)."""
    return {
        "format": FORMAT,
        "agents": {h: to_dict(r) for h, r in state.agents.items()},
        "jobs": {j: to_dict(r) for j, r in state.jobs.items()},
        "plan": to_dict(plan) if plan is not None else None,
    }


def snapshot_json(state: ClusterState, plan: PublishedPlan | None,
                  memo: Memo | None = None) -> str:
    """snapshot() as compact JSON text. `memo`: the caller's codec_json.Memo, one round per
    snapshot, so records unchanged since the last snapshot are not encoded again."""
    return "".join(p for p in _snapshot_parts(state, plan, memo, 0) if p is not None)


async def snapshot_json_stepwise(state: ClusterState, plan: PublishedPlan | None,
                                 memo: Memo | None = None, step: int = 100,
                                 pause: Callable[[], Awaitable[None]] | None = None) -> str:
    """snapshot_json(), yielding to the event loop every `step` records (and awaiting
    `pause` there, if given: the leader's plans go first): at 1,000 agents the whole view
    took the loop for 0.5 s, and a job's arrival waited behind it. Each record is encoded
    in one piece; a report arriving meanwhile lands in this snapshot or in the next, like
    one arriving just after it."""
    parts = []
    for part in _snapshot_parts(state, plan, memo, step):
        if part is None:
            await (pause() if pause is not None else asyncio.sleep(0))
        else:
            parts.append(part)
    return "".join(parts)


def _snapshot_parts(state: ClusterState, plan: PublishedPlan | None, memo: Memo | None,
                    step: int) -> Iterator[str | None]:
    """The snapshot's text in pieces; None every `step` records (0: never), where the
    caller may let the event loop run."""
    if memo is not None:
        memo.turn()
    yield '{"format":' + json.dumps(FORMAT)
    for name, records in (("agents", state.agents), ("jobs", state.jobs)):
        yield f',"{name}":{{'
        for i, (key, rec) in enumerate(list(records.items())):
            yield ("," if i else "") + json.dumps(key) + ":" + to_json(rec, memo)
            if step and i % step == step - 1:
                yield None
        yield "}"
    if plan is None:
        yield ',"plan":null}'
        return
    # the plan's jobs in steps too: 1,640 jobs of 81,000 routes at 10,000 hosts
    for k, name in enumerate(persisted_fields(PublishedPlan)):
        yield ("," if k else ',"plan":{') + json.dumps(name) + ":"
        if name != "jobs":
            yield to_json(getattr(plan, name), memo)
            continue
        yield "["
        for i, a in enumerate(plan.jobs):
            yield ("," if i else "") + to_json(a, memo)
            if step and i % step == step - 1:
                yield None
        yield "]"
    yield "}}"


def load(path: Path, state: ClusterState, now: float) -> PublishedPlan | None:
    """Fill `state` from the file (from_document); a damaged file is set aside."""
    try:
        text = _read_bounded(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        _set_aside(path, str(exc))
        return None
    try:
        with gc_paused():
            doc = json.loads(text)
            return from_document(doc, state, now)
    except (ValueError, RecursionError) as exc:
        _set_aside(path, str(exc) or type(exc).__name__)
        return None


class Stopped(Exception):
    """from_document's `stop` said to give up (not a ValueError: the document may be
    fine)."""


def from_document(doc: Any, state: ClusterState, now: float,
                  stop: Callable[[], bool] | None = None) -> PublishedPlan | None:
    """Fill `state` from a parsed snapshot; ValueError (naming the field) for a document
    that is not one, with `state` untouched. Agents count as just heard from (they get a
    full agent timeout to report again before their jobs expire). `stop`, asked every
    few hundred records, raises Stopped once true: a hot standby decodes in a thread,
    which cannot be cancelled (cruxd.leader.standby), and at 10,000 hosts for 10 s."""
    with gc_paused():
        return _from_document(doc, state, now, stop)


def _from_document(doc: Any, state: ClusterState, now: float,
                   stop: Callable[[], bool] | None) -> PublishedPlan | None:
    try:
        _check_tree(doc, stop)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file")
        agents = {h: from_dict(AgentRecord, r, f"$.agents.{h}")
                  for h, r in _stoppable(doc["agents"].items(), stop)}
        jobs = {j: from_dict(JobRecord, r, f"$.jobs.{j}")
                for j, r in _stoppable(doc["jobs"].items(), stop)}
        plan = from_dict(PublishedPlan, doc["plan"], "$.plan") if doc["plan"] else None
        for h, rec in agents.items():  # uint64 in Status
            if not 0 <= rec.applied_generation < 1 << 64:
                raise ValueError(f"$.agents.{h}.applied_generation: out of range")
        if plan is not None and not 0 <= plan.generation < MAX_GENERATION:
            raise ValueError(f"$.plan.generation: {plan.generation} leaves no room for the "
                             "next plan's")
        if plan is not None:
            _check_encodes(plan, stop)
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise ValueError(str(exc) or type(exc).__name__) from None
    for rec in agents.values():
        rec.last_report = now
    state.agents, state.jobs = agents, jobs
    return plan


def _check_encodes(plan: PublishedPlan, stop: Callable[[], bool] | None) -> None:
    """Raises unless every host's WatchPlan message encodes: each decision whole (a host's
    has a subset of its routes), and each host's envelope. Encoding each host's message
    instead took 0.41 s at 10,000 hosts, on a takeover's path; this takes 0.14 s."""
    for a in _stoppable(plan.jobs, stop):
        convert.assignment_to_pb(a)
    for host in _stoppable({h for a in plan.jobs for h in a.hosts} or {"-"}, stop):
        convert.host_plan_to_pb(plan.envelope(host))


def _read_bounded(path: Path) -> str:
    """The file's text; a directory, device or FIFO is a configuration error (nothing to
    set aside), a file over MAX_BYTES a damaged one."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path} is not a regular file", where="leader.state_file")
        if st.st_size > MAX_BYTES:
            raise ValueError(f"{st.st_size} bytes, over the {MAX_BYTES}-byte limit")
        # read what fstat saw (plus one byte to notice growth), not MAX_BYTES: read(n)
        # allocates n up front; the file is replaced by rename, never rewritten in place
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(min(st.st_size, MAX_BYTES) + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise ValueError(f"over the {MAX_BYTES}-byte limit")
    return data.decode()


def _stoppable(items: Iterable[T], stop: Callable[[], bool] | None) -> Iterator[T]:
    if stop is None:
        yield from items
        return
    for i, item in enumerate(items):
        if i % 256 == 0 and stop():
            raise Stopped
        yield item


def _check_tree(doc: Any, stop: Callable[[], bool] | None = None) -> None:
    """Depth (no value deeper than MAX_DEPTH) and integer range over the whole document,
    without recursion. Only containers go on the stack and scalars are tested by exact
    type (json.loads makes no subclasses; a bool is not an int here): walking every value
    as a stack entry was most of a 10,000-host takeover's rebuild (py-spy), 2.7x slower."""
    lo, hi = -(1 << 63), 1 << 64
    if type(doc) is not dict and type(doc) is not list:
        if type(doc) is int and not lo <= doc < hi:
            raise ValueError(f"integer {doc} out of the 64-bit range")
        return
    todo: list[tuple[Any, int]] = [(doc, 0)]
    n = 0
    while todo:
        n += 1
        if stop is not None and n % 4096 == 0 and stop():
            raise Stopped
        node, depth = todo.pop()
        if depth >= MAX_DEPTH and node:  # its values are deeper than MAX_DEPTH
            raise ValueError(f"nested over {MAX_DEPTH} levels")
        for v in node.values() if type(node) is dict else node:
            t = type(v)
            if t is dict or t is list:
                todo.append((v, depth + 1))
            elif t is int and not lo <= v < hi:
                raise ValueError(f"integer {v} out of the 64-bit range")


def _set_aside(path: Path, why: str) -> None:
    bad = path.with_suffix(path.suffix + ".corrupt")
    LOG.error("leader state %s unreadable (%s); moved to %s, starting empty", path, why, bad)
    try:
        os.replace(path, bad)
    except OSError as exc:
        LOG.error("cannot move %s aside: %s", path, exc.strerror)
