"""The /metrics exposition against Prometheus' own linter and naming conventions.

`promtool check metrics` (Debian package `prometheus`, installed by .ci/bootstrap) lints
what a scrape returns: counters end in `_total`, names carry base units. What it does not
check is asserted here too: no label Prometheus attaches itself (`job` would arrive as
`exported_job`), monotonic counts typed as counters, the standard process/python families.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

from cruxd.control.replan_stats import ReplanStats
from cruxd.daemon.exporter import Metrics
from cruxd.testing import Daemon, crux_run, wait_for

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian package `prometheus`; .ci/bootstrap installs it)")


def _promtool(text: str) -> None:
    assert PROMTOOL is not None
    run = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, f"promtool: rc {run.returncode}\n{run.stdout}{run.stderr}"
    assert run.stdout.strip() == "" and run.stderr.strip() == "", run.stdout + run.stderr


def _types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def _stand_ins(metrics: Metrics) -> None:
    """A leader and an agent with every figure the exporter reads, one job measured."""
    job = SimpleNamespace(job_id="GPU_Job-1", intensity=2.5e14, level=3, dscp=26,
                          routes=("a", "b"), state=SimpleNamespace(label="scheduled"))
    unmeasured = SimpleNamespace(job_id="j2", intensity=float("inf"), level=0, dscp=8,
                                 routes=(), state=SimpleNamespace(label="unmeasured"))
    figures = SimpleNamespace(flops_per_iter=3.0e13, comm_s=0.12, period_s=0.5)
    metrics.leader = SimpleNamespace(  # type: ignore[assignment]
        plan=SimpleNamespace(jobs=[job, unmeasured], generation=7), clock=lambda: 100.0,
        state=SimpleNamespace(
            agents={"h0": SimpleNamespace(last_report=98.5)}, streams={"h0": 1},
            claims_refused_total=2,
            merged_jobs=lambda: [SimpleNamespace(job_id="GPU_Job-1", measurement=figures),
                                 SimpleNamespace(job_id="j2", measurement=SimpleNamespace(
                                     flops_per_iter=0.0, comm_s=0.0, period_s=0.0))],
            live_agents=lambda: {"h0": SimpleNamespace(jobs={"j": SimpleNamespace(
                job_id="GPU_Job-1", tcp_ports_busy=9)})}),
        watchers=2, role="active", not_publishing="",
        streams_opened={"current": 9, "stale": 2}, refusals_held=3, refusals_holding=2,
        takeovers={"copy": 1, "decoded": 0},
        replans=ReplanStats(Counter({"job arrived": 2, "measurement changed": 1}), 3,
                            {"GPU_Job-1": 1}))
    metrics.agent = SimpleNamespace(  # type: ignore[assignment]
        registry=SimpleNamespace(jobs=lambda: [job]),
        link=SimpleNamespace(reachable=True, rpc_errors=4, terms_refused=1,
                             reports_skipped=11),
        table=SimpleNamespace(header=lambda: SimpleNamespace(plan_generation=7)),
        rejected=1, server=SimpleNamespace(rejected=2, timed_out=5, accept_errors=6),
        dataplane=SimpleNamespace(
            skipped_files=7, last_busy={"GPU_Job-1": 4},
            records=lambda: [SimpleNamespace(job_id="GPU_Job-1", counters={"applied": 6,
                                                                           "no-entry": 2}),
                             SimpleNamespace(job_id="GPU_Job-1", counters={"applied": 4,
                                                                           "no-entry": 0})],
            sock_records=[SimpleNamespace(job_id="j2", counters={"applied": 0,
                                                                 "no-table": 3})]),
        first=SimpleNamespace(late=8))


def _rendered() -> str:
    m = Metrics()
    _stand_ins(m)
    m.on_reject("Report", "jobs[0].gpus")
    return generate_latest(m.registry).decode()


def test_names_labels_and_types_follow_prometheus_conventions() -> None:
    text = _rendered()
    types = _types(text)
    assert types["crux_agent_rpc_errors_total"] == "counter"
    assert types["crux_agent_rejected_total"] == "counter"
    assert "crux_agent_rpc_errors_total 4.0" in text
    assert "crux_agent_terms_refused_total 1.0" in text
    # the failover's figures (docs/control-plane.md, "A held refusal")
    assert "crux_agent_reports_skipped_total 11.0" in text
    assert 'crux_leader_plan_streams_opened_total{view="current"} 9.0' in text
    assert 'crux_leader_plan_streams_opened_total{view="stale"} 2.0' in text
    assert "crux_leader_refusals_held_total 3.0" in text
    assert "crux_leader_refusals_holding 2.0" in text
    assert 'crux_leader_takeovers_total{source="copy"} 1.0' in text
    assert types["crux_leader_takeovers_total"] == "counter"
    assert 'crux_agent_connected{host="h0"} 1.0' in text
    assert "crux_agent_rejected_total 3.0" in text
    for name, value in (("crux_agent_request_timeouts_total", 5.0),
                        ("crux_agent_accept_errors_total", 6.0),
                        ("crux_agent_record_files_skipped_total", 7.0),
                        ("crux_agent_late_first_decisions_total", 8.0)):
        assert types[name] == "counter" and f"{name} {value}" in text
    assert types["crux_job_intensity_flops_per_second"] == "gauge"
    for name, value in (("crux_job_tcp_ports_busy_total", 9.0),
                        ("crux_agent_tcp_ports_busy_total", 4.0)):
        assert types[name] == "counter" and f'{name}{{crux_job="GPU_Job-1"}} {value}' in text
    assert 'crux_job_intensity_flops_per_second{crux_job="GPU_Job-1"} 2.5e+14' in text
    # stable label sets: the level alone, the state as a state set (every state, one at 1)
    assert 'crux_job_level{crux_job="j2"} 0.0' in text
    assert 'crux_job_state{crux_job="j2",state="unmeasured"} 1.0' in text
    assert 'crux_job_state{crux_job="j2",state="scheduled"} 0.0' in text
    assert len(re.findall(r'^crux_job_state\{crux_job="GPU_Job-1"', text, re.M)) == 5
    # a network-free job (I_j infinite) says so instead of having no series
    assert 'crux_job_network_free{crux_job="j2"} 1.0' in text
    assert 'crux_job_network_free{crux_job="GPU_Job-1"} 0.0' in text
    assert 'crux_job_intensity_flops_per_second{crux_job="j2"}' not in text
    for line in ('crux_job_dscp{crux_job="GPU_Job-1"} 26.0',
                 'crux_job_routes{crux_job="GPU_Job-1"} 2.0',
                 'crux_job_work_flops{crux_job="GPU_Job-1"} 3e+13',
                 'crux_job_comm_seconds{crux_job="GPU_Job-1"} 0.12',
                 'crux_job_period_seconds{crux_job="GPU_Job-1"} 0.5'):
        assert line in text, line
    assert 'crux_job_comm_seconds{crux_job="j2"}' not in text  # not measured: no figure
    assert re.search(r'^crux_build_info\{role="leader\+agent",version="[^"]+"\} 1.0$', text,
                     re.M), "build info"
    assert "_created" not in text
    assert 'crux_leader_publishing{role="active"} 1.0' in text
    # what the job-side libraries applied, per job and outcome, over its live processes
    assert 'crux_agent_job_qp_connects{crux_job="GPU_Job-1",outcome="applied"} 10.0' in text
    assert 'crux_agent_job_qp_connects{crux_job="GPU_Job-1",outcome="no-entry"} 2.0' in text
    assert 'crux_agent_job_tcp_connects{crux_job="j2",outcome="no-table"} 3.0' in text
    assert "crux_job_intensity{" not in text, "the intensity carries its unit"
    assert types["crux_replans_total"] == "counter"
    assert 'crux_replans_total{cause="job arrived"} 2.0' in text
    assert "crux_plans_unchanged_total 3.0" in text
    assert "crux_job_claims_refused_total 2.0" in text
    assert 'crux_job_decision_changes_total{crux_job="GPU_Job-1"} 1.0' in text
    # `job` and `instance` are the target labels Prometheus adds to every series
    labels = {name for line in text.splitlines() if not line.startswith("#")
              for name in re.findall(r'[{,](\w+)="', line)}
    assert not labels & {"job", "instance"}, labels
    for family in ("process_cpu_seconds_total", "process_resident_memory_bytes",
                   "python_info", "python_gc_collections_total"):
        assert re.search(rf"^{family}\b", text, re.M), f"{family} missing"


def test_a_second_job_label_for_joins_with_dcgm() -> None:
    m = Metrics()
    _stand_ins(m)
    m.job_label = "hpc_job"
    text = generate_latest(m.registry).decode()
    assert 'crux_job_level{crux_job="GPU_Job-1",hpc_job="GPU_Job-1"} 3.0' in text
    assert ('crux_agent_job_qp_connects{crux_job="GPU_Job-1",hpc_job="GPU_Job-1",'
            'outcome="applied"} 10.0') in text
    assert "crux_plan_generation 7.0" in text  # series without a job are left as they are
    if PROMTOOL is not None:
        _promtool(text)


@needs_promtool
def test_promtool_accepts_the_rendered_registry() -> None:
    _promtool(_rendered())


@needs_promtool
@pytest.mark.slow
def test_promtool_accepts_a_live_daemons_metrics(tmp_path: Path) -> None:
    d = Daemon(tmp_path, "h0", {
        "leader": {"listen": "127.0.0.1:0", "profiling_s": 0, "debounce_ms": 10},
        "agent": {"addresses": ["10.1.0.1"], "gpus": 8, "report_interval_s": 0.5},
        "metrics": {"listen": "127.0.0.1:0"}})
    d.start()
    job = None
    try:
        text = d.wait_log("metrics on http://")
        port = re.search(r"metrics on http://127\.0\.0\.1:(\d+)", text)
        assert port, text
        url = f"http://127.0.0.1:{port.group(1)}/metrics"
        job = crux_run(d.socket, "demo", "--gpus", "8", "--flops-per-iter", "1e15")

        def scraped() -> str | None:
            body = urllib.request.urlopen(url, timeout=5).read().decode()
            return body if 'crux_job_level{crux_job="demo"' in body else None
        body = wait_for("the job in /metrics", scraped)
        _promtool(body)
        assert _types(body)["crux_agent_rpc_errors_total"] == "counter"
        assert re.search(r"^process_cpu_seconds_total ", body, re.M)
    finally:
        if job is not None:
            job.kill()
            job.wait()
        assert d.stop() == 0, d.log_text()[-2000:]


@needs_promtool
def test_the_alert_rules_load_and_fire_as_their_unit_tests_say() -> None:
    """examples/prometheus/crux-alerts.yml: promtool's own check, and its unit tests
    (crux-alerts.test.yml: a leader that stops publishing, an agent stuck behind, a job whose
    QPs got nothing applied, ...) against the metric names the exporter renders."""
    assert PROMTOOL is not None
    rules = Path(__file__).resolve().parent.parent / "examples" / "prometheus"
    for args in (["check", "rules", "crux-alerts.yml"], ["test", "rules", "crux-alerts.test.yml"]):
        run = subprocess.run([PROMTOOL, *args], cwd=rules, capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr
    # every metric the rules use is one the exporter renders
    text = _rendered()
    used = set(re.findall(r"\b(crux_[a-z_]+)\b", (rules / "crux-alerts.yml").read_text()))
    used -= {"crux_job"}  # the label
    rendered = set(re.findall(r"^(crux_[a-z_]+)", text, re.M))
    assert used <= rendered, used - rendered
