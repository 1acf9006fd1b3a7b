"""Tables for `cruxctl status`, `jobs` and `plan --live` (people; scripts use --json)."""

from __future__ import annotations

import math
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from cruxd.cli import status_narrow
from cruxd.cli.status_cells import age as _age
from cruxd.cli.status_cells import fabric_levels, source_tag
from cruxd.cli.status_cells import heard as _heard
from cruxd.cli.status_cells import num as _num
from cruxd.cli.status_cells import routes as _routes
from cruxd.cli.status_cells import state as _state

# ClusterStatus.path_selection ([leader] path_selection), for people
PATHS = {"crux": "steered by crux (probed source ports onto planned paths) and DSCP",
         "fabric": "left to the fabric (adaptive routing); crux sets levels/DSCP only"}


def print_status(console: Console, agent: Any, cluster: Any, now: float) -> None:
    if agent is not None:
        reach = "reachable" if agent.leader_reachable else f"UNREACHABLE ({agent.leader_error})"
        console.print(f"[bold]agent[/] {agent.host_id} v{agent.version}: leader "
                      f"{agent.leader_address} {reach}; decision table {agent.decision_table} "
                      f"at plan {agent.applied_generation} (last plan "
                      f"{_age(agent.last_plan_age_s)} ago)")
        console.print(f"  measurement: {agent.measurement_source}; probing: "
                      f"{agent.probing_source}; local jobs: {len(agent.jobs)}")
        if agent.peers and cluster is None:  # the leader's table shows them otherwise
            console.print(_peers([(agent.host_id, agent.peers)], now))
        if agent.qps:
            console.print(_qps(agent.qps))
        if agent.sock_connects:
            console.print(_sock_connects(agent.sock_connects))
            for r in agent.sock_connects:
                if r.no_entry:
                    console.print(f"  [yellow]job {r.job_id or '-'}: {r.no_entry} TCP "
                                  "connection(s) unsteered: made before the plan[/] (before "
                                  "the job's first decision reached the table; they keep the "
                                  "kernel's path and class until the job reconnects)")
        if agent.nccl_profilers:
            console.print(_nccl_profilers(agent.nccl_profilers))
        if cluster is None:  # the leader's view says it otherwise, for every host
            for j in agent.jobs:
                if j.tcp_ports_busy:
                    console.print(_ports_busy(j.job_id, j.tcp_ports_busy))
        if agent.terms_refused:
            console.print(f"  [yellow]{agent.terms_refused} plan stream(s) refused: their "
                          "leader's term is not the one etcd records[/] (the table kept its "
                          "plan; docs/security.md)")
        if agent.late_first_decisions:
            console.print(f"  [yellow]{agent.late_first_decisions} job(s) got their first "
                          "decision after crux-run's start wait[/] (agent.start_wait_s): they "
                          "started without one, and their start-up connections are unsteered")
        for o in agent.nic_tc_overrides:
            console.print(f"  [red]NIC {o.port} overrides every QP's traffic class with "
                          f"{o.traffic_class}[/] (sysfs tc/traffic_class): decided DSCPs do "
                          "not reach the wire there")
        if agent.pcie_links:
            console.print(f"  PCIe semaphores: {agent.pcie_links} shared link(s)")
            took = [f"{n} {what}" for what, n in (
                ("past the lease", agent.pcie_takeovers.expired),
                ("from stopped processes", agent.pcie_takeovers.stopped),
                ("from foreign pids", agent.pcie_takeovers.foreign),
                ("stale queue slots", agent.pcie_takeovers.stale),
                ("revoked by the agent", agent.pcie_takeovers.revoked)) if n]
            if took:
                console.print(f"  [yellow]PCIe holds taken back: {', '.join(took)}[/] (a job "
                              "held a link too long, stopped, or wrote the semaphore file)")
    if cluster is None:
        if agent is not None and not agent.leader_reachable:
            console.print("[yellow]no cluster view: the leader did not answer; the agent keeps "
                          "applying the last plan[/]")
        return
    planned = cluster.planned_unix_ms / 1000
    console.print(f"[bold]leader[/] {cluster.leader_host} ({cluster.leader_address}) "
                  f"v{cluster.leader_version}: plan {cluster.plan_generation}, "
                  f"{_age(now - planned) if planned else 'never'} ago, latency "
                  f"{cluster.plan_latency_s * 1000:.1f} ms, {cluster.levels} levels, "
                  f"fabric {cluster.topology or '-'}")
    mode = cluster.path_selection or "crux"  # "": a leader from before the key
    console.print(f"  paths: {PATHS.get(mode, mode)}")
    if cluster.fabric_levels:
        console.print(f"  levels: {fabric_levels(cluster)}")
    if cluster.ha_role:
        active = ("" if cluster.ha_role == "active"
                  else f"; active leader: {cluster.active_leader or 'none elected'}")
        console.print(f"  HA: {cluster.ha_role}, term {cluster.term}{active}{_ha_figures(cluster)}")
    for r in cluster.refused_claims:
        console.print(f"[yellow]  job {r.job_id}: the part on {r.host_id} is left out: "
                      f"{r.reason}[/]")
    if cluster.not_publishing:
        console.print(f"[yellow]  not publishing plans: {cluster.not_publishing} (agents keep "
                      "their last plan)[/]")
    if cluster.plan_causes:
        causes = list(cluster.plan_causes)
        more = f" (+{len(causes) - 4} more)" if len(causes) > 4 else ""
        console.print(f"  because: {'; '.join(causes[:4])}{more}")
    if cluster.replans or cluster.plans_unchanged:
        kinds = sorted(cluster.replans.items(), key=lambda kv: (-kv[1], kv[0]))
        console.print(f"  re-plans: {', '.join(f'{k} {n}' for k, n in kinds) or 'none'}; "
                      f"{cluster.plans_unchanged} plan(s) changed no decision")
    narrow = console.width < status_narrow.NARROW
    if narrow:
        status_narrow.agents(console, list(cluster.agents))
    else:
        agents = Table(title="agents", title_justify="left")
        for col in ("host", "version", "heard", "GPUs", "addresses", "measurement",
                    "probing", "applied plan"):
            agents.add_column(col)
        for a in cluster.agents:
            agents.add_row(a.host_id, a.version, _heard(a), str(a.gpus),
                           ", ".join(a.addresses) or "-", a.measurement_source,
                           a.probing_source, str(a.applied_generation))
        console.print(agents)
    probed = [(a.host_id, a.peers) for a in cluster.agents if a.peers]
    if probed:
        console.print(_peers(probed, now))
    if any(a.links for a in cluster.agents):
        console.print(_links(cluster.agents))
    if narrow:
        status_narrow.jobs(console, list(cluster.jobs), mode == "fabric")
    else:
        _jobs_table(console, cluster.jobs, mode == "fabric")
    for j in cluster.jobs:
        if j.tcp_ports_busy:
            console.print(_ports_busy(j.job_id, j.tcp_ports_busy))


def _ha_figures(cluster: Any) -> str:
    """What the failover path did: terms begun from the standby's copy or by decoding
    (the slower takeover), and agents' calls held now for an election."""
    out = ""
    if took := sum(cluster.takeovers.values()):
        out += (f"; took over {took} time(s): {cluster.takeovers.get('copy', 0)} from the "
                f"standby's copy, {cluster.takeovers.get('decoded', 0)} decoded from etcd")
    if cluster.refusals_holding:
        out += f"; holding {cluster.refusals_holding} call(s) of agents that lost their leader"
    return out


def _jobs_table(console: Console, rows: Any, fabric: bool) -> None:
    jobs = Table(title="jobs", title_justify="left")
    for col in ("job", "state", "hosts", "GPUs", "W_j FLOP", "t_j s (from)", "period s", "I_j",
                "k_j", "rank", "level", "DSCP", "paths", "QPs applied", "changes"):
        jobs.add_column(col)
    for j in rows:
        state = _state(j).replace(" (", "\n(", 1)
        qps = f"{j.qps_applied}/{j.qps_total}" if j.qps_total else "no shim report"
        m = j.measurement
        jobs.add_row(j.job_id, state, ",".join(j.hosts), str(j.gpus), _num(m.flops_per_iter),
                     f"{_num(m.comm_s)}\n({source_tag(m.source)})" if m.source else
                     _num(m.comm_s), _num(m.period_s), _num(j.intensity), _num(j.k),
                     str(j.rank), str(j.level), str(j.dscp), _routes(j, fabric), qps,
                     str(j.decision_changes))
    console.print(jobs)


def _ports_busy(job: str, n: int) -> str:
    """The line for a job whose TCP connects found every decided port of a route in use."""
    return (f"  [yellow]job {job}: fell back: ports busy ({n} connects)[/] (every decided TCP "
            "source port of the route was in use, TIME_WAIT included: the kernel picked the "
            "port and ECMP the path; docs/shim.md)")


def _peers(agents: list[tuple[str, Any]], now: float) -> Table:
    """Path discovery per (host, peer): what the last sweep found and what went wrong."""
    t = Table(title="paths", title_justify="left")
    for col in ("host", "peer", "address", "paths", "last probe", "probes", "errors"):
        t.add_column(col)
    for host, peers in agents:
        for p in peers:
            age = _age(now - p.probed_unix_ms / 1000) + " ago" if p.probed_unix_ms else "never"
            err = f"{p.errors}" + (f" ({p.last_error})" if p.last_error else "")
            t.add_row(host, p.peer_host, p.address or "-", str(p.paths), age,
                      str(p.probes_sent), err)
    return t


def _links(agents: list[Any]) -> Table:
    """Each agent's NIC ports over its last report interval (live measurement)."""
    t = Table(title="NIC ports (last report interval)", title_justify="left")
    for col in ("host", "port", "tx utilisation", "congestion events"):
        t.add_column(col)
    for a in agents:
        for lk in a.links:
            t.add_row(a.host_id, lk.link, f"{lk.utilization * 100:.1f} %",
                      str(lk.congestion_events))
    return t


def _qps(qps: list[Any]) -> Table:
    """The shims' QPs: what each got at connect against the decision now."""
    t = Table(title="QPs (from the shims)", title_justify="left")
    for col in ("job", "pid", "QP", "peer", "state", "got port / TC", "decided now",
                "shim said", "TC on the wire"):
        t.add_column(col)
    style = {"applied": "green", "pending": "yellow", "fail-open": "red"}
    for q in sorted(qps, key=lambda q: (q.job_id, q.pid, q.device, q.qpn)):
        got = f"{q.sport or 'NIC'} / {q.traffic_class}"
        want = f"{q.want_sport or 'NIC'} / {q.want_traffic_class}" if q.state != "fail-open" \
            else "-"
        wire = f"{q.wire_traffic_class} ({q.traffic_class_source})"
        if q.traffic_class_source == "nic-override":
            wire = f"[red]{wire}[/]"
        elif q.traffic_class_source == "crux" and q.orig_traffic_class not in (
                0, q.wire_traffic_class):  # the program asked for its own (NCCL_IB_TC)
            wire += f", job asked {q.orig_traffic_class}"
        t.add_row(q.job_id or "-", str(q.pid), f"{q.device}:{q.qpn}", q.peer,
                  f"[{st}]{q.state}[/]" if (st := style.get(q.state)) else q.state or "-",
                  got, want, q.outcome, wire)
    return t


def _nccl_profilers(rows: list[Any]) -> Table:
    t = Table(title="NCCL profiler plugin (t_j from the job's own collectives)",
              title_justify="left")
    for col in ("job", "processes", "API", "comms", "collectives", "events", "refused",
                "chain", "written"):
        t.add_column(col)
    for r in rows:
        chain = r.chain + (f" ({r.chained})" if r.chained else "")
        t.add_row(r.job_id or "-", str(r.processes), f"v{r.api_version}",
                  str(r.communicators) + (f" (+{r.communicators_dropped} unrecorded)"
                                          if r.communicators_dropped else ""),
                  str(r.collectives), str(r.events),
                  f"[yellow]{r.bad_events}[/]" if r.bad_events else "0",
                  f"[red]{chain}[/]" if r.chain == "chain failed" else chain,
                  f"{_age(r.last_write_age_s)} ago")
    return t


def _sock_connects(rows: list[Any]) -> Table:
    """The TCP interposer's counted connects per job: steered, class only, or left alone;
    and the accepted connections it gave their peer's class."""
    t = Table(title="TCP connects (from the socket interposer)", title_justify="left")
    for col in ("job", "processes", "applied", "TOS only", "ports busy", "no job", "no table",
                "bad table", "before plan", "accepts"):
        t.add_column(col)
    for r in sorted(rows, key=lambda r: r.job_id):
        t.add_row(r.job_id or "-", str(r.processes), f"[green]{r.applied}[/]", str(r.tos_only),
                  f"[yellow]{r.ports_busy}[/]" if r.ports_busy else "0",
                  *(f"[red]{n}[/]" if n else "0"
                    for n in (r.no_job, r.no_table, r.bad_table, r.no_entry)),
                  str(r.accepts))
    return t


def print_jobs(console: Console, jobs: list[Any]) -> None:
    t = Table(title="jobs on this host", title_justify="left")
    for col in ("job", "GPUs", "node rank", "W_j/iter", "t_j", "period", "source", "since",
                "command"):
        t.add_column(col)
    now = time.time()
    for j in jobs:
        m = j.measurement
        t.add_row(j.job_id, str(j.gpus), f"{j.node_rank}/{j.nnodes}", _num(m.flops_per_iter),
                  _num(m.comm_s), _num(m.period_s), m.source or "-",
                  _age(now - j.registered_unix_ms / 1000), j.command or "-")
    console.print(t)


def print_live_plan(console: Console, doc: dict[str, Any]) -> None:
    from cruxd.cli.safe_text import safe  # job ids and causes are the jobs' own words

    console.print(f"plan {doc['generation']} on fabric {safe(doc['topology'])}; because: "
                  f"{safe('; '.join(doc['causes'][:4])) or '-'}")
    plan = doc.get("plan")
    if not plan:
        console.print(doc.get("note") or "no job could be planned by the scheduler yet "
                      "(see cruxctl status)")
        return
    t = Table(title=f"jobs ({plan['levels']} levels)", title_justify="left")
    for col in ("rank", "job", "I_j", "k_j", "level", "DSCP"):
        t.add_column(col)
    for j in plan["jobs"]:
        t.add_row(str(j["rank"]), safe(j["job"]), _num(j["intensity"] if j["intensity"] is not None
                                                 else math.inf), _num(j["k"]), str(j["level"]),
                  str(j["dscp"]))
    console.print(t)
