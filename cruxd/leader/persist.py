"""The leader's state on disk: the generation high-water mark before a plan goes out, and
the state saved after changes, off the path to the agents (a mixin of service.Leader)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable

from cruxd.config.model import Config
from cruxd.config.statefile import write_parts_atomic
from cruxd.control.cluster import ClusterState
from cruxd.control.codec_json import Memo
from cruxd.control.host_plans import PublishedPlan
from cruxd.leader import store
from cruxd.waits import wait_event

LOG = logging.getLogger("cruxd.leader.service")  # the service's log, as before the split
PERSIST_DELAY_S = 0.1
# A save holds the GIL for much of its time (1 s at 10,000 hosts): it waits until every
# plan stream has sent the newest plan, or this long at most (a stream that does not read)
FANOUT_WAIT_S = 5.0


class LeaderPersistence:
    config: Config
    state: ClusterState
    plan: PublishedPlan | None
    saver: Callable[[str], Awaitable[None]] | None  # HA: the view's JSON to etcd
    _high_water: int
    _unsaved: asyncio.Event
    _fanned: asyncio.Event
    _planning: bool
    _save_lock: threading.Lock
    _snapshots: int
    _saved_seq: int
    _memo: Memo

    def _mark_published(self, generation: int) -> str | None:
        """Record `generation` as published before any agent sees it: None, or why it
        could not be (then it must not go out: a restart would number other decisions
        with it, as it did after a full disk, issue 37)."""
        try:
            store.save_high_water(self.config.leader.state_file, generation)
        except OSError as exc:
            return (f"cannot record plan generation {generation} in "
                    f"{store.high_water_file(self.config.leader.state_file)}: "
                    f"{exc.strerror or exc}")
        self._high_water = max(self._high_water, generation)
        return None

    async def _persister(self) -> None:
        """Saves the state after changes (set `_unsaved`: view changes and every
        published plan), batched, and never more than a third of the time (the next
        save waits twice as long as the last took). The snapshot yields to the loop as
        it goes, and waits while a plan is being made and until it has gone out on every
        plan stream: plans, and getting them to the agents, come first."""
        ready_at = 0.0
        while True:
            await self._unsaved.wait()
            await asyncio.sleep(max(PERSIST_DELAY_S, ready_at - time.monotonic()))
            await self._plans_first()
            self._unsaved.clear()
            started = time.monotonic()
            self._snapshots += 1
            # HA: the plan went to etcd with its generation (Candidate._fence)
            numbered = self._snapshots, await store.snapshot_json_stepwise(
                self.state, self.plan if self.saver is None else None, self._memo,
                pause=self._plans_first)
            if self.saver is not None:
                try:
                    await self.saver(numbered[1])
                except Exception:  # the next change saves again; never lose the task
                    LOG.exception("cannot save the leader state")
            else:
                await asyncio.to_thread(self._save, numbered)
            ready_at = time.monotonic() + 2 * (time.monotonic() - started)

    async def _plans_first(self) -> None:
        """Wait while a plan is being made, and until the newest has gone out on every plan
        stream (FANOUT_WAIT_S at most): a save shares the GIL with both."""
        await asyncio.sleep(0)
        while self._planning:
            await asyncio.sleep(PERSIST_DELAY_S)
        await wait_event(self._fanned, FANOUT_WAIT_S)

    def _snapshot(self, plan: PublishedPlan | None = None) -> tuple[int, str]:
        self._snapshots += 1
        return self._snapshots, store.snapshot_json(self.state, plan or self.plan, self._memo)

    def _save(self, numbered: tuple[int, str] | None = None) -> None:
        seq, doc = numbered or self._snapshot()
        # Plan and persister threads may overlap: one writer at a time, and never an
        # older snapshot over a newer one (that would bring back an older generation).
        with self._save_lock:
            if seq < self._saved_seq:
                return
            self._saved_seq = seq
            self._write(doc)

    def _write(self, text: str) -> None:
        try:
            write_parts_atomic(self.config.leader.state_file, (text,))
        except OSError as exc:
            LOG.error("cannot persist leader state to %s: %s", self.config.leader.state_file,
                      exc.strerror)
