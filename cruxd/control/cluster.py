"""The leader's picture of the cluster, built from agents' reports (pure).

Agents send their whole local state every report, so ingesting is "replace that
host's part"; what matters is telling a material change (a job arrived or left,
a measurement moved by more than the threshold, a NIC or path table changed)
from noise, because only material changes re-plan. Times are Unix seconds
passed in by the caller, which keeps this module clock-free and testable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cruxd.control import job_claims
from cruxd.control.job_claims import Refused
from cruxd.control.records import (
    AgentReport,
    HostInventory,
    LinkObservation,
    LocalJob,
    Measurement,
    PathTable,
)

# Expired agents and jobs stay visible in status this many agent timeouts.
KEEP_EXPIRED_TIMEOUTS = 10
AGENT_JOINED = "agent joined"  # the kind of cause a new (or expired) host's report brings


@dataclass
class AgentRecord:
    inventory: HostInventory
    jobs: dict[str, LocalJob]
    paths: dict[str, PathTable]  # by destination host
    links: tuple[LinkObservation, ...] = ()
    # when the leader last heard from the agent: its last report, or the end of its last
    # plan stream (a host with a stream open is alive: agents report only on change)
    last_report: float = 0.0
    applied_generation: int = 0
    expired: bool = False
    # measurements as of the last material change: drift is judged against these,
    # so many small steps still add up to a re-plan
    baseline: dict[str, Measurement] = field(default_factory=dict)
    # jobs whose measurement has been materially off their baseline since when (Unix s):
    # it re-plans once it has held for change_hold_s
    pending: dict[str, float] = field(default_factory=dict)
    # the report this record holds (AgentReport.incarnation, seq): a new plan stream that
    # names it needs no new report (a restored or elected leader's view is current)
    incarnation: int = 0
    seq: int = 0


@dataclass
class JobRecord:
    job_id: str
    first_seen: float
    profile: str = "queued"  # queued -> profiling -> done
    profiling_until: float = 0.0
    expired_at: float | None = None
    # how it left: its hosts' agents stopped reporting it while they lived (it ended), or it
    # went with them (their agents expired: lost, perhaps still running)
    ended: bool = False


@dataclass(frozen=True, slots=True)
class MergedJob:
    """A job across all hosts that report it, hosts in ring (node_rank) order."""

    job_id: str
    hosts: tuple[tuple[str, int], ...]
    nnodes: int
    measurement: Measurement  # W_j summed over hosts; times and sizes: the maximum
    # the TCP ports it listens on at each host, in the order of `hosts`
    tcp_ports: tuple[tuple[int, ...], ...] = ()

    def ports_at(self, host: str) -> tuple[int, ...]:
        """The ports the job listens on at `host` (() where none is known)."""
        for (h, _), ports in zip(self.hosts, self.tcp_ports, strict=False):
            if h == host:
                return ports
        return ()


@dataclass
class ClusterState:
    agent_timeout_s: float
    change_threshold: float
    profiling_s: float
    # a measurement change re-plans only once it has held this long (reports in between
    # that still show it): a one-window blip re-plans nothing
    change_hold_s: float = 0.0
    agents: dict[str, AgentRecord] = field(default_factory=dict)
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    # hops that vanished from an agent's paths, and when: other agents whose paths
    # cross them are asked to probe again (HostPlan.reprobe)
    down_hops: dict[str, float] = field(default_factory=dict)
    # (host, peer): when that host's table toward that peer last lost hops: its sweep saw
    # the fabric after whatever failed (the leader's failure hold counts it as probed)
    lost_at: dict[tuple[str, str], float] = field(default_factory=dict)
    # hosts with a plan stream open, and how many (gRPC keepalive pings find a dead one):
    # they do not expire, however long since their last report
    streams: dict[str, int] = field(default_factory=dict)
    # hosts dropped so far: state kept elsewhere per host (hint samples) is purged when
    # this moves, so hosts that come and go leave nothing behind
    hosts_removed: int = 0
    # a job is queued for or in its profiling window (kept by advance_profiling, so a
    # report does not scan every job): measurement changes then re-plan nothing
    profiling_under_way: bool = False
    # merged_jobs' result per job, kept while its hosts' parts are the same (5,000 jobs
    # cost 90 ms to merge on every re-plan)
    _merged: dict[str, tuple[tuple[tuple[str, LocalJob], ...], MergedJob]] = field(
        default_factory=dict, repr=False, compare=False)
    # parts left out of their job by merged_jobs (job_claims.split): job -> refused parts;
    # and how many (job, host) refusals there have been since the leader started
    refused: dict[str, tuple[Refused, ...]] = field(default_factory=dict, compare=False)
    claims_refused_total: int = field(default=0, compare=False)

    # --- events ------------------------------------------------------------
    def ingest(self, report: AgentReport, now: float) -> list[str]:
        """Take a (validated) report; return the material changes it brings."""
        host = report.host.host_id
        old = self.agents.get(host)
        new_jobs = {j.job_id: j for j in report.jobs}
        paths = {t.dst_host: t for t in report.paths}
        causes: list[str] = []
        if old is None or old.expired:
            causes.append(f"{AGENT_JOINED}: {host}")
        else:
            if old.inventory.nics != report.host.nics:
                causes.append(f"NICs changed: {host}")
            if _shapes(old.paths) != _shapes(paths):
                causes.append(f"path table changed: {host}")
                # A table the agent stopped keeping (no job of its host talks to that peer
                # any more) lost no hop: only a sweep that no longer finds one did. Taking
                # dropped tables for losses sent 7 hosts reprobes when a job ended.
                kept = {dst: t for dst, t in old.paths.items() if dst in paths}
                gone = _hops(kept) - _hops(paths)
                self.down_hops.update(dict.fromkeys(gone, now))
                for dst, t in kept.items():
                    if _table_hops(t) - _table_hops(paths[dst]):
                        self.lost_at[(host, dst)] = now
        before = old.jobs if old is not None and not old.expired else {}
        for jid in sorted(new_jobs.keys() - before.keys()):
            rec = self.jobs.get(jid)
            if rec is None or rec.expired_at is not None:
                self.jobs[jid] = JobRecord(jid, first_seen=now)
                self.profiling_under_way |= self.profiling_s > 0
                causes.append(f"job arrived: {jid}")
            else:
                causes.append(f"job grew: {jid} on {host}")
        for jid in sorted(before.keys() - new_jobs.keys()):
            causes.append(f"job left host: {jid} on {host}")
        for jid in sorted(before.keys() & new_jobs.keys()):
            # peers probe toward a job's ports, and its routes to this host carry them
            if before[jid].tcp_ports != new_jobs[jid].tcp_ports:
                causes.append(f"TCP ports changed: {jid} on {host}")
        for jid in sorted(j.job_id for j in report.jobs if j.request_profiling):
            rec = self.jobs.get(jid)
            if rec is not None and rec.profile == "done" and self.profiling_s > 0:
                rec.profile = "queued"
                self.profiling_under_way = True
                causes.append(f"profiling requested: {jid} by {host}")
        live_before = old if old is not None and not old.expired else None
        base = live_before.baseline if live_before else {}
        was_pending = live_before.pending if live_before else {}
        baseline, pending = {}, {}
        for jid, job in new_jobs.items():
            ref = base.get(jid)
            if jid in before and ref is not None:
                if not self._material(before[jid], ref, job):
                    baseline[jid] = ref
                    continue
                # A job's new shape re-plans at once. While a job profiles alone at the
                # top, the others' figures are not those of the plan to come, and its
                # "profiling done" re-plans with the newest figures anyway.
                if _same_shape(before[jid], job) and not self.profiling_under_way:
                    since = was_pending.get(jid, now)
                    if now - since < self.change_hold_s:
                        pending[jid], baseline[jid] = since, ref  # not yet: must hold
                        continue
                    causes.append(f"measurement changed: {jid} on {host}")
                elif not _same_shape(before[jid], job):
                    causes.append(f"measurement changed: {jid} on {host}")
            baseline[jid] = job.measurement
        # the stream's word (delivered) is newer than an agent's rare report
        applied = max(report.applied_generation, live_before.applied_generation
                      if live_before is not None else 0)
        self.agents[host] = AgentRecord(report.host, new_jobs, paths, report.links, now,
                                        applied, baseline=baseline,
                                        pending=pending, incarnation=report.incarnation,
                                        seq=report.seq)
        # only jobs that left this host can have ended: no scan of every job per report
        for jid in sorted(before.keys() - new_jobs.keys()):
            record = self.jobs.get(jid)
            if record is not None and record.expired_at is None and not any(
                    jid in rec.jobs for rec in self.agents.values() if not rec.expired):
                record.expired_at, record.ended = now, True
                causes.append(f"job ended: {jid}")
        return causes

    def holds_report(self, host: str, incarnation: int, seq: int) -> bool:
        """Whether the view holds the agent's report (incarnation, seq): its latest acked,
        as its new plan stream says. 0 names none (an agent that never had one acked)."""
        rec = self.agents.get(host)
        return (incarnation != 0 and rec is not None and not rec.expired
                and rec.incarnation == incarnation and rec.seq == seq)

    def stream_opened(self, host: str) -> None:
        self.streams[host] = self.streams.get(host, 0) + 1

    def delivered(self, host: str, generation: int) -> None:
        """The host's plan stream took this generation. The agent applies what its stream
        brings (one that cannot asks for the whole plan again, on a new stream), so that
        is what status shows it holds: 10,000 agents reporting after every plan, only to
        say so, were half the leader's load at start-up."""
        rec = self.agents.get(host)
        if rec is not None and generation > rec.applied_generation:
            rec.applied_generation = generation

    def stream_closed(self, host: str, now: float) -> None:
        """The grace (agent_timeout_s) before the host expires starts now."""
        n = self.streams.get(host, 0) - 1
        if n > 0:
            self.streams[host] = n
        else:
            self.streams.pop(host, None)
        rec = self.agents.get(host)
        if rec is not None and not rec.expired:
            rec.last_report = max(rec.last_report, now)

    def expire(self, now: float) -> list[str]:
        causes = []
        for host, rec in list(self.agents.items()):
            age = now - rec.last_report
            if host in self.streams and not rec.expired:
                continue
            if not rec.expired and age > self.agent_timeout_s:
                rec.expired = True
                rec.jobs = {}
                causes.append(f"agent expired: {host}")
            elif rec.expired and age > KEEP_EXPIRED_TIMEOUTS * self.agent_timeout_s:
                del self.agents[host]
                self.hosts_removed += 1
        causes += self._settle_jobs(now)
        causes += self._held_changes(now)
        for jid, job in list(self.jobs.items()):
            if (job.expired_at is not None
                    and now - job.expired_at > KEEP_EXPIRED_TIMEOUTS * self.agent_timeout_s):
                del self.jobs[jid]
        return causes

    def reprobe(self, now: float) -> dict[str, tuple[str, ...]]:
        """Per host, the peers whose paths cross a hop some agent lost after this
        host last probed them (and within the last KEEP_EXPIRED_TIMEOUTS timeouts)."""
        keep = KEEP_EXPIRED_TIMEOUTS * self.agent_timeout_s
        for hop, at in list(self.down_hops.items()):
            if now - at > keep:
                del self.down_hops[hop]
        for pair, at in list(self.lost_at.items()):
            if now - at > keep:
                del self.lost_at[pair]
        if not self.down_hops:
            return {}
        out = {}
        for host, rec in self.live_agents().items():
            peers = tuple(sorted(
                dst for dst, t in rec.paths.items()
                if any(self.down_hops.get(h, -1.0) * 1000 > t.probed_unix_ms
                       for p in t.paths for h in p.hops)))
            if peers:
                out[host] = peers
        return out

    def advance_profiling(self, now: float, enabled: bool = True) -> list[str]:
        """End finished profiling windows and start the oldest queued job's window."""
        causes = []
        live = [j for j in self.jobs.values() if j.expired_at is None]
        for job in live:
            if job.profile == "queued" and (not enabled or self.profiling_s <= 0):
                job.profile = "done"
            elif job.profile == "profiling" and now >= job.profiling_until:
                job.profile = "done"
                causes.append(f"profiling done: {job.job_id}")
        if not any(j.profile == "profiling" for j in live):
            queued = sorted((j for j in live if j.profile == "queued"),
                            key=lambda j: (j.first_seen, j.job_id))
            if queued:
                job = queued[0]
                job.profile = "profiling"
                job.profiling_until = now + self.profiling_s
                causes.append(f"profiling: {job.job_id}")
        self.profiling_under_way = any(j.profile != "done" for j in live)
        return causes

    def next_deadline(self) -> float | None:
        """When expire() or advance_profiling() next has something to do: dropping what
        expired long enough ago included, or a cluster that went quiet would keep it."""
        keep = KEEP_EXPIRED_TIMEOUTS * self.agent_timeout_s
        times = [r.last_report + (keep if r.expired else self.agent_timeout_s)
                 for h, r in self.agents.items() if r.expired or h not in self.streams]
        times += [j.expired_at + keep for j in self.jobs.values() if j.expired_at is not None]
        times += [j.profiling_until for j in self.jobs.values()
                  if j.profile == "profiling" and j.expired_at is None]
        times += [since + self.change_hold_s for r in self.agents.values() if not r.expired
                  for since in r.pending.values()]
        return min(times) if times else None

    # --- views -------------------------------------------------------------
    def live_agents(self) -> dict[str, AgentRecord]:
        return {h: r for h, r in self.agents.items() if not r.expired}

    def merged_jobs(self) -> list[MergedJob]:
        parts: dict[str, list[tuple[str, LocalJob]]] = {}
        for host, rec in sorted(self.live_agents().items()):
            for job in rec.jobs.values():
                parts.setdefault(job.job_id, []).append((host, job))
        out = []
        for jid in list(self._merged.keys() - parts.keys()):
            del self._merged[jid]
            self.refused.pop(jid, None)
        for jid in sorted(parts):
            reported = tuple(sorted(parts[jid], key=lambda hj: (hj[1].node_rank, hj[0])))
            kept = self._merged.get(jid)
            if kept is not None and kept[0] == reported:
                out.append(kept[1])
                continue
            members, refused = job_claims.split(reported)
            self._note_refused(jid, refused)
            ms = [j.measurement for _, j in members]
            merged = Measurement(
                flops_per_iter=sum(m.flops_per_iter for m in ms),
                comm_s=max(m.comm_s for m in ms),
                period_s=max(m.period_s for m in ms),
                compute_s=max(m.compute_s for m in ms),
                allreduce_bytes=max(m.allreduce_bytes for m in ms),
                source=",".join(sorted({m.source for m in ms if m.source})),
            )
            mj = MergedJob(jid, tuple((h, j.gpus) for h, j in members),
                           max(j.nnodes for _, j in members), merged,
                           tuple(j.tcp_ports for _, j in members))
            self._merged[jid] = (reported, mj)
            out.append(mj)
        return out

    def _note_refused(self, jid: str, refused: tuple[Refused, ...]) -> None:
        before = {r.host for r in self.refused.get(jid, ())}
        self.claims_refused_total += sum(r.host not in before for r in refused)
        if refused:
            self.refused[jid] = refused
        else:
            self.refused.pop(jid, None)

    # --- internals ---------------------------------------------------------
    def _material(self, a: LocalJob, ma: Measurement, b: LocalJob) -> bool:
        """Job `a` (last report; its measurement as of the last change: `ma`) -> `b`."""
        return not _same_shape(a, b) or ma.moved(b.measurement, self.change_threshold)

    def _held_changes(self, now: float) -> list[str]:
        """Measurement changes that have held for change_hold_s. Agents report only on
        change (agent/report_change.py), so a change that holds brings no more reports:
        no report saying otherwise within the hold is what holding means."""
        causes = []
        for host, rec in self.agents.items():
            if rec.expired or not rec.pending or self.profiling_under_way:
                continue
            for jid, since in list(rec.pending.items()):
                job = rec.jobs.get(jid)
                if job is None:
                    del rec.pending[jid]
                elif now - since >= self.change_hold_s:
                    del rec.pending[jid]
                    rec.baseline[jid] = job.measurement
                    causes.append(f"measurement changed: {jid} on {host}")
        return causes

    def _settle_jobs(self, now: float) -> list[str]:
        """Jobs no live agent reports expire; reported ones come back to life."""
        present = {jid for rec in self.live_agents().values() for jid in rec.jobs}
        causes = []
        for jid, job in self.jobs.items():
            if job.expired_at is None and jid not in present:
                job.expired_at = now
                causes.append(f"job lost: {jid} (no live agent reports it)")
        return causes


def _same_shape(a: LocalJob, b: LocalJob) -> bool:
    return (a.gpus, a.node_rank, a.nnodes) == (b.gpus, b.node_rank, b.nnodes)


def _shapes(tables: dict[str, PathTable]) -> dict[str, tuple[object, ...]]:
    return {dst: t.shape() for dst, t in tables.items()}


def _hops(tables: dict[str, PathTable]) -> set[str]:
    return {h for t in tables.values() for h in _table_hops(t)}


def _table_hops(t: PathTable) -> set[str]:
    return {h for p in t.paths for h in p.hops}
