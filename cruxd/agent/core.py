"""The agent: answers the local socket, keeps the registry, reports to the leader
and writes the leader's decisions for this host into the decision table.

Its measurement and probing sources come from factories (source_choice.py) and are used
only through their protocols (sources.py); requests on the local socket arrive as domain
records through local_rpc.py, the only part of the agent's socket that speaks protobuf."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from pathlib import Path

from cruxd import __version__
from cruxd.agent.dataplane import DataPlane, JobOwners
from cruxd.agent.first_decisions import FirstDecisions
from cruxd.agent.inventory import discover_nics, gpu_count
from cruxd.agent.job_ports import learned_ports, merge_ports
from cruxd.agent.job_store import JobStore
from cruxd.agent.leader_finder import LeaderFinder
from cruxd.agent.local_api import AgentStatus, Refusal, Refused, StartInfo
from cruxd.agent.local_rpc import LocalRpc
from cruxd.agent.local_server import Limits, LocalServer, PeerCred, group_id
from cruxd.agent.registry import Registry
from cruxd.agent.report_change import why_report
from cruxd.agent.source_choice import (
    MeasurementFactory,
    ProbingFactory,
    SourceInputs,
    measurement_for,
    probing_for,
)
from cruxd.agent.uplink import LeaderLink
from cruxd.config.model import Config
from cruxd.control.records import AgentReport, HostInventory, HostPlan, LocalJob, Measurement
from cruxd.control.validate import InvalidMessage, check_host_plan, check_local_job
from transport.decision_table import Decision, TableWriter

LOG = logging.getLogger(__name__)
# A report costs O(jobs). One per registration made registering O(jobs) (the audit's 4,100
# registrations in 490 s): a job change asks for a report only once this many times the
# last report's cost has passed since it, so reports take a bounded share of the loop.
REPORT_SPACING = 20
# a PCIe link held this long is taken back by the agent: an honest job's hold (first signaled
# post to last completion) lasts seconds at most, and its gate queues again at the next post
PCIE_MAX_HOLD_S = 10.0


def plan_decisions(hp: HostPlan) -> list[Decision]:
    """Table entries for one host's plan: a job-wide entry per job, one per peer address
    (its RoCE source port, and the TCP ports probed onto the same path)."""
    out: dict[tuple[str, str | None], Decision] = {}
    for a in hp.jobs:
        tc = a.traffic_class
        out[(a.job_id, None)] = Decision(a.job_id, None, a.level, a.dscp, tc, 0, hp.generation,
                                         provisional=a.provisional)
        for r in a.routes:
            for addr in r.peer_addresses:
                d = Decision(a.job_id, addr, a.level, a.dscp, tc, r.sport, hp.generation,
                             r.tcp_dport, r.tcp_sports)
                out.setdefault(d.key, d)  # one rail per peer address: the first route wins
    return list(out.values())


class Agent:
    def __init__(self, config: Config, leader_address: str,
                 measurement: MeasurementFactory = measurement_for,
                 probing: ProbingFactory = probing_for) -> None:
        self.config = config
        a = config.agent
        self.host_id = config.host_id
        self.registry = Registry(self._job_changed)
        self.nics = discover_nics(a.addresses)
        self.dataplane = DataPlane(Path(a.decision_table))
        inputs = SourceInputs(config, self.nics, self.registry.owners, self.dataplane.records,
                              lambda: len(self.registry), lambda: self.link.poke())
        self.measurement = measurement(inputs)
        self.probing = probing(inputs)
        self.gpus = gpu_count(a.gpus)
        self.table = TableWriter.open(a.decision_table, capacity=a.table_capacity)
        self.store = JobStore(self.state_file)
        self.finder = (LeaderFinder(config.leader, config.control.dscp)
                       if config.leader.ha == "etcd" else None)
        self.link = LeaderLink(leader_address, config.tls, self.host_id, self.report,
                               self.apply_plan, a.report_interval_s, a.reconnect_max_s,
                               lambda: self.table.header().plan_generation,
                               token_path=config.agent.leader_token,
                               fallback=a.leader_fallback, resolve=self.finder,
                               dscp=config.control.dscp, why=self._why_report,
                               keepalive_s=config.control.keepalive_s,
                               etcd_term=self.finder.term if self.finder else None)
        # last: its handler sees the agent whole (local_api.LocalAgent)
        self.server = LocalServer(a.socket, group_id(a.socket_group), LocalRpc(self).handle,
                                  Limits(a.max_connections, a.max_connections_per_uid,
                                         a.request_timeout_s))
        self.rejected = 0
        self.first = FirstDecisions()
        self.term = 0  # the newest leader term seen: plans from older ones are refused
        self.stale_refused = 0
        self._backwards: tuple[int, int] | None = None  # (term, generation) refused once
        self._restoring = False
        self._report_at = 0.0  # monotonic time of the last report built, and its cost
        self._report_cost = 0.0
        self._poke_timer: asyncio.TimerHandle | None = None
        self._pcie_timer: asyncio.TimerHandle | None = None
        self._reprobe: frozenset[str] = frozenset()  # peers the plan asks to probe again

    async def start(self) -> None:
        self._restore()
        self.dataplane.start()
        if self.dataplane.pcie_links:
            self._pcie_timer = asyncio.get_running_loop().call_later(1.0, self._pcie_tick)
        self.measurement.start()
        await self.server.start()
        await self.link.start()
        await self.probing.start()
        LOG.info("agent %s: socket %s, table %s, leader %s, %d NIC(s), %d GPU(s)",
                 self.host_id, self.config.agent.socket, self.config.agent.decision_table,
                 self.link.address, len(self.nics), self.gpus)

    async def stop(self) -> None:
        if self._poke_timer is not None:
            self._poke_timer.cancel()
        if self._pcie_timer is not None:
            self._pcie_timer.cancel()
        self.dataplane.close()
        await self.probing.stop()
        await self.server.stop()
        await self.link.stop()
        if self.finder is not None:
            await self.finder.close()
        self.measurement.stop()
        self._rewrite()
        self.registry.close()
        self.table.close()  # the file stays: shims keep the last decisions

    def reload(self, config: Config) -> None:
        self.config = config
        self.link.interval_s = config.agent.report_interval_s
        self.measurement.reconfigure(config)

    # --- state ---------------------------------------------------------------
    def local_jobs(self) -> list[LocalJob]:
        jobs = self.registry.jobs()
        self.measurement.forget({j.job_id for j in jobs})
        busy = self.dataplane.ports_busy({  # reads the records
            j.job_id: JobOwners(self.registry.owner_uid(j.job_id) or 0,
                                frozenset(self.registry.owners(j.job_id))) for j in jobs})
        learned = learned_ports(self.dataplane.sock_records, self.registry.owner_uid)
        return [replace(job, measurement=self.measurement.measure(
            job, self.registry.hints(job.job_id)),
            request_profiling=self.measurement.wants_profile(job.job_id),
            tcp_ports_busy=busy.get(job.job_id, 0),
            tcp_ports=merge_ports(job.tcp_ports, learned.get(job.job_id, ())))
            for job in jobs]

    def inventory(self) -> HostInventory:
        return HostInventory(self.host_id, __version__, self.gpus, self.nics,
                             self.measurement.name, self.probing.name)

    def report(self) -> AgentReport:
        start = time.monotonic()
        try:
            return self._report()
        finally:
            self._report_at = time.monotonic()
            self._report_cost = self._report_at - start

    def _report(self) -> AgentReport:
        return AgentReport(self.inventory(), tuple(self.local_jobs()), self.probing.paths(),
                           self.measurement.links(), self.table.header().plan_generation)

    def _why_report(self, last: AgentReport | None, new: AgentReport,
                    age_s: float) -> str | None:
        a = self.config.agent
        return why_report(last, new, age_s, a.refresh_s, a.report_change, self._reprobe)

    def apply_plan(self, hp: HostPlan) -> bool:
        """Apply one message of the plan stream; False when the table does not hold the
        generation a watermark builds on, or when a full plan goes back below the table
        within a term for the first time (the stream must start over for a full plan)."""
        check_host_plan(hp, self.host_id)
        if hp.term < self.term:  # a deposed leader that has not noticed yet
            self.stale_refused += 1
            LOG.warning("plan %d refused: leader term %d, older than %d", hp.generation,
                        hp.term, self.term)
            return True
        held = self.table.header().plan_generation
        back = not hp.unchanged and hp.term == self.term and hp.generation < held
        self.term = hp.term
        if back and self._backwards != (hp.term, hp.generation):
            # lower than the table within one term: a leader's numbering went back (issue 37
            # saw a restarted leader serve an older part). Ask for the whole plan once more;
            # if the leader sends the same number again, it is what the leader has.
            self._backwards = (hp.term, hp.generation)
            self.stale_refused += 1
            LOG.warning("plan %d refused: the table holds %d, a newer generation of term %d; "
                        "asking for the whole plan again", hp.generation, held, hp.term)
            return False
        if back:
            LOG.error("plan %d applied over %d: the leader sent the lower generation again "
                      "(a restarted leader that lost its recorded generations?)",
                      hp.generation, held)
        if hp.unchanged:
            if held != hp.base_generation:
                LOG.warning("plan %d: unchanged since %d, but the table holds %d; asking for "
                            "the whole plan", hp.generation, hp.base_generation, held)
                return False
            # no report now: 10,000 agents answering every plan's watermark at once cost
            # the leader a core (bench/control_plane.py --shape real); the next report
            # tells it the generation
            self.table.advance(hp.generation)
            LOG.debug("plan %d: nothing changed on this host", hp.generation)
            return True
        changed = self.table.apply(plan_decisions(hp), hp.generation)
        bound = self.config.agent.start_wait_s
        for jid, took in self.first.applied(hp.jobs, bound, time.monotonic()):
            LOG.warning("job %s: first decision %.1f s after it registered, past "
                        "agent.start_wait_s (%g s): it started without one, and the "
                        "connections it made then are unsteered", jid, took, bound)
        self._reprobe = frozenset(hp.reprobe)
        self.probing.plan_changed(hp)
        self.measurement.plan_changed(hp)
        self.link.poke()  # the leader learns the generation from the stream (delivered)
        LOG.info("plan %d applied: %d job(s), %d table entr%s changed", hp.generation,
                 len(hp.jobs), changed, "y" if changed == 1 else "ies",
                 extra={"generation": hp.generation})
        return True

    def _job_changed(self, job_id: str, what: str) -> None:
        if what in ("deregistered", "exited"):
            self.table.remove_job(job_id)  # at once: do not wait for the next plan
            self.first.gone(job_id)
        elif what == "registered" and not self._restoring:
            self.first.registered(job_id, time.monotonic())
        if not self._restoring:
            self._save(job_id)
        # logged once journaled: a line saying "registered" means a restart keeps the job
        # (a SIGKILL between the two lost it: tests/test_trust_agent.py, once in CI)
        LOG.info("job %s %s", job_id, what, extra={"crux_job": job_id})
        self._poke_soon()

    def _pcie_tick(self) -> None:
        """Once a second: PCIe links held past PCIE_MAX_HOLD_S go back (the agent's revoke;
        waiters' own leases and dead/stopped checks act within milliseconds)."""
        for link, pid in self.dataplane.revoke_stuck(PCIE_MAX_HOLD_S):
            LOG.warning("PCIe link %d taken back from process %d: held %g s or more",
                        link, pid, PCIE_MAX_HOLD_S)
        self._pcie_timer = asyncio.get_running_loop().call_later(1.0, self._pcie_tick)

    def _poke_soon(self) -> None:
        """Report the change, once REPORT_SPACING report costs have passed (coalesced)."""
        if self._poke_timer is not None:
            return
        wait = self._report_at + REPORT_SPACING * self._report_cost - time.monotonic()
        if wait <= 0:
            self.link.poke()
            return
        self._poke_timer = asyncio.get_running_loop().call_later(wait, self._poke_now)

    def _poke_now(self) -> None:
        self._poke_timer = None
        self.link.poke()

    # --- state across restarts -------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.config.state_dir / "agent-state.json"

    def _save(self, job_id: str) -> None:
        """Journal one job's change (O(1), job_store.py); rewrite the whole state only
        when the journal has outgrown it."""
        try:
            if self.store.changed(job_id, self.registry.saved(job_id), len(self.registry)):
                self._rewrite()
        except OSError as exc:
            LOG.error("cannot save agent state to %s: %s", self.state_file, exc.strerror)

    def _rewrite(self) -> None:
        try:
            self.store.rewrite(self.registry.snapshot())
        except OSError as exc:
            LOG.error("cannot save agent state to %s: %s", self.state_file, exc.strerror)

    def _restore(self) -> None:
        """Jobs registered before a restart whose processes still run keep their place
        (crux-run registers once, so without this a restart would lose them)."""
        try:
            saved = self.store.load()
        except FileNotFoundError:
            return
        except OSError as exc:
            LOG.error("agent state %s unreadable (%s); starting with no jobs",
                      self.state_file, exc)
            return
        if self.store.snapshot_error:
            LOG.error("agent state %s damaged (%s); restoring what its journal holds",
                      self.state_file, self.store.snapshot_error)
        if self.store.skipped:
            LOG.warning("agent state %s: %d damaged or invalid job entr%s skipped",
                        self.state_file, self.store.skipped,
                        "y" if self.store.skipped == 1 else "ies")
        self._restoring = True
        try:
            for s in saved:
                if self.registry.adopt(s):
                    LOG.info("job %s kept across the restart", s.job.job_id)
                else:
                    self.table.remove_job(s.job.job_id)  # ended while the agent was down
        finally:
            self._restoring = False
        self._rewrite()

    # --- local socket requests (decoded and answered by local_rpc.py) ----------
    def register(self, job: LocalJob, hints: Measurement, cred: PeerCred) -> LocalJob:
        try:
            check_local_job(job)
            check_local_job(LocalJob(job.job_id, job.gpus, measurement=hints), "job")
        except InvalidMessage as exc:
            self.rejected += 1
            raise Refused(Refusal.INVALID, str(exc)) from None
        owner = self.registry.owner_uid(job.job_id)
        if owner is not None and owner != cred.uid:  # its hints are another user's to give
            self.rejected += 1
            raise Refused(Refusal.NOT_ALLOWED, f"job id {job.job_id!r} is registered here by "
                          f"uid {owner}; uid {cred.uid} may not join it (choose another id)")
        held = self.registry.claim(job.job_id)
        if held is not None and held != job.claim:  # same user, another job key
            self.rejected += 1
            raise Refused(Refusal.NOT_ALLOWED, f"job id {job.job_id!r} is registered here "
                          "with another job key (CRUX_JOB_KEY); its processes may not mix")
        limit = self.config.agent.max_jobs
        if owner is None and len(self.registry) >= limit:  # the leader would refuse them all
            self.rejected += 1
            raise Refused(Refusal.EXHAUSTED, f"this host has {limit} jobs, agent.max_jobs; "
                          f"{job.job_id!r} not registered")
        if cred.pid not in self.registry.owners(job.job_id):  # a new process: one descriptor
            self._check_processes(job.job_id, cred)
        try:
            return self.registry.register(job, hints, cred.pid, cred.uid)
        except ProcessLookupError:
            raise Refused(Refusal.INVALID,
                          f"process {cred.pid} exited before registering") from None
        except OSError as exc:  # EMFILE from pidfd_open under a flood: refuse, keep going
            self.rejected += 1
            raise Refused(Refusal.EXHAUSTED, f"cannot watch process {cred.pid}: "
                          f"{exc.strerror or exc}") from None

    def _check_processes(self, job_id: str, cred: PeerCred) -> None:
        """Each registered process holds a descriptor here: one job's, or one user's, could
        take them all (1,100 processes of one job starved an agent of nofile 1024 into
        failing its saves and accepts: issue 37)."""
        a = self.config.agent
        if self.registry.processes(job_id) >= a.max_processes_per_job:
            self.rejected += 1
            raise Refused(Refusal.EXHAUSTED, f"job {job_id!r} has {a.max_processes_per_job} "
                          "processes registered here, agent.max_processes_per_job; process "
                          f"{cred.pid} runs unscheduled")
        if cred.uid != 0 and self.registry.processes_of(cred.uid) >= a.max_processes_per_user:
            self.rejected += 1
            raise Refused(Refusal.EXHAUSTED, f"uid {cred.uid} has {a.max_processes_per_user} "
                          "processes registered here, agent.max_processes_per_user; process "
                          f"{cred.pid} runs unscheduled")

    def deregister(self, job_id: str, cred: PeerCred) -> None:
        if job_id not in self.registry:
            raise Refused(Refusal.NOT_FOUND, f"no job {job_id!r} on this host")
        owners = self.registry.owners(job_id)
        if cred.pid not in owners and cred.uid != 0:
            raise Refused(Refusal.NOT_ALLOWED, f"job {job_id!r} belongs to pid(s) "
                          f"{', '.join(map(str, owners))}")
        self.registry.deregister(job_id, cred.pid if cred.pid in owners else None)

    def start_info(self, job_id: str) -> StartInfo:
        a = self.config.agent
        return StartInfo(self.host_id, str(a.decision_table), a.start_wait_s,
                         job_id in self.registry)

    def status(self) -> AgentStatus:
        seen = self.link.last_plan_mono
        return AgentStatus(
            self.host_id, __version__, self.link.address, str(self.config.agent.decision_table),
            self.table.header().plan_generation, self.measurement.name, self.probing.name,
            tuple(self.local_jobs()), self.probing.paths(), self.dataplane.pcie_links,
            -1.0 if seen is None else time.monotonic() - seen, self.link.reachable,
            self.link.last_error, self.first.late, self.link.terms_refused)
