"""From the leader's cluster state to one plan per host (pure; uses the scheduler).

The scheduler plans the jobs it can reason about: on the known fabric, with a
W_j and either traffic per iteration or a measured t_j. A job in its profiling
window gets the top level alone (seed §5) and everybody else is compressed into
the levels below; a job without measurements yet sits on the lowest level with
its paths left to ECMP, and says so.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cruxd.control.cluster import ClusterState, MergedJob
from cruxd.control.discovery import discover
from cruxd.control.job_routes import RouteContext, RouteMemo
from cruxd.control.records import (
    DECLARED_SOURCE,
    PATHS_BY_CRUX,
    PATHS_BY_FABRIC,
    HostPlan,
    JobAssignment,
    JobState,
    Nic,
    PathTable,
    PeerRoute,
)
from cruxd.control.tcp_routes import listening_ports
from cruxd.model.jobs import Job, ring_allreduce
from cruxd.model.plan import Plan
from cruxd.model.topology import Topology, TopologyBuilder
from cruxd.model.view import ClusterView, DiscoveredPath
from cruxd.scheduler.dscp import can_profile, profiling_slot, scheduled_dscp, unmeasured_slot
from cruxd.scheduler.incremental import IncrementalPlanner
from cruxd.scheduler.planner import PlanConfig, plan

LOG = logging.getLogger(__name__)
DEFAULT_OVERLAP = 0.5  # seed Fig. 12: communication may start half-way through compute


@dataclass(frozen=True)
class LeaderPlanConfig:
    """The scheduler's settings (levels and their DSCP included), and the fabric assumed
    when none is configured or discovered."""

    planner: PlanConfig = field(default_factory=PlanConfig)
    star_nic_gbps: float = 100.0
    path_selection: str = PATHS_BY_CRUX  # records.PATH_SELECTIONS ([leader] path_selection)


@dataclass
class PublishedPlan:
    generation: int
    planned_unix_ms: int
    levels: int
    jobs: tuple[JobAssignment, ...]
    causes: tuple[str, ...] = ()
    latency_s: float = 0.0
    topology: str = ""
    # The scheduler's whole plan (every flow) is large: built only when asked for
    # (cruxctl plan --live) and never persisted; a restored plan has none until the next.
    document: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    result: Plan | None = field(default=None, repr=False, compare=False)
    # the fabric the plan was made on (its flows' hops name its nodes); not persisted
    fabric: Topology | None = field(default=None, repr=False, compare=False)
    reprobe: dict[str, tuple[str, ...]] = field(default_factory=dict)  # host -> peers
    term: int = 0  # the leader's term (0: a single leader; HA: its election's revision)
    # Delta fan-out (cruxd.control.plan_delta): from generation `since` on, each host's
    # decisions last changed at changed_at[host], else at `since`.
    since: int = 0
    changed_at: dict[str, int] = field(default_factory=dict)
    path_selection: str = PATHS_BY_CRUX  # PATHS_BY_FABRIC: routes without ports or hops
    # caches of for_host, never passed on: dataclasses.replace() of a renumbered or re-termed
    # plan must not carry HostPlans of the old number (a restarted leader served generation
    # 122 under the 124 it announced, and agents holding 123 went back: issue 37)
    _per_host: dict[str, HostPlan] = field(default_factory=dict, init=False, repr=False,
                                           compare=False)
    _by_host: dict[str, list[JobAssignment]] = field(default_factory=dict, init=False,
                                                     repr=False, compare=False)

    def plan_document(self) -> dict[str, Any] | None:
        """Plan.to_dict() of the scheduler's plan, built on first use."""
        if self.document is None and self.result is not None:
            self.document = self.result.to_dict()
        return self.document

    def for_host(self, host: str) -> HostPlan:
        hp = self._per_host.get(host)
        if hp is None:
            if not self._by_host and self.jobs:  # one pass over the jobs, not one per host
                for j in self.jobs:
                    for h in dict.fromkeys(j.hosts):
                        self._by_host.setdefault(h, []).append(j)
            jobs = tuple(j.for_host(host) for j in self._by_host.get(host, ()))
            hp = self._per_host[host] = self.envelope(host, jobs)
        return hp

    def envelope(self, host: str, jobs: tuple[JobAssignment, ...] = ()) -> HostPlan:
        """`host`'s message with `jobs` (none: what it shares with no decision)."""
        return HostPlan(self.generation, host, self.planned_unix_ms, self.levels, jobs,
                        self.reprobe.get(host, ()), self.term,
                        path_selection=self.path_selection)

    def unchanged_since(self, host: str, have: int) -> bool:
        """Whether `host`'s decisions are the same as at generation `have`."""
        return (self.since <= have < self.generation
                and self.changed_at.get(host, self.since) <= have)


def star(hosts: Mapping[str, tuple[Nic, ...]], gbps: float) -> Topology:
    """The fabric when none is configured: every host's NICs on one switch."""
    b = TopologyBuilder("star")
    b.switch("star", 1)
    for host in sorted(hosts):
        b.host(host, 0)
        for _ in range(max(1, len(hosts[host]))):
            b.link(host, "star", gbps)
    return b.build()


@dataclass(frozen=True)
class PlanInputs:
    """A copy of what planning reads, taken on the event loop, so the plan can be
    computed in a worker thread while reports keep changing the live state."""

    jobs: tuple[MergedJob, ...]
    nics: dict[str, tuple[Nic, ...]]
    tables: dict[str, dict[str, PathTable]]  # src host -> dst host -> its path table
    profile: dict[str, str]  # job id -> queued | profiling | done
    reprobe: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def paths(self) -> dict[tuple[str, str], tuple[DiscoveredPath, ...]]:
        """The path table as reported (hops: router addresses or INT node ids)."""
        return {(src, dst): tuple(DiscoveredPath(p.hops, p.sports, p.tcp) for p in t.paths)
                for src, by_dst in self.tables.items() for dst, t in by_dst.items()}


def plan_inputs(state: ClusterState, now: float) -> PlanInputs:
    agents = state.live_agents()
    return PlanInputs(
        jobs=tuple(state.merged_jobs()),
        nics={h: r.inventory.nics for h, r in agents.items()},
        tables={h: dict(r.paths) for h, r in agents.items()},
        profile={j: r.profile for j, r in state.jobs.items() if r.expired_at is None},
        reprobe=state.reprobe(now))


def fabric_for(inputs: PlanInputs, topology: Topology | None, config: LeaderPlanConfig
               ) -> tuple[Topology, dict[tuple[str, str], tuple[DiscoveredPath, ...]], bool]:
    """The topology to plan on and the path table in its node names: the configured
    fabric, else the one the probes found, else a star. The flag: discovered."""
    if topology is not None:
        return topology, inputs.paths, False
    try:
        found = discover(inputs.tables, inputs.nics, config.star_nic_gbps)
    except ValueError as exc:
        LOG.warning("cannot build the fabric from the probes (%s); planning on a star", exc)
        found = None
    if found is None:
        return star(inputs.nics, config.star_nic_gbps), {}, False
    return found.topology, found.paths, True


ADDRESS_MEMO = 400_000  # (host, rail) entries JobMemo keeps before it starts over


class JobMemo:
    """The scheduler's Job for each merged job, kept while the job, the fabric and (on a
    discovered fabric) which of its ring's pairs are probed stay the same: rebuilding all
    5,000 took 150 ms of every re-plan, and the same Job objects let the IncrementalPlanner
    compare them by identity."""

    def __init__(self) -> None:
        self._jobs: dict[str, tuple[MergedJob, Topology, object, Job | None, str]] = {}
        self._addresses: dict[tuple[str, int | None],
                              tuple[tuple[Nic, ...] | None, tuple[str, ...]]] = {}
        self.routes = RouteMemo()  # each planned job's routes (control/job_routes.py)

    def as_job(self, m: MergedJob, topo: Topology,
               probed: Mapping[tuple[str, str], object] | None) -> tuple[Job | None, str]:
        hosts = tuple(h for h, _ in m.hosts)
        key = None if probed is None else tuple(p in probed for p in _ring_pairs(hosts))
        got = self._jobs.get(m.job_id)
        if got is not None and got[1] is topo and got[2] == key and got[0] == m:
            return got[3], got[4]
        job, note = _as_job(m, topo, probed)
        self._jobs[m.job_id] = (m, topo, key, job, note)
        return job, note

    def keep(self, job_ids: set[str]) -> None:
        for jid in self._jobs.keys() - job_ids:
            del self._jobs[jid]
        self.routes.keep(job_ids)
        if len(self._addresses) > ADDRESS_MEMO:  # hosts and rails that came and went
            self._addresses.clear()

    def addresses(self, nics: Mapping[str, tuple[Nic, ...]], host: str, port: int | None
                  ) -> tuple[str, ...]:
        """_addresses, kept while the host's NICs are the same objects (agents report
        rarely, and a report that changes nothing keeps the record): 10,000 hosts of 8 rails
        are 80,000 routes a plan, each looking its peer's NICs up."""
        have = nics.get(host)
        got = self._addresses.get((host, port))
        if got is not None and got[0] is have:
            return got[1]
        out = _addresses(nics, host, port)
        self._addresses[(host, port)] = (have, out)
        return out


def make_plan(inputs: PlanInputs, topology: Topology | None, config: LeaderPlanConfig,
              generation: int, now: float, causes: tuple[str, ...] = (), *,
              planner: IncrementalPlanner | None = None,
              jobs: JobMemo | None = None,
              previous: PublishedPlan | None = None) -> PublishedPlan:
    """`planner`: the leader's IncrementalPlanner (the same plan, re-computing only what
    changed since its last call; one plan at a time); None plans from scratch. `jobs`:
    the leader's JobMemo, likewise. `previous`: the plan published before, whose ports a
    route keeps where its path is the same (sticky_routes)."""
    fabric = config.path_selection == PATHS_BY_FABRIC
    if fabric:  # adaptive routing: no probed path to plan on or to probe again
        inputs = replace(inputs, tables={}, reprobe={})
    topo, paths, discovered = fabric_for(inputs, topology, config)
    levels = config.planner.levels
    dscp = config.planner.dscp_values()
    merged = inputs.jobs
    profiling = {jid for jid, p in inputs.profile.items() if p == "profiling"}
    scheduled = scheduled_dscp(dscp, any(m.job_id in profiling for m in merged))
    reserve = len(scheduled) < levels  # the top level is the profiling job's alone
    profiling_level, profiling_dscp = profiling_slot(dscp)
    unmeasured_level, unmeasured_dscp = unmeasured_slot(dscp)

    plannable: list[Job] = []
    notes: dict[str, str] = {}
    waiting: set[str] = set()  # unplanned only until their hosts report or paths are probed
    memo = jobs if jobs is not None else JobMemo()  # a fresh one: this plan's lookups only
    memo.keep({m.job_id for m in merged})
    probed = paths if discovered else None
    for m in merged:
        job, note = memo.as_job(m, topo, probed)
        if job is None:
            notes[m.job_id] = note
            if note == _awaiting(m, probed):
                waiting.add(m.job_id)
        else:
            plannable.append(job)
    result: Plan | None = None
    if plannable:
        view = ClusterView(topo, tuple(plannable), paths)
        scheduler_config = replace(config.planner, levels=len(scheduled), dscp=scheduled)
        result = (planner.plan(view, scheduler_config) if planner is not None
                  else plan(view, scheduler_config))
    nics = inputs.nics
    decided = {d.job: d for d in result.jobs} if result else {}
    was = {a.job_id: a for a in previous.jobs} if previous is not None else {}
    routes: dict[str, tuple[PeerRoute, ...]] = {}
    listening = listening_ports(merged)
    if result is not None:
        ctx = RouteContext(nics, paths, listening, fabric)
        by_id = {m.job_id: m for m in merged}
        memo.routes.turn()
        for jid, flows in result.job_flows.items():
            if flows:
                old = was.get(jid)
                routes[jid] = memo.routes.routes(
                    by_id[jid], flows, old.routes if old is not None and not fabric else (),
                    ctx, memo.addresses)

    out = []
    for m in merged:
        hosts = tuple(h for h, _ in m.hosts)
        gpus = sum(g for _, g in m.hosts)
        d = decided.get(m.job_id)
        if m.job_id not in routes:  # unplanned: the ring's peers still tell agents whom (and
            # toward which of the job's ports) to probe
            routes[m.job_id] = tuple(
                PeerRoute(src, dst, _addresses(nics, dst, None),
                          tcp_dport=0 if fabric else next(iter(m.ports_at(dst)), 0))
                for src, dst in _ring_pairs(hosts))
        if m.job_id in profiling and reserve:
            a = JobAssignment(m.job_id, JobState.PROFILING, level=profiling_level,
                              dscp=profiling_dscp, hosts=hosts, gpus=gpus,
                              routes=routes.get(m.job_id, ()), note=notes.get(m.job_id, ""))
            if d is not None:
                a = replace(a, intensity=d.intensity, k=d.k, rank=d.rank)
        elif d is None:
            a = JobAssignment(m.job_id, JobState.UNMEASURED, level=unmeasured_level,
                              dscp=unmeasured_dscp, hosts=hosts, gpus=gpus,
                              routes=routes[m.job_id], note=notes.get(m.job_id, ""),
                              provisional=m.job_id in waiting)
        else:
            state_ = (JobState.QUEUED if inputs.profile.get(m.job_id) == "queued"
                      and can_profile(levels) else JobState.SCHEDULED)
            a = JobAssignment(m.job_id, state_, intensity=d.intensity, k=d.k,
                              rank=d.rank, level=d.level, dscp=d.dscp, hosts=hosts, gpus=gpus,
                              routes=routes.get(m.job_id, ()))
        kept = was.get(m.job_id)
        out.append(kept if kept == a else a)  # the same object again: see keep_ports
    out.sort(key=lambda a: (a.state is not JobState.PROFILING, -a.level, a.rank, a.job_id))
    return PublishedPlan(generation, int(now * 1000), levels, tuple(out), causes,
                         topology=topo.name, result=result, reprobe=inputs.reprobe,
                         fabric=topo, path_selection=config.path_selection)


def _ring_pairs(hosts: tuple[str, ...]) -> list[tuple[str, str]]:
    if len(hosts) < 2:
        return []
    return [(h, hosts[(i + 1) % len(hosts)]) for i, h in enumerate(hosts)]


def _awaiting(m: MergedJob, probed: Mapping[tuple[str, str], object] | None) -> str | None:
    """What the job's plan still waits for that comes without the job doing anything: its
    other hosts' reports, or a probed path between its hosts; None when nothing."""
    if m.nnodes > len(m.hosts):
        return f"{len(m.hosts)} of {m.nnodes} hosts reported"
    hosts = tuple(h for h, _ in m.hosts)
    unprobed = [p for p in _ring_pairs(hosts) if probed is not None and p not in probed]
    if unprobed:
        return f"no probed path {unprobed[0][0]} -> {unprobed[0][1]} yet"
    return None


def _as_job(m: MergedJob, topo: Topology,
            probed: Mapping[tuple[str, str], object] | None) -> tuple[Job | None, str]:
    missing = [h for h, _ in m.hosts if not topo.is_host(h)]
    if missing:
        return None, f"host {missing[0]} not in topology {topo.name}"
    if (awaiting := _awaiting(m, probed)) is not None:
        return None, awaiting
    ms = m.measurement
    multi = len(m.hosts) > 1
    if ms.flops_per_iter <= 0:
        return None, "no W_j measured yet"
    if multi and ms.allreduce_bytes <= 0 and ms.comm_s <= 0:
        return None, "no traffic or t_j measured yet"
    compute = ms.compute_s or ms.period_s or 1.0
    overlap = DEFAULT_OVERLAP
    if ms.compute_s and ms.period_s and ms.comm_s:
        # period = (1 - o) * compute + comm when communication is the tail
        overlap = min(1.0, max(0.0, 1.0 - (ms.period_s - ms.comm_s) / ms.compute_s))
    size = ms.allreduce_bytes or 1.0  # t_j measured without sizes: nominal traffic
    ports = {h: topo.nic_ports(h) for h, _ in m.hosts}
    flows = ring_allreduce(m.hosts, size, ports) if multi else ()
    return Job(m.job_id, m.hosts, compute, ms.flops_per_iter, overlap, flows,
               comm_s=ms.comm_s or None,
               declared=DECLARED_SOURCE in ms.source.split(",")), ""


def _addresses(nics: Mapping[str, tuple[Nic, ...]], host: str, port: int | None
               ) -> tuple[str, ...]:
    have = nics.get(host, ())
    same_rail = tuple(n.address for n in have if port is not None and n.port == port)
    return same_rail or tuple(n.address for n in have)
