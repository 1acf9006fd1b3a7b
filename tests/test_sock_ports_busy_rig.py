"""A route's decided TCP ports run out, end to end: real cruxd agents on the namespace fabric
(h0 also the leader) probe h1's listener with TCP SYNs, 2 ports per path; a job process under
crux-run on h0 connects to h1 and closes first, again and again, so that each decided port
it used sits in TIME_WAIT on h0. From the third connect on, every decided port is held: the
interposer lets the kernel pick the port (the connect still succeeds), says so on stderr once
for the route, counts it, and the count reaches the agent, the leader, `cruxctl status`
(cluster and --local views, text and --json) and both Prometheus families."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cruxd.testing import BIN, Daemon, crux_run, cruxctl, running, status, wait_for
from tests.rig.fabric import Fabric
from tests.rig.tcp import can_steer_tcp, tcp_states
from tests.test_probing_agents import agent_config
from transport.decision_table import TableReader

WHY = can_steer_tcp()
pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(WHY is not None, reason=str(WHY))]
DPORT = 5201
CONNECTS = 5  # 2 on the decided ports, then 3 that find both in TIME_WAIT
JOB = ("--gpus", "8", "--nnodes", "2", "--flops-per-iter", "1e12", "--compute-s", "1",
       "--allreduce-bytes", "2e9")

# h1's listener: reads each connection to its end, then closes (the client closed first, so
# the TIME_WAIT stays on the client's side, as with a job that reconnects)
SERVER = """
import socket, sys
srv = socket.create_server(("0.0.0.0", int(sys.argv[1])), backlog=64)
while True:
    c, _ = srv.accept()
    while c.recv(4096):
        pass
    c.close()
"""
# the job: connect, close, CONNECTS times; one source port per line
CLIENT = """
import socket, sys
for _ in range(int(sys.argv[3])):
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
    print(s.getsockname()[1], flush=True)
    s.close()
"""


@contextmanager
def listener(f: Fabric, host: str) -> Iterator[None]:
    p = subprocess.Popen(["ip", "netns", "exec", f.ns(host), sys.executable, "-c", SERVER,
                          str(DPORT)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for("h1's listener", lambda: tcp_states(f, host, "listening", DPORT))
        yield
    finally:
        p.kill()
        p.wait()


def metric(f: Fabric, host: str, port: int, name: str) -> float | None:
    """One sample of the exporter at `host`:`port` (read inside its namespace)."""
    run = f.exec(host, sys.executable, "-c", "import urllib.request, sys; sys.stdout.write("
                 f"urllib.request.urlopen('http://127.0.0.1:{port}/metrics').read().decode())")
    assert run.returncode == 0, run.stderr
    for line in run.stdout.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def job_of(doc: dict[str, Any]) -> dict[str, Any]:
    return next(j for j in doc["cluster"]["jobs"] if j["job_id"] == "job")


def test_a_route_out_of_ports_is_said_once_counted_and_shown(tmp_path: Path) -> None:
    with Fabric(hosts_per_leaf=1, leaves=2, spines=2) as f, listener(f, "h1"):
        h1 = f.address("h1")
        daemons = []
        for h in ("h0", "h1"):
            cfg = agent_config(f, h, tmp_path)
            cfg["probing"].update(tcp_dport=DPORT, tcp_ports_per_path=2)
            if h == "h0":
                cfg["metrics"] = {"listen": "127.0.0.1:0"}
            daemons.append(Daemon(tmp_path, h, cfg, netns=f.ns(h)))
        sock = daemons[0].socket
        with running(daemons, "agent h") as anchors:
            anchors += [crux_run(sock, "job", *JOB, "--node-rank", "0"),
                        crux_run(daemons[1].socket, "job", *JOB, "--node-rank", "1")]
            with TableReader(daemons[0].table) as t:
                entry = wait_for("h0's entry toward h1 with TCP ports",
                                 lambda: (e := t.lookup("job", h1)) and len(e.tcp_sports) == 2
                                 and e, timeout=90)
            decided = set(entry.tcp_sports)
            env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "CRUX_SHIM_LOG")}
            job = subprocess.run(
                ["ip", "netns", "exec", f.ns("h0"), str(BIN / "crux-run"), "--socket",
                 str(sock), "--job-id", "job", *JOB, "--node-rank", "0", "--",
                 sys.executable, "-c", CLIENT, h1, str(DPORT), str(CONNECTS)],
                capture_output=True, text=True, timeout=60, env=env)
            assert job.returncode == 0, job.stderr  # every connect succeeded (fail open)
            held = {int(line.split()[2].rsplit(":", 1)[1]) for line in
                    f.exec("h0", "ss", "-Htn", "state", "time-wait").stdout.splitlines()
                    if line.strip()}
            doc = wait_for("the leader's count", lambda: (d := status(sock)) and job_of(d).get(
                "tcp_ports_busy") == CONNECTS - 2 and d)
            local = status(sock)["agent"]
            text = cruxctl("status", socket_path=sock)
            text_local = cruxctl("status", "--local", socket_path=sock)
            port = int(re.findall(r"metrics on http://127.0.0.1:(\d+)/",
                                  daemons[0].log_text())[0])
            samples = {name: metric(f, "h0", port, f'{name}{{crux_job="job"}}')
                       for name in ("crux_job_tcp_ports_busy_total",
                                    "crux_agent_tcp_ports_busy_total")}

    sports = [int(p) for p in job.stdout.split()]
    print(f"decided {sorted(decided)}, connects from {sports}, time-wait {sorted(held)}")
    # the first two on the decided ports, the rest on the kernel's: both decided ports were
    # still in TIME_WAIT on h0 after the run
    assert set(sports[:2]) == decided and not decided & set(sports[2:]), (sports, decided)
    assert decided <= held, held
    # said once, for the route, naming the ports held, without CRUX_SHIM_LOG
    said = [ln for ln in job.stderr.splitlines() if "ports busy" in ln]
    listed = ",".join(str(p) for p in entry.tcp_sports)
    assert len(said) == 1, job.stderr
    assert f"job 'job' -> {h1} port {DPORT}: ports busy: every decided source port " \
        f"({listed}) is in use, the kernel picks the port" in said[0], said
    # counted: the agent's local job, the leader's view, both exporters' families
    assert job_of(doc)["tcp_ports_busy"] == 3
    assert next(j for j in local["jobs"] if j["job_id"] == "job")["tcp_ports_busy"] == 3
    assert samples == {"crux_job_tcp_ports_busy_total": 3.0,
                       "crux_agent_tcp_ports_busy_total": 3.0}, samples
    # cruxctl status: the cluster view and the local one say it for the job
    for run in (text, text_local):
        flat = " ".join(run.stdout.split())  # rich wraps lines at the terminal's width
        assert run.returncode == 0 and "job job: fell back: ports busy (3 connects)" in flat, \
            run.stdout + run.stderr
