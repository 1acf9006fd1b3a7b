"""The agent: answers the local socket, keeps the registry, reports to the leader
and writes the leader's decisions for this host into the decision table."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path

from cruxd import __version__
from cruxd.agent.dataplane import DataPlane
from cruxd.agent.inventory import discover_nics, gpu_count
from cruxd.agent.local_server import LocalServer, PeerCred, group_id
from cruxd.agent.local_server import error_reply as _error
from cruxd.agent.measuring import LiveMeasurement
from cruxd.agent.registry import Registry
from cruxd.agent.sources import (
    MeasurementSource,
    NoProbing,
    ProbingSource,
    ReplayMeasurement,
    StaticMeasurement,
    StaticPaths,
)
from cruxd.agent.sweeper import SweepProbing
from cruxd.agent.uplink import LeaderLink
from cruxd.config.model import Config
from cruxd.config.statefile import write_atomic
from cruxd.control.codec import from_dict, to_dict
from cruxd.control.records import AgentReport, HostInventory, HostPlan, LocalJob, Measurement
from cruxd.control.validate import InvalidMessage, check_host_plan, check_local_job
from cruxd.rpc import convert
from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.local import INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, UNAVAILABLE
from transport.decision_table import Decision, TableWriter

LOG = logging.getLogger(__name__)
STATE_FORMAT = "crux-agent-state/1"


def plan_decisions(hp: HostPlan) -> list[Decision]:
    """Table entries for one host's plan: a job-wide entry per job, one per peer address
    (its RoCE source port, and the TCP ports probed onto the same path)."""
    out: dict[tuple[str, str | None], Decision] = {}
    for a in hp.jobs:
        tc = a.traffic_class
        out[(a.job_id, None)] = Decision(a.job_id, None, a.level, a.dscp, tc, 0, hp.generation)
        for r in a.routes:
            for addr in r.peer_addresses:
                d = Decision(a.job_id, addr, a.level, a.dscp, tc, r.sport, hp.generation,
                             r.tcp_dport, r.tcp_sports)
                out.setdefault(d.key, d)  # one rail per peer address: the first route wins
    return list(out.values())


class Agent:
    def __init__(self, config: Config, leader_address: str) -> None:
        self.config = config
        a = config.agent
        self.host_id = config.host_id
        self.registry = Registry(self._job_changed)
        self.nics = discover_nics(a.addresses)
        self.dataplane = DataPlane(Path(a.decision_table))
        self.measurement: MeasurementSource = (
            ReplayMeasurement(a.measurement_file) if a.measurement == "replay"
            and a.measurement_file is not None else
            LiveMeasurement(config.measurement, self.nics, self.registry.owners,
                            self.dataplane.records, lambda: len(self.registry.jobs()))
            if a.measurement == "live" else StaticMeasurement(a.accept_job_hints))
        self.probing: ProbingSource = (
            StaticPaths(a.path_table, self.host_id) if a.probing == "static"
            and a.path_table is not None else
            SweepProbing(config.probing, self.host_id, lambda: self.link.poke())
            if a.probing == "sweep" else NoProbing())
        self.gpus = gpu_count(a.gpus)
        self.table = TableWriter.open(a.decision_table, capacity=a.table_capacity)
        self.server = LocalServer(a.socket, group_id(a.socket_group), self.handle)
        self.link = LeaderLink(leader_address, config.tls, self.host_id, self.report,
                               self.apply_plan, a.report_interval_s, a.reconnect_max_s,
                               lambda: self.table.header().plan_generation)
        self.plans_applied = 0
        self.rejected = 0
        self._restoring = False

    async def start(self) -> None:
        self._restore()
        self.dataplane.start()
        if isinstance(self.measurement, LiveMeasurement):
            self.measurement.start()
        await self.server.start()
        await self.link.start()
        if isinstance(self.probing, SweepProbing):
            await self.probing.start()
        LOG.info("agent %s: socket %s, table %s, leader %s, %d NIC(s), %d GPU(s)",
                 self.host_id, self.config.agent.socket, self.config.agent.decision_table,
                 self.link.address, len(self.nics), self.gpus)

    async def stop(self) -> None:
        if isinstance(self.probing, SweepProbing):
            await self.probing.stop()
        await self.server.stop()
        await self.link.stop()
        if isinstance(self.measurement, LiveMeasurement):
            self.measurement.stop()
        self._save()
        self.registry.close()
        self.table.close()  # the file stays: shims keep the last decisions

    def reload(self, config: Config) -> None:
        self.config = config
        self.link.interval_s = config.agent.report_interval_s
        if isinstance(self.measurement, StaticMeasurement):
            self.measurement = StaticMeasurement(config.agent.accept_job_hints)

    # --- state ---------------------------------------------------------------
    def local_jobs(self) -> list[LocalJob]:
        jobs = self.registry.jobs()
        live = self.measurement if isinstance(self.measurement, LiveMeasurement) else None
        if live is not None:
            live.forget({j.job_id for j in jobs})
        return [replace(job, measurement=self.measurement.measure(
            job, self.registry.hints(job.job_id)),
            request_profiling=live is not None and live.wants_profile(job.job_id))
            for job in jobs]

    def inventory(self) -> HostInventory:
        return HostInventory(self.host_id, __version__, self.gpus, self.nics,
                             self.measurement.name, self.probing.name)

    def report(self) -> AgentReport:
        links = self.measurement.links() if isinstance(self.measurement, LiveMeasurement) \
            else ()
        return AgentReport(self.inventory(), tuple(self.local_jobs()), self.probing.paths(),
                           links, self.table.header().plan_generation)

    def apply_plan(self, hp: HostPlan) -> None:
        check_host_plan(hp, self.host_id)
        changed = self.table.apply(plan_decisions(hp), hp.generation)
        self.plans_applied += 1
        if isinstance(self.probing, SweepProbing):
            self.probing.plan_changed(hp)
        if isinstance(self.measurement, LiveMeasurement):
            self.measurement.plan_changed(hp)
        self.link.poke()  # tell the leader which generation the table holds
        LOG.info("plan %d applied: %d job(s), %d table entr%s changed", hp.generation,
                 len(hp.jobs), changed, "y" if changed == 1 else "ies")

    def _job_changed(self, job_id: str, what: str) -> None:
        LOG.info("job %s %s", job_id, what)
        if what in ("deregistered", "exited"):
            self.table.remove_job(job_id)  # at once: do not wait for the next plan
        if not self._restoring:
            self._save()
        self.link.poke()

    # --- state across restarts -------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.config.state_dir / "agent-state.json"

    def _save(self) -> None:
        doc = {"format": STATE_FORMAT, "jobs": [
            {"job": to_dict(job), "hints": to_dict(hints), "owners": owners}
            for job, hints, owners in self.registry.snapshot()]}
        try:
            write_atomic(self.state_file, doc)
        except OSError as exc:
            LOG.error("cannot save agent state to %s: %s", self.state_file, exc.strerror)

    def _restore(self) -> None:
        """Jobs registered before a restart whose processes still run keep their place
        (crux-run registers once, so without this a restart would lose them)."""
        try:
            doc = json.loads(self.state_file.read_text())
            saved = [(from_dict(LocalJob, e["job"]), from_dict(Measurement, e["hints"]),
                      [(int(p), None if s is None else int(s)) for p, s in e["owners"]])
                     for e in doc["jobs"]] if doc.get("format") == STATE_FORMAT else []
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            LOG.error("agent state %s unreadable (%s); starting with no jobs",
                      self.state_file, exc)
            return
        self._restoring = True
        try:
            for job, hints, owners in saved:
                if self.registry.adopt(job, hints, owners):
                    LOG.info("job %s kept across the restart", job.job_id)
                else:
                    self.table.remove_job(job.job_id)  # ended while the agent was down
        finally:
            self._restoring = False
        self._save()

    # --- local socket ----------------------------------------------------------
    async def handle(self, req: apb.LocalRequest, cred: PeerCred) -> apb.LocalReply:
        kind = req.WhichOneof("body")
        reply = apb.LocalReply(schema=cpb.SCHEMA_REVISION_CURRENT)
        if kind == "register":
            return self._register(req.register, cred)
        if kind == "deregister":
            jid = req.deregister.job_id
            if jid not in self.registry:
                return _error(NOT_FOUND, f"no job {jid!r} on this host")
            owners = self.registry.owners(jid)
            if cred.pid not in owners and cred.uid != 0:
                return _error(PERMISSION_DENIED, f"job {jid!r} belongs to pid(s) "
                              f"{', '.join(map(str, owners))}")
            self.registry.deregister(jid, cred.pid if cred.pid in owners else None)
            reply.ok = True
        elif kind == "status":
            await self._status(reply.status, req.status.local_only)
        elif kind == "jobs":
            reply.jobs.jobs.extend(convert.local_job_to_pb(j) for j in self.local_jobs())
        elif kind == "hints":
            doc, err, code = await self.link.hints(req.hints.format)
            if doc is None:
                return _error(INVALID_ARGUMENT if code == "INVALID_ARGUMENT" else UNAVAILABLE,
                              f"leader {self.link.address}: {err}")
            reply.hints.CopyFrom(doc)
        elif kind == "plan":
            doc, err = await self.link.plan_document()
            if doc is None:
                return _error(UNAVAILABLE, f"leader {self.link.address}: {err}")
            reply.plan.CopyFrom(doc)
        else:
            return _error(INVALID_ARGUMENT, "empty or unknown request")
        return reply

    def _register(self, r: apb.RegisterJob, cred: PeerCred) -> apb.LocalReply:
        job = LocalJob(r.job_id, r.gpus, r.node_rank, r.nnodes or 1, command=r.command[:256])
        try:
            check_local_job(job)
            hints = convert.measurement_from_pb(r.hints)
            check_local_job(LocalJob(r.job_id, r.gpus, measurement=hints), "job")
        except InvalidMessage as exc:
            self.rejected += 1
            return _error(INVALID_ARGUMENT, str(exc))
        try:
            self.registry.register(job, hints, cred.pid)
        except ProcessLookupError:
            return _error(INVALID_ARGUMENT, f"process {cred.pid} exited before registering")
        return apb.LocalReply(schema=cpb.SCHEMA_REVISION_CURRENT, registered=apb.RegisterReply(
            job_id=job.job_id, decision_table=str(self.config.agent.decision_table)))

    async def _status(self, out: apb.StatusReply, local_only: bool) -> None:
        a = out.agent
        a.host_id, a.version, a.leader_address = self.host_id, __version__, self.link.address
        a.decision_table = str(self.config.agent.decision_table)
        a.applied_generation = self.table.header().plan_generation
        a.measurement_source, a.probing_source = self.measurement.name, self.probing.name
        a.jobs.extend(convert.local_job_to_pb(j) for j in self.local_jobs())
        a.peers.extend(convert.peer_paths_to_pb(t) for t in self.probing.paths())
        overrides = self.dataplane.tc_overrides()  # one sysfs scan serves both fields
        a.qps.extend(self.dataplane.qp_status(overrides))
        a.sock_connects.extend(self.dataplane.sock_status())
        a.nic_tc_overrides.extend(overrides)
        a.pcie_links = self.dataplane.pcie_links
        seen = self.link.last_plan_mono
        a.last_plan_age_s = -1.0 if seen is None else time.monotonic() - seen
        if local_only:
            a.leader_reachable = self.link.reachable
            a.leader_error = self.link.last_error
            return
        cluster, err = await self.link.cluster_status()
        a.leader_reachable = cluster is not None
        a.leader_error = err
        if cluster is not None:
            out.cluster.CopyFrom(cluster)
