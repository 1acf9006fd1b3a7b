"""Prometheus metrics: counters updated as things happen, the rest read at scrape time
from the leader's and agent's own state (so they can never drift from it).

Names follow Prometheus' conventions, which `promtool check metrics` lints
(tests/test_metrics_promtool.py): base units as suffixes, counters end in `_total`, and no
label a server attaches itself (`job`, `instance`), which would arrive renamed `exported_job`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cruxd import __version__
from cruxd.config.hostport import parse_hostport
from cruxd.control.records import JobState

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from cruxd.agent.core import Agent
    from cruxd.control.host_plans import PublishedPlan
    from cruxd.leader.service import Leader

LOG = logging.getLogger(__name__)


class _StateCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        label = self.m.job_label
        for family in self._families():
            if label:  # the job's id under a second name, for joins (metrics.job_label)
                family.samples = [s._replace(labels={**s.labels, label: s.labels["crux_job"]})
                                  if "crux_job" in s.labels else s for s in family.samples]
            yield family

    def _families(self) -> Iterator[Metric]:
        roles = [r for r, on in (("leader", self.m.leader), ("agent", self.m.agent)) if on]
        info = GaugeMetricFamily("crux_build_info", "crux's version and this daemon's roles "
                                 "(always 1: join on it)", labels=["version", "role"])
        info.add_metric([__version__, "+".join(roles) or "none"], 1.0)
        yield info
        if self.m.leader is not None:
            yield from _leader_metrics(self.m.leader)
        if self.m.agent is not None:
            yield from _agent_metrics(self.m.agent)


# every state a job can be in: each job has one series per state (1 for its own), so a state
# change moves a value instead of starting a series (Prometheus' "state set")
STATES = tuple(s.label for s in JobState if s is not JobState.UNSPECIFIED)


def _leader_metrics(leader: Leader) -> Iterator[Metric]:
    from cruxd.leader.status import ports_busy  # a leader's module: agent-only hosts skip it

    plan = leader.plan
    # I_j = W_j / t_j: FLOP per iteration over seconds of communication per iteration
    intensity = GaugeMetricFamily("crux_job_intensity_flops_per_second",
                                  "GPU intensity I_j (FLOP per second of communication); "
                                  "none for a network-free job (crux_job_network_free)",
                                  labels=["crux_job"])
    free = GaugeMetricFamily("crux_job_network_free", "1 for a job with no traffic between "
                             "hosts (one host: I_j is infinite), else 0", labels=["crux_job"])
    level = GaugeMetricFamily("crux_job_level", "Priority level, 0 lowest", labels=["crux_job"])
    state = GaugeMetricFamily("crux_job_state", "1 for the job's state, 0 for the others",
                              labels=["crux_job", "state"])
    dscp = GaugeMetricFamily("crux_job_dscp", "DSCP the job's traffic carries",
                             labels=["crux_job"])
    paths = GaugeMetricFamily("crux_job_routes", "Routes (a source host toward a peer, each on "
                              "one path) the plan gives the job", labels=["crux_job"])
    for a in plan.jobs if plan else ():
        if math.isfinite(a.intensity):
            intensity.add_metric([a.job_id], a.intensity)
        free.add_metric([a.job_id], 1.0 if math.isinf(a.intensity) else 0.0)
        level.add_metric([a.job_id], a.level)
        for s in STATES:
            state.add_metric([a.job_id, s], 1.0 if a.state.label == s else 0.0)
        dscp.add_metric([a.job_id], a.dscp)
        paths.add_metric([a.job_id], len(a.routes))
    yield from (intensity, free, level, state, dscp, paths)
    yield from _job_figures(leader, {a.job_id for a in plan.jobs} if plan else set())
    publishing = GaugeMetricFamily("crux_leader_publishing", "1 while this leader publishes "
                                   "plans (active, or single, and etcd reachable); a standby "
                                   "is 0 by role", labels=["role"])
    publishing.add_metric([leader.role], 0.0 if leader.role == "standby"
                          or leader.not_publishing else 1.0)
    yield publishing
    yield GaugeMetricFamily("crux_plan_generation", "Current plan generation",
                            value=plan.generation if plan else 0)
    ages = GaugeMetricFamily("crux_agent_report_age_seconds",
                             "Seconds since each agent's last report or the end of its plan "
                             "stream (agents report only on change: high on a quiet, "
                             "connected host)", labels=["host"])
    connected = GaugeMetricFamily("crux_agent_connected",
                                  "1 while the agent's plan stream is open (its liveness)",
                                  labels=["host"])
    now = leader.clock()
    for host, rec in leader.state.agents.items():
        ages.add_metric([host], now - rec.last_report)
        connected.add_metric([host], 1.0 if host in leader.state.streams else 0.0)
    yield ages
    yield connected
    yield GaugeMetricFamily("crux_plan_watchers", "Open plan streams", value=leader.watchers)
    yield _counter_by("crux_leader_plan_streams_opened", "Plan streams opened, by whether "
                      "this leader's view held the agent's latest report (current: the agent "
                      "sends none)", "view", leader.streams_opened)
    yield CounterMetricFamily("crux_leader_refusals_held", "Standby refusals held until the "
                              "election moved (an agent named the leader it lost)",
                              value=leader.refusals_held)
    yield GaugeMetricFamily("crux_leader_refusals_holding", "Agents' calls a standby holds "
                            "now (they lost their leader and asked it; its campaign hurries)",
                            value=leader.refusals_holding)
    yield _counter_by("crux_leader_takeovers", "HA terms this candidate began, by where the "
                      "state came from (copy: the hot standby's; decoded: read from etcd at "
                      "the win)", "source", leader.takeovers)
    yield _counter_by("crux_replans", "Plans that changed some job's decision, by kind of "
                      "cause", "cause", leader.replans.replans)
    yield CounterMetricFamily("crux_plans_unchanged", "Plans published that changed no "
                              "job's decision", value=leader.replans.unchanged)
    yield CounterMetricFamily("crux_job_claims_refused", "Parts of jobs left out: a host "
                              "reported a job id with another user's or job key's claim",
                              value=leader.state.claims_refused_total)
    yield _counter_by("crux_job_decision_changes", "Plans that changed the job's decision "
                      "(not counting its first)", "crux_job", leader.replans.decision_changes)
    yield _counter_by("crux_job_tcp_ports_busy", "TCP connects that got a kernel source port "
                      "because every decided port of their route was in use, summed over the "
                      "job's live agents", "crux_job", ports_busy(leader))


def _counter_by(name: str, documentation: str, label: str,
                counts: Mapping[str, float]) -> CounterMetricFamily:
    """A counter with one series per key of `counts`, labelled `label`, in key order."""
    family = CounterMetricFamily(name, documentation, labels=[label])
    for key, n in sorted(counts.items()):
        family.add_metric([key], n)
    return family


def _job_figures(leader: Leader, planned: set[str]) -> Iterator[Metric]:
    """What the leader plans each job with: W_j, t_j and the period, merged over its hosts."""
    work = GaugeMetricFamily("crux_job_work_flops", "W_j: FLOP per iteration, all hosts",
                             labels=["crux_job"])
    comm = GaugeMetricFamily("crux_job_comm_seconds", "t_j: seconds on the network per "
                             "iteration", labels=["crux_job"])
    period = GaugeMetricFamily("crux_job_period_seconds", "Iteration period",
                               labels=["crux_job"])
    for m in leader.state.merged_jobs():
        if m.job_id not in planned:
            continue
        for family, value in ((work, m.measurement.flops_per_iter),
                              (comm, m.measurement.comm_s), (period, m.measurement.period_s)):
            if value > 0 and math.isfinite(value):  # 0: not measured yet
                family.add_metric([m.job_id], value)
    yield from (work, comm, period)


def _data_plane(agent: Agent) -> Iterator[Metric]:
    """What the job-side libraries applied to the connections of each local job's live
    processes, by outcome, from their records (QP records: the verbs wrapper; sock-<pid>:
    the socket interposer). Gauges: a process that exits takes its counts with it."""
    qps = GaugeMetricFamily("crux_agent_job_qp_connects", "RDMA QP connects the verbs wrapper "
                            "intercepted in the job's live processes, by outcome (applied: "
                            "steered; the rest: left as the job asked)",
                            labels=["crux_job", "outcome"])
    tcp = GaugeMetricFamily("crux_agent_job_tcp_connects", "TCP connects the socket "
                            "interposer counted in the job's live processes, by outcome",
                            labels=["crux_job", "outcome"])
    for family, records in ((qps, agent.dataplane.records()),
                            (tcp, agent.dataplane.sock_records)):
        per_job: dict[tuple[str, str], int] = {}
        for r in records:
            for outcome, n in r.counters.items():
                per_job[(r.job_id, outcome)] = per_job.get((r.job_id, outcome), 0) + n
        for (job, outcome), n in sorted(per_job.items()):
            family.add_metric([job, outcome], n)
    yield from (qps, tcp)


def _agent_metrics(agent: Agent) -> Iterator[Metric]:
    yield from _data_plane(agent)
    yield GaugeMetricFamily("crux_agent_local_jobs", "Jobs registered on this host",
                            value=len(agent.registry.jobs()))
    yield GaugeMetricFamily("crux_agent_leader_reachable",
                            "1 when the last call to the leader succeeded",
                            value=1.0 if agent.link.reachable else 0.0)
    yield GaugeMetricFamily("crux_agent_applied_generation",
                            "Plan generation in the decision table",
                            value=agent.table.header().plan_generation)
    # counts that only grow while the process lives: counters, so rate() works on them
    yield CounterMetricFamily("crux_agent_rpc_errors", "Failed calls to the leader",
                              value=agent.link.rpc_errors)
    yield CounterMetricFamily("crux_agent_reports_skipped",
                              "New plan streams on a leader whose view held this host's "
                              "latest report, so none was sent (a restart, a failover)",
                              value=agent.link.reports_skipped)
    yield CounterMetricFamily("crux_agent_terms_refused", "Plan streams refused because etcd "
                              "did not record their leader term (HA)",
                              value=agent.link.terms_refused)
    yield CounterMetricFamily("crux_agent_rejected",
                              "Local-socket requests refused (permission, bad input)",
                              value=agent.rejected + agent.server.rejected)
    yield CounterMetricFamily("crux_agent_request_timeouts",
                              "Local-socket requests not read or answered in time",
                              value=agent.server.timed_out)
    yield CounterMetricFamily("crux_agent_accept_errors",
                              "Local-socket accepts that failed (EMFILE and the like)",
                              value=agent.server.accept_errors)
    yield CounterMetricFamily("crux_agent_late_first_decisions",
                              "Jobs whose first decision came after crux-run's start wait "
                              "(agent.start_wait_s): started unsteered",
                              value=agent.first.late)
    yield CounterMetricFamily("crux_agent_record_files_skipped",
                              "QP and socket record files refused (hostile or broken)",
                              value=agent.dataplane.skipped_files)
    yield _counter_by("crux_agent_tcp_ports_busy", "TCP connects of a local job that got a "
                      "kernel source port because every decided port of their route was in "
                      "use", "crux_job", agent.dataplane.last_busy)


class Metrics:
    def __init__(self) -> None:
        # no `<name>_created` series beside every counter and histogram: they double the
        # series for a timestamp nobody graphs (a process-wide switch of the library)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        self.job_label = ""  # metrics.job_label
        self.leader: Leader | None = None
        self.agent: Agent | None = None
        self.plans = Counter("crux_plans", "Plans published", registry=self.registry)
        self.plan_latency = Histogram(
            "crux_plan_latency_seconds", "From the first event to the published plan",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry)
        self.rejected = Counter("crux_rpc_rejected", "Messages refused as invalid",
                                ["rpc", "field"], registry=self.registry)
        self.registry.register(_StateCollector(self))
        # the process_* and python_* families every Python exporter offers; this registry is
        # not the library's global one, so they are registered here explicitly
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._server: WSGIServer | None = None
        self.port = 0

    def on_plan(self, plan: PublishedPlan) -> None:
        self.plans.inc()
        self.plan_latency.observe(plan.latency_s)

    def on_reject(self, rpc: str, field: str) -> None:
        self.rejected.labels(rpc, field).inc()

    def serve(self, listen: str | None) -> None:
        if not listen:
            return
        host, port = parse_hostport(listen)
        self._server, _ = start_http_server(port, host, registry=self.registry)
        self.port = self._server.server_port
        LOG.info("metrics on http://%s:%d/metrics", host, self.port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


