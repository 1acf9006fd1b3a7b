"""A leader candidate's life under `[leader] ha = "etcd"`: standby until it wins the
election, active until it loses it, then standby again (docs/control-plane.md).

While standby it serves Status read-only and refuses Report and WatchPlan, naming the
active leader, and keeps a decoded copy of the state it would resume (cruxd.leader.standby).
Once elected it resumes that copy, or loads the state from etcd where the copy is not what
etcd holds (the same generation the last leader published either way), plans, and records
every generation in etcd before publishing it, under its term; the state itself is saved
there after. If etcd cannot be written (quorum lost), plans are not published and Status
says why; agents keep their last plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from cruxd.control.codec_json import Memo, to_json
from cruxd.leader.election import Election, Holder, Lost, encode_state
from cruxd.leader.standby import Standby

if TYPE_CHECKING:
    from cruxd.control.host_plans import PublishedPlan
    from cruxd.leader.service import Leader

LOG = logging.getLogger(__name__)
POLL_S = 0.5  # standbys try the campaign this often; failover = lease TTL + this at most


class Candidate:
    def __init__(self, leader: Leader, host: str) -> None:
        self.leader = leader
        self.election = Election(leader.config.leader, leader.address, host,
                                 dscp=leader.config.control.dscp)
        self._deposed = asyncio.Event()
        self._memo = Memo()
        self._task: asyncio.Task[None] | None = None
        # a decoded copy of the state to resume, kept while standby (cruxd.leader.standby)
        self.standby = Standby(self.election, leader._fresh_state, leader.clock)
        self._term_seen = 0  # the newest term the campaign has seen held
        leader.role = "standby"
        leader.fence = self._fence
        leader.saver = self._save
        self.election.on_error = self._etcd_error

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="election")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.standby.close()
        if self.leader.role == "active":
            await self.leader.deactivate()
        await self.election.resign()  # the next candidate need not wait out the lease
        await self.election.client.close()

    async def _run(self) -> None:
        while True:
            try:
                await self._term()
            except asyncio.CancelledError:
                raise
            except Exception:  # never leave the process without a campaign
                LOG.exception("election failed; campaigning again")
                if self.leader.role == "active":
                    await self.leader.deactivate()
                with contextlib.suppress(Exception):
                    await self.election.resign()
                await asyncio.sleep(POLL_S)

    async def _term(self) -> None:
        """One campaign, and the term it wins, until it ends."""
        leader, el = self.leader, self.election
        self.standby.start()
        # agents that lost their leader and wait on this standby: it tries for the key
        # first (cruxd.leader.campaign), so they need not be sent on to another
        term = await el.win(POLL_S, self._seen, lambda: leader.refusals_holding > 0)
        won = time.monotonic()
        LOG.info("won the election, term %d; reading the state from etcd", term)
        # the lease is kept from here on: reading and rebuilding the state of 10,000 hosts
        # takes longer than a lease (the successor lost it before it served one plan)
        hold = asyncio.create_task(el.hold())
        await self.standby.stop()
        try:
            copy = await self.standby.take()
            high_water, doc = (copy.high_water, None) if copy else await el.load()
        except Exception as exc:  # cannot read what to resume: try the campaign again
            LOG.error("elected (term %d) but cannot read the state from etcd: %s", term, exc)
            hold.cancel()
            await asyncio.gather(hold, return_exceptions=True)
            await el.resign()
            await asyncio.sleep(POLL_S)
            return
        self._deposed.clear()
        read = time.monotonic()
        source = f"etcd {el.state_key.decode()}"
        if copy is not None and copy.error:  # as activate() logs a document it cannot use
            LOG.error("leader state in %s unusable (%s); starting empty", source, copy.error)
        how = "decoded at takeover" if copy is None else "from the standby's copy"
        leader.takeovers["decoded" if copy is None else "copy"] += 1
        leader.activate(term, high_water, doc, source,
                        (copy.state, copy.plan) if copy is not None else None)
        del copy  # the term's own now
        LOG.info("elected leader, term %d, resuming generation %d (state read in %.1f s, "
                 "rebuilt in %.1f s, %s)", term, leader.plan.generation if leader.plan else
                 high_water, read - won, time.monotonic() - read, how)
        deposed = asyncio.create_task(self._deposed.wait())
        try:
            await asyncio.wait([hold, deposed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (hold, deposed):
                t.cancel()
        why = hold.result() if hold.done() and not hold.cancelled() else \
            "another leader was elected"
        LOG.warning("stepping down (term %d): %s", term, why)
        await leader.deactivate()
        await el.resign()

    def _etcd_error(self, error: str) -> None:
        """While active: etcd unreachable (or without quorum) means no plan can be
        recorded, so none is published; Status says so before the next plan tries."""
        if self.leader.role == "active":
            self.leader.not_publishing = error

    def _seen(self, holder: Holder | None) -> None:
        """While standby: who is active, for Status and for the refusals' redirect."""
        if holder is not None and holder.term > self._term_seen:
            if self._term_seen and holder.address != self.leader.address:
                # another candidate's new term: what its predecessor saved is history (the
                # first term seen is only who was active when this standby started)
                self.standby.leader_changed()
            self._term_seen = holder.term
        self.leader.seen_leader(holder.address if holder else "")

    async def _fence(self, plan: PublishedPlan) -> str | None:
        """Record the generation with its plan (so a successor resumes exactly it)."""
        data = await asyncio.to_thread(lambda: encode_state(self._plan_json(plan)))  # off the loop
        try:
            return await self.election.commit(generation=str(plan.generation).encode(),
                                              plan=data)
        except Lost as exc:
            self._deposed.set()
            return str(exc)

    def _plan_json(self, plan: PublishedPlan) -> str:
        """The plan's document; the routes a re-plan kept are not encoded again (one
        plan at a time, so one memo round per plan)."""
        self._memo.turn()
        return to_json(plan, self._memo)

    async def _save(self, view: str) -> None:
        """The cluster view (its JSON, without the plan), after changes; the plan went
        with its generation."""
        data = await asyncio.to_thread(encode_state, view)
        try:
            why = await self.election.commit(state=data)
        except Lost:
            self._deposed.set()
            return
        if why is not None:
            LOG.error("leader state not saved to etcd (%d bytes compressed): %s", len(data), why)
