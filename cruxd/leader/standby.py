"""A hot standby (docs/control-plane.md, HA): while a candidate is standby it keeps the
state it would resume already decoded, so that winning the election does not start with
reading and rebuilding it. At 10,000 hosts that took 1.7-2.4 s to read and 9.5-12 s to
rebuild, most of a failover that must finish within 10 s.

Every STANDBY_REFRESH_S the standby reads the mod revisions of the generation, plan and
state keys (one keys-only transaction: no value travels). When one has moved and has then
held for STANDBY_SETTLE_S, it reads the values and decodes them in a worker thread, one
decode at a time. At the win, one
more revision read says whether the copy is what etcd holds now; only then is it used,
else the state is decoded at takeover as without a standby copy.

The copy becomes the new term's state, which the term changes as agents report: the
standby keeps no reference to a copy it handed out, and a deposed leader starts over with
no copy.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cruxd.control.cluster import ClusterState
from cruxd.control.host_plans import PublishedPlan
from cruxd.leader import store
from cruxd.leader.election import Election, resumed, revisions_of
from cruxd.leader.etcd import ClientError

LOG = logging.getLogger(__name__)
# how often a standby asks whether its copy is current: the active leader's last save
# before it dies starts decoding within this, and a decode under way at the win, if it is
# of what etcd holds, is waited for rather than started over
STANDBY_REFRESH_S = 2.0
# ... and decodes a state only once it has held this long: a new leader saves its view
# again and again while 10,000 agents come back, and two standbys decoding each save (10 s
# of CPU each on a busy box) slowed the failover they are for from 18-21 s to 24-27 s
STANDBY_SETTLE_S = 6.0


@dataclass
class Copy:
    revisions: tuple[int, ...]  # Election.revisions() of what was decoded
    high_water: int
    state: ClusterState
    plan: PublishedPlan | None
    error: str = ""  # the document was unusable: resumed empty, as a takeover's decode does


class _Decode:
    """One decode in a worker thread. A thread cannot be cancelled: a dropped decode stops
    at its next step and keeps nothing, so a term never runs beside a stale copy's
    memory."""

    def __init__(self, revisions: tuple[int, ...]) -> None:
        self.revisions = revisions
        self._lock = threading.Lock()
        self._dropped = False
        self.moved = False  # dropped because another candidate won: may be decoded again
        self._copy: Copy | None = None

    def run(self, kvs: tuple[Any, Any, Any], fresh: Callable[[], ClusterState],
            now: float) -> None:
        """In the thread. Never raises: the future running it is not always awaited."""
        try:
            high_water, doc = resumed(*kvs)  # unreadable values: logged, not resumed
            if self._dropped:
                return
            state, plan, error = fresh(), None, ""
            if doc is not None:
                try:
                    plan = store.from_document(doc, state, now, lambda: self._dropped)
                except ValueError as exc:  # `state` untouched: empty
                    error = str(exc)
                    LOG.error("leader state in etcd unusable (%s); a takeover starts empty",
                              exc)
            with self._lock:
                if not self._dropped:
                    self._copy = Copy(self.revisions, high_water, state, plan, error)
        except store.Stopped:
            pass
        except Exception:
            LOG.exception("standby: decoding the state from etcd failed")

    def take(self) -> Copy | None:
        with self._lock:
            copy, self._copy, self._dropped = self._copy, None, True
        return copy


class Standby:
    def __init__(self, election: Election, fresh: Callable[[], ClusterState],
                 clock: Callable[[], float]) -> None:
        self._election = election
        self._fresh, self._clock = fresh, clock
        self._copy: Copy | None = None
        # the revisions last decoded in this standby period, with or without a copy to
        # show for it: a value that fails to decode is not decoded again every round
        self._decoded: tuple[int, ...] | None = None
        self._decode: _Decode | None = None  # the latest decode started, until taken
        self._thread: asyncio.Future[None] | None = None  # its thread's future
        self._task: asyncio.Task[None] | None = None
        self._seen: tuple[tuple[int, ...], float] | None = None  # revisions, since when

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._refresh(), name="standby copy")

    async def stop(self) -> None:
        """Stop refreshing the copy. A decode under way runs on in its thread: take() may
        still want it."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def close(self) -> None:
        await self.stop()
        self._copy, self._decoded = None, None
        if self._decode is not None:
            self._decode.take()
            self._decode = None

    def leader_changed(self) -> None:
        """Another candidate won: a decode under way is of the state its predecessor saved,
        which the winner replaces; it stops at its next step. Decoding on took a core
        from the failover it is for (about 5 s of CPU at 10,000 hosts)."""
        if self._decode is not None and self._thread is not None and not self._thread.done():
            self._decode.moved = True
            self._decode.take()
        self._seen = None  # the settle starts over with the winner's saves

    async def take(self) -> Copy | None:
        """After stop(), at the win: the copy, if it is what etcd holds now, else None (the
        winner decodes it). Either way the standby keeps none. Raises ClientError when
        etcd cannot be read (keeping its copy)."""
        now = await self._election.revisions()
        copy, self._copy, self._decoded = self._copy, None, None
        decode, self._decode = self._decode, None
        if decode is not None:
            if decode.revisions == now and copy is None and self._thread is not None:
                # the last save came just before the win (the old leader's last words):
                # this decode started earlier than one now would, so it ends sooner
                await asyncio.shield(self._thread)
            copy = decode.take() or copy  # and a decode not wanted keeps nothing
        return copy if copy is not None and copy.revisions == now else None

    async def _refresh(self) -> None:
        while True:
            try:
                await self._once()
            except ClientError as exc:  # the campaign reports etcd's state; try again
                LOG.debug("standby: cannot read the state's revisions: %s", exc)
            except Exception:  # never end the standby's copy for good
                LOG.exception("standby: refreshing the copy of the state failed")
            await asyncio.sleep(STANDBY_REFRESH_S)

    async def _once(self) -> None:
        if self._thread is not None and not self._thread.done():
            # one decode at a time, even one an earlier standby period left running
            return
        now = await self._election.revisions()
        if now == self._decoded:
            return
        if self._seen is None or self._seen[0] != now:
            self._seen = now, time.monotonic()
        if time.monotonic() - self._seen[1] < STANDBY_SETTLE_S:
            return  # still changing (or just changed): decoded once it holds
        self._copy = None  # stale for good (revisions only grow): not held through the next
        if self._decode is not None:
            self._decode.take()  # one left by an earlier period, done by now
        kvs = await self._election.read()
        decode = self._decode = _Decode(revisions_of(kvs))
        started = time.monotonic()
        self._thread = asyncio.ensure_future(
            asyncio.to_thread(decode.run, kvs, self._fresh, self._clock()))
        await asyncio.shield(self._thread)  # cancelled (the win): take() may still use it
        self._copy, self._decode = decode.take(), None
        if not decode.moved:  # a decode dropped for a new leader is tried again if need be
            self._decoded = decode.revisions
        if self._copy is not None:
            LOG.debug("standby: state at revisions %s decoded in %.1f s (%d agents)",
                      self._copy.revisions, time.monotonic() - started,
                      len(self._copy.state.agents))
