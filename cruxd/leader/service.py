"""The leader's gRPC service and its planning loop (one asyncio event loop).

Reports only update the cluster state and wake the planner; the planner waits
`debounce_ms` for more events, plans in a worker thread (the loop keeps serving),
then publishes: every WatchPlan stream wakes on one asyncio.Event and sends its
host's part. No polling anywhere: the loop sleeps until an event or the next
deadline (an agent timeout, the end of a profiling window).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from cruxd.config.model import Config
from cruxd.control.cluster import AGENT_JOINED, ClusterState
from cruxd.control.codec_json import Memo
from cruxd.control.host_plans import (
    JobMemo,
    LeaderPlanConfig,
    PlanInputs,
    PublishedPlan,
    make_plan,
    plan_inputs,
)
from cruxd.control.plan_delta import carry_changes, changed_hosts
from cruxd.control.replan_stats import ReplanStats, cause_kind
from cruxd.leader import store
from cruxd.leader.auth import Gate
from cruxd.leader.fanout import FanOut
from cruxd.leader.hint_service import LeaderHints
from cruxd.leader.holds import ReplanHolds
from cruxd.leader.join_burst import JoinBurst
from cruxd.leader.persist import LeaderPersistence
from cruxd.leader.rpcs import LeaderRpcs
from cruxd.model.topology import Topology
from cruxd.scheduler.dscp import can_profile
from cruxd.scheduler.incremental import IncrementalPlanner
from cruxd.scheduler.planner import PlanConfig
from cruxd.waits import cancelled, wait_event

LOG = logging.getLogger(__name__)
SETTLE_MAX_S = 10.0  # how long a restored leader waits for the agents before re-planning
# after a plan that took T while more events came in (a backlog: agents joining at start-up),
# the next starts T * PLAN_SPACING later at the soonest: planning then holds the GIL a third
# of the time at most, and the loop keeps two thirds for the agents. A plan nothing came in
# behind is not spaced: the next event, on its own, would wait for nothing.
PLAN_SPACING = 2.0


class Leader(LeaderRpcs, LeaderPersistence):
    def __init__(self, config: Config, topology: Topology | None,
                 on_plan: Callable[[PublishedPlan], None] | None = None,
                 on_reject: Callable[[str, str], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        lc = config.leader
        self.config = config
        self.topology = topology
        self.clock = clock
        self.state = self._fresh_state()
        self.plan: PublishedPlan | None = None
        self.replans = ReplanStats()
        self.max_jobs = lc.max_jobs  # a restart-only key: a reload does not change it
        self.max_jobs_per_host = lc.max_jobs_per_host
        self.address = ""
        self._on_plan = on_plan or (lambda p: None)
        self._on_reject = on_reject or (lambda rpc, why: None)
        self.gate = Gate(config, self._on_reject)  # who may call: token or certificate
        self._wake = asyncio.Event()
        self._published = asyncio.Event()
        self._causes: list[str] = []
        self._holds = ReplanHolds()  # after a failure or a multi-host job's first report
        self._first_event: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._persist: asyncio.Task[None] | None = None
        self._unsaved = asyncio.Event()
        self._fanned = asyncio.Event()  # every open plan stream has sent the current plan
        self._save_lock = threading.Lock()
        self._snapshots = self._saved_seq = 0
        self._memo = Memo()  # records encoded at the last save (codec_json.Memo)
        self._high_water = 0  # the highest generation ever published (store.high_water_file)
        self.watchers = 0
        # HA (cruxd.leader.ha drives these): "single" (no HA), "active" or "standby"
        self.role = "single"
        self.term = 0  # HA: the etcd revision of this leader's election (HostPlan.term)
        self.active_leader = ""  # a standby's view of who is active (its address)
        self._moved = asyncio.Event()  # pulsed when that view or the role changes
        # failover figures (crux_leader_* metrics): plan streams opened whose view held
        # the agent's latest report (none owed) or not; refusals held for an election;
        # HA terms begun from the standby's copy or by decoding etcd's state
        self.streams_opened = {"current": 0, "stale": 0}
        self.refusals_held = self.refusals_holding = 0
        self.takeovers = {"copy": 0, "decoded": 0}
        self.not_publishing = ""  # why plans are not going out (etcd unreachable, ...)
        # HA: record the generation before publishing (None: recorded, else why not;
        # raises when deposed), and save the state (instead of the state file)
        self.fence: Callable[[PublishedPlan], Awaitable[str | None]] | None = None
        self._unheard: set[str] = set()  # HA, just elected: agents yet to report
        self._joins = JoinBurst()  # many hosts joining at once hold planning
        self._settle_until = 0.0
        self._retrying = False  # HA: plans are failing to be recorded (not_publishing)
        self._planning = False  # a plan is being made (the persister waits)
        self._plan_free_at = 0.0  # monotonic: the next plan starts no sooner (_spaced)
        self.saver: Callable[[str], Awaitable[None]] | None = None
        self._fanout: FanOut | None = None
        # what the last plan computed, reused where an event cannot change it; used from
        # the planning thread only, one plan at a time
        self._incremental = IncrementalPlanner()
        self._jobs = JobMemo()
        self.hints = LeaderHints(self)

    # --- lifecycle ---------------------------------------------------------
    def restore(self) -> None:
        sf = self.config.leader.state_file
        self._resume(store.load(sf, self.state, self.clock()), store.load_high_water(sf), sf)
        self._await_agents()

    def _await_agents(self) -> None:
        """After a restore: a re-plan waits (SETTLE_MAX_S at most) for the hosts whose
        view lacks a job the plan has on them: the view is saved after the plan, so a job,
        or a whole host, that came in between is in the plan only, and a re-plan on the
        view alone would drop it (it did, in a failover of tests/test_ha_etcd.py, once
        hosts whose view is current no longer report). Those hosts report on finding this
        leader, since its view lacks their latest report."""
        lacking: set[str] = set()
        for a in self.plan.jobs if self.plan is not None else ():
            for h in a.hosts:
                rec = self.state.agents.get(h)
                if rec is None or rec.expired or a.job_id not in rec.jobs:
                    lacking.add(h)
        self._unheard = lacking
        self._settle_until = self.clock() + min(self.config.leader.agent_timeout_s,
                                                SETTLE_MAX_S)

    def _resume(self, plan: PublishedPlan | None, high_water: int, source: object) -> None:
        self.plan, self._high_water = plan, high_water
        if self.plan is not None and self._high_water > self.plan.generation:
            # killed after publishing newer plans than the state holds: the restored plan
            # goes out under a fresh number, never one an agent saw with other content
            LOG.info("plans up to generation %d were published after the saved %d; serving "
                     "the saved plan as %d", self._high_water, self.plan.generation,
                     self._high_water + 1)
            # agents may hold any number up to the high water, with other decisions
            self.plan = replace(self.plan, generation=self._high_water + 1,
                                since=self._high_water + 1, changed_at={})
            if self.fence is None and (why := self._mark_published(self.plan.generation)):
                # served anyway: the saved plan's own decisions, which a later restart
                # would serve under this same number again
                LOG.error("%s", why)
            # the view was saved after that plan: it may hold jobs the plan lacks (a job that
            # arrived just before the kill), and agents that re-report them unchanged bring no
            # new cause: plan once on the restored view, as soon as the planner runs
            self._causes.append("restart: the saved plan is older than the view")
        elif self.plan is not None and self._jobs_unplanned():
            # saved after a report but before the plan it caused (a kill within the
            # debounce): agents re-report those jobs unchanged, which brings no new cause
            self._causes.append("restart: the view holds jobs the saved plan lacks")
        if self.plan is not None:
            LOG.info("resumed plan generation %d (%d jobs, %d agents) from %s",
                     self.plan.generation, len(self.plan.jobs), len(self.state.agents), source)

    def _jobs_unplanned(self) -> bool:
        """Whether the restored view and plan disagree on which jobs there are."""
        assert self.plan is not None
        viewed = {j for rec in self.state.agents.values() if not rec.expired for j in rec.jobs}
        return viewed != {a.job_id for a in self.plan.jobs}

    def activate(self, term: int, high_water: int, doc: object, source: str,
                 decoded: tuple[ClusterState, PublishedPlan | None] | None = None) -> None:
        """HA: this candidate won the election; resume the plan state it found: `doc`, as
        read from etcd, or `decoded`, a hot standby's copy of it (cruxd.leader.standby),
        which this leader owns from here on."""
        plan = self._adopt(doc, source, decoded)
        self._resume(plan, high_water, source)
        if self.plan is not None:  # the same plan, served under this leader's term
            self.plan = replace(self.plan, term=term)
        # the view in etcd may be older than the plan (it is saved after it)
        self._await_agents()
        self.term, self.role, self.active_leader = term, "active", self.address
        self._pulse_moved()  # refusals held for this election: this leader takes them
        self.not_publishing = ""
        self.start()

    def _adopt(self, doc: object, source: str,
               decoded: tuple[ClusterState, PublishedPlan | None] | None) -> PublishedPlan | None:
        """A fresh state filled from `decoded` or `doc`; the plan to resume."""
        self.state = self._fresh_state()
        if decoded is not None:
            # only the records: the limits are this leader's (a reload may have come since)
            self.state.agents, self.state.jobs = decoded[0].agents, decoded[0].jobs
            now = self.clock()
            for rec in self.state.agents.values():
                # heard from as of now, not as of the decode (maybe minutes ago): every
                # agent gets its full agent timeout to find this leader
                rec.last_report = now
            return decoded[1]
        if doc is None:
            return None
        try:
            return store.from_document(doc, self.state, self.clock())
        except ValueError as exc:
            LOG.error("leader state in %s unusable (%s); starting empty", source, exc)
            return None

    def seen_leader(self, address: str) -> None:
        """HA, while standby: the campaign heard who is active ("" nobody)."""
        if address != self.active_leader:
            self.active_leader = address
            self._pulse_moved()

    def _pulse_moved(self) -> None:
        self._moved.set()  # wakes the refusals waiting for the election (rpcs)
        self._moved = asyncio.Event()

    async def deactivate(self) -> None:
        """HA: this leader lost the election: stop planning, end the plan streams (agents
        go looking for the new leader) and forget the state (the next term reloads it)."""
        self.role, self.active_leader = "standby", ""  # not us; the campaign learns who
        self._pulse_moved()
        await self.hints.stop()
        await cancelled(self._task, "the planner")
        await cancelled(self._persist, "the state saver")
        self._published.set()
        self.plan, self.state, self.not_publishing = None, self._fresh_state(), ""
        self._causes, self._first_event, self._holds = [], None, ReplanHolds()

    def _fresh_state(self) -> ClusterState:
        lc = self.config.leader
        return ClusterState(lc.agent_timeout_s, lc.change_threshold, lc.profiling_s,
                            lc.change_hold_s)

    def start(self) -> None:
        self._wake, self._published, self._unsaved, self._fanned = (
            asyncio.Event(), asyncio.Event(), asyncio.Event(), asyncio.Event())
        self._fanned.set()  # no plan going out yet
        if self._causes:  # kept from the restore (_resume)
            self._wake.set()
        self._task = asyncio.create_task(self._planner(), name="planner")
        self._persist = asyncio.create_task(self._persister(), name="persist")
        self.hints.start()

    async def stop(self) -> None:
        await self.hints.stop()
        await cancelled(self._task, "the planner")
        self._published.set()  # release streams so the server can drain
        await cancelled(self._persist, "the state saver")
        if self.role == "single":
            self._save()  # flush: the newest view, even if no plan followed it

    def reload(self, config: Config) -> None:
        lc = config.leader
        self.config = config
        self.state.agent_timeout_s = lc.agent_timeout_s
        self.state.change_threshold = lc.change_threshold
        self.state.change_hold_s = lc.change_hold_s
        self.state.profiling_s = lc.profiling_s
        self._event("configuration reloaded")

    def plan_config(self) -> LeaderPlanConfig:
        """What planning runs with, from the current [leader] section."""
        lc = self.config.leader
        return LeaderPlanConfig(PlanConfig(levels=lc.levels, dscp=lc.dscp,
                                           tie_tolerance=lc.tie_tolerance), lc.star_nic_gbps,
                                lc.path_selection)

    # --- events --------------------------------------------------------------
    def _event(self, *causes: str) -> None:
        if not causes:
            return
        if self._first_event is None:
            self._first_event = time.monotonic()
        self._joins.joined(time.monotonic(), sum(cause_kind(c) == AGENT_JOINED for c in causes))
        self._causes.extend(causes)
        self._wake.set()

    def recheck_deadlines(self) -> None:
        """Something moved a deadline the planner sleeps towards (a plan stream ended)."""
        self._wake.set()

    async def _planner(self) -> None:
        while True:
            deadline = self.state.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - self.clock()) + 0.01
            await wait_event(self._wake, timeout)
            if self._wake.is_set() and self.config.leader.debounce_ms > 0:
                await asyncio.sleep(self.config.leader.debounce_ms / 1000)
            await self._spaced()  # before the causes are taken: what comes meanwhile joins
            self._wake.clear()
            now = self.clock()
            causes = [*self._causes, *self.state.expire(now),
                      *self.state.advance_profiling(now, can_profile(self.config.leader.levels))]
            self._causes = []
            if (causes and self._unheard and now < self._settle_until):
                LOG.debug("re-plan waits for %d agent(s) to report: %s", len(self._unheard),
                          ", ".join(sorted(self._unheard)[:5]))
                self._causes = causes  # kept for when the view is whole
                asyncio.get_running_loop().call_later(
                    min(0.2, self._settle_until - now), self._wake.set)
                continue
            self._unheard.clear()
            if causes and (hold := self._joins.holding(time.monotonic())):
                LOG.debug("re-plan waits %.2f s: hosts are joining in a burst", hold)
                self._held(causes, hold)
                continue
            if causes and (self._awaiting_job(causes, now)
                           or await self._awaiting_reprobe(causes, now)):
                continue
            if causes or (self.plan is None and self.state.agents):
                self._planning = True
                started = time.monotonic()
                try:
                    await self._replan(causes or ["first plan"])
                finally:
                    self._planning = False
                    took = time.monotonic() - started
                    if self._wake.is_set():  # events came in behind it
                        self._plan_free_at = time.monotonic() + PLAN_SPACING * took

    def _awaiting_job(self, causes: list[str], now: float) -> bool:
        """Hold a multi-host job's arrival or departure until all its hosts have reported
        it (control/job_hold.py): one re-plan per job event, not per host."""
        hold = None if self.plan is None else self._holds.job(
            self.state, causes, now, self.config.leader.job_settle_s)
        if hold is None:
            return False
        self._held(causes, hold.until - now)
        return True

    def _held(self, causes: list[str], left_s: float) -> None:
        """Keep `causes` for the re-plan a hold defers, and look again within `left_s`."""
        self._causes = [*causes, *self._causes]
        asyncio.get_running_loop().call_later(max(0.05, min(0.5, left_s)), self._wake.set)

    async def _spaced(self) -> None:
        """Wait out the gap the last plan left. Planning holds the GIL (a plan of 10,000
        hosts takes seconds), and plans back to back, as agents join at start-up, starved
        the loop that answers their Reports into a storm of DEADLINE_EXCEEDED: a plan
        that events came in behind is followed by twice its time for the loop."""
        wait = self._plan_free_at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)

    async def _awaiting_reprobe(self, causes: list[str], now: float) -> bool:
        """After a failure, hold the re-plan until the agents whose paths crossed the lost
        hops have probed again (control/failure_hold.py), so that one re-plan takes the
        whole failure in; meanwhile the reprobe requests go out alone, in a plan that
        changes no decision. Any other cause re-plans at once, as ever."""
        hold = None if self.plan is None else self._holds.failure(
            self.state, causes, now, self.config.leader.failure_settle_s)
        if hold is None or self.plan is None:
            return False
        self._held(causes, hold.until - now)
        if any(not set(peers) <= set(self.plan.reprobe.get(h, ()))
               for h, peers in hold.reprobe.items()):
            await self._replan(causes, reprobe=hold.reprobe)
        return True

    async def _replan(self, causes: list[str],
                      reprobe: dict[str, tuple[str, ...]] | None = None) -> None:
        """A new plan for `causes`; with `reprobe`, the current plan's decisions with these
        reprobe requests (see _awaiting_reprobe)."""
        first = self._first_event or time.monotonic()
        if reprobe is None:
            self._first_event = None
        cfg = self.plan_config()
        gen = max(self.plan.generation if self.plan else 0, self._high_water) + 1
        now = self.clock()
        try:
            if reprobe is not None and self.plan is not None:
                plan = carry_changes(self.plan, replace(
                    self.plan, generation=gen, planned_unix_ms=int(now * 1000),
                    causes=("reprobe after a failure", *causes), reprobe=reprobe, term=self.term))
            else:
                plan = await asyncio.to_thread(self._make_plan, plan_inputs(self.state, now),
                                               cfg, gen, now, tuple(causes))
        except Exception:
            LOG.exception("planning failed; agents keep plan %s",
                          self.plan.generation if self.plan else "none")
            return
        plan.latency_s = time.monotonic() - first
        if self.role == "active" and self.plan is not None and not changed_hosts(self.plan, plan):
            # HA: a plan that changes no decision is not worth a generation in etcd
            LOG.debug("plan after %s changes nothing; not published", "; ".join(causes[:3]))
            return
        # The number is recorded before any agent can see it (a WatchPlan opened meanwhile
        # sends self.plan): a leader killed right after publishing must not restart at the
        # previous generation and reuse this one for a different plan. A single leader
        # records only the number (the state, MBs at 1,000 agents, is saved after, off the
        # path to the agents); in HA the plan goes with it, in one fenced transaction, so
        # a successor resumes exactly this plan.
        why = await (self.fence(plan) if self.fence is not None
                     else asyncio.to_thread(self._mark_published, gen))
        if why is not None or self._retrying:
            if why is not None:
                log = LOG.debug if self._retrying else LOG.error  # once, not every retry
                self.not_publishing, self._retrying = why, True
                log("plan %d not published: %s; agents keep plan %s", gen, why,
                    self.plan.generation if self.plan else "none")
                self._causes = [*causes, *self._causes]  # retried: next event, or in 1 s
                asyncio.get_running_loop().call_later(1.0, self._wake.set)
                return
            LOG.info("publishing again (plan %d)", gen)
            self.not_publishing, self._retrying = "", False
        moved = self.replans.record(self.plan, plan)
        self.replans.forget(self.state.jobs)
        self.plan = plan
        old, self._published = self._published, asyncio.Event()
        self._fanned.clear()
        old.set()
        self.sent_one()  # with no stream open, the fan-out is done already
        self._unsaved.set()
        LOG.info("plan %d: %d job(s) in %.1f ms after %s%s", gen, len(plan.jobs),
                 plan.latency_s * 1000, "; ".join(causes[:3]) + (" ..." if len(causes) > 3
                                                                 else ""),
                 f"; decisions changed: {', '.join(moved[:8])}" if moved else "",
                 extra={"generation": gen})
        self._on_plan(plan)

    def _make_plan(self, inputs: PlanInputs, cfg: LeaderPlanConfig, gen: int, now: float,
                   causes: tuple[str, ...]) -> PublishedPlan:
        """In the planning thread: the plan, and which hosts it changes."""
        plan = make_plan(inputs, self.topology, cfg, gen, now, causes,
                         planner=self._incremental, jobs=self._jobs, previous=self.plan)
        return carry_changes(self.plan, replace(plan, term=self.term))

    def sent_one(self) -> None:
        """A plan stream sent the current plan, or closed: is the fan-out over?"""
        f = self._fanout
        if self.watchers == 0 or (f is not None and f.plan is self.plan
                                  and f.sent >= self.watchers):
            self._fanned.set()

    def fanout(self) -> FanOut | None:
        """The current plan's messages (serialised once each)."""
        if self.plan is None:
            return None
        if self._fanout is None or self._fanout.plan is not self.plan:
            self._fanout = FanOut(self.plan)
        return self._fanout


def load_topology(path: Path | None) -> Topology | None:
    if path is None:
        return None
    from cruxd.scenario.cursor import Cursor, load_document
    from cruxd.scenario.fabric_section import parse_topology

    return parse_topology(Cursor(load_document(path)), path.parent)
