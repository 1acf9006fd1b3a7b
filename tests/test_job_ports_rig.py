"""Two jobs on one host pair, each listening on its own port (issue 33), on the namespace
fabric with two real cruxd agents (h0 also leads): job a declares its port with
`crux-run --tcp-port`, job b's listener runs under crux-run and the agent learns its port
from the interposer's record; no agent has a [probing] tcp_dport, and still each job gets
its own decision in h0's table toward h1, with tcp_dport = its own port and source ports
probed toward that port; its connections, made under crux-run, leave from those ports
(`applied` in the interposer's counters, the sockets' own local ports)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cruxd.testing import BIN, Daemon, crux_run, running, status, wait_for
from tests.rig.fabric import Fabric
from tests.rig.tcp import can_steer_tcp, iperf3_servers
from tests.test_probing_agents import agent_config
from transport.decision_table import Decision, TableReader

WHY = can_steer_tcp()
pytestmark = [pytest.mark.root, pytest.mark.skipif(WHY is not None, reason=str(WHY))]
PORTS = {"a": 5301, "b": 5302}
JOB = ("--gpus", "4", "--nnodes", "2", "--compute-s", "1", "--allreduce-bytes", "2e9")
FLOPS = {"a": "1e13", "b": "1e12"}
CONNECTS = 3
# connects CONNECTS times to argv[1]:argv[2], prints the sockets' local ports, holds them
CONNECTOR = (
    "import socket, sys, time\n"
    "s = [socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)"
    f" for _ in range({CONNECTS})]\n"
    "print(' '.join(str(x.getsockname()[1]) for x in s), flush=True)\n"
    "time.sleep(60)\n")
# listens on argv[1] and holds what it accepts (job b's rank on h1, its port learned)
LISTENER = (
    "import socket, sys\n"
    "s = socket.socket()\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('', int(sys.argv[1])))\n"
    "s.listen(16)\n"
    "held = []\n"
    "while True:\n"
    "    held.append(s.accept()[0])\n")


def entries(table: Path, peer: str) -> dict[str, Decision] | None:
    """Both jobs' decisions toward `peer`, once each has TCP source ports."""
    with TableReader(table) as t:
        got = {job: t.lookup(job, peer) for job in PORTS}
    if all(d is not None and d.tcp_sports for d in got.values()):
        return {job: d for job, d in got.items() if d is not None}
    return None


def sock_rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r.get("job_id", ""): r for r in doc["agent"].get("sock_connects", [])}


def test_two_jobs_on_one_host_pair_are_each_steered_toward_their_own_port(
        tmp_path: Path) -> None:
    with Fabric(hosts_per_leaf=1, leaves=2, spines=2) as f, \
            iperf3_servers(f, ["h1"], PORTS["a"]):
        configs = {h: agent_config(f, h, tmp_path) for h in ("h0", "h1")}
        assert not any("tcp_dport" in c["probing"] for c in configs.values())  # jobs' ports
        daemons = [Daemon(tmp_path, h, c, netns=f.ns(h)) for h, c in configs.items()]
        sock = {d.name: d.socket for d in daemons}
        with running(daemons, "agent h") as procs:
            # the listening side, h1 (rank 1): a declares its port (iperf3 listens there);
            # b declares none, its own listener runs under crux-run, in h1's namespace
            procs.append(crux_run(sock["h1"], "a", *JOB, "--node-rank", "1",
                                  "--flops-per-iter", FLOPS["a"], "--tcp-port",
                                  str(PORTS["a"])))
            procs.append(subprocess.Popen(  # type: ignore[arg-type]
                ["ip", "netns", "exec", f.ns("h1"), str(BIN / "crux-run"), "--socket",
                 str(sock["h1"]), "--job-id", "b", *JOB, "--node-rank", "1",
                 "--flops-per-iter", FLOPS["b"], "--", sys.executable, "-c", LISTENER,
                 str(PORTS["b"])]))
            for job in PORTS:
                procs.append(crux_run(sock["h0"], job, *JOB, "--node-rank", "0",
                                      "--flops-per-iter", FLOPS[job]))
            decided = wait_for("each job's decision toward h1 with TCP ports",
                               lambda: entries(daemons[0].table, f.address("h1")), timeout=90)
            assert decided is not None
            for job, d in decided.items():
                assert d.tcp_dport == PORTS[job], (job, d)
                assert all(61000 <= p <= 65535 for p in d.tcp_sports), d
            # h1's agent reports a's declared port and b's learned one ...
            here = {j["job_id"]: j for j in status(sock["h1"])["agent"]["jobs"]}
            assert {j: here[j].get("tcp_ports") for j in PORTS} == {
                j: [p] for j, p in PORTS.items()}, here
            # ... the leader heard each job's port from h1's agent, and its routes carry it
            jobs = {j["job_id"]: j for j in status(sock["h0"])["cluster"]["jobs"]}
            for job, port in PORTS.items():
                route = next(r for r in jobs[job]["routes"] if r["src_host"] == "h0")
                assert route["tcp_dport"] == port and route["tcp_sports"], route

            # each job's connections, from h0 under crux-run, to its own port at h1
            conns = {job: subprocess.Popen(
                ["ip", "netns", "exec", f.ns("h0"), str(BIN / "crux-run"), "--socket",
                 str(sock["h0"]), "--job-id", job, *JOB, "--node-rank", "0",
                 "--flops-per-iter", FLOPS[job], "--", sys.executable, "-c", CONNECTOR,
                 f.address("h1"), str(port)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for job, port in PORTS.items()}
            procs.extend(conns.values())  # type: ignore[arg-type]
            local = {}
            for job, p in conns.items():
                assert p.stdout is not None
                line = p.stdout.readline()
                assert line, f"{job}: {p.stderr.read() if p.stderr else ''}"
                local[job] = [int(x) for x in line.split()]
            rows = wait_for("both jobs' connects counted", lambda: (
                r if all(int(r.get(j, {}).get("calls", 0)) >= CONNECTS for j in PORTS) else None)
                if (r := sock_rows(status(sock["h0"]))) else None)
            assert rows is not None
            with TableReader(daemons[0].table) as t:  # the decisions the connects took
                now = {job: t.lookup(job, f.address("h1")) for job in PORTS}

    print(f"decisions: { {j: (d.tcp_dport, d.tcp_sports) for j, d in decided.items()} }, "
          f"local ports {local}, counters {json.dumps(rows)}")
    for job in PORTS:
        assert int(rows[job].get("applied", 0)) == CONNECTS, rows[job]
        d = now[job]
        assert d is not None and d.tcp_dport == PORTS[job]
        assert set(local[job]) <= set(d.tcp_sports), (job, local[job], d.tcp_sports)
