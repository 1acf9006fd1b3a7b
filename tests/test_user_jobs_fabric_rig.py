"""An ordinary user's TCP job on the namespace fabric is steered from its very first
connection: crux-run, run as `nobody` in group crux against the host's agent (started as
cruxd.service starts it, tests/rig/system_host.py), waits for the job's first decision, so
the first SYN of iperf3's control connection already leaves from a decided source port with
the decided class; and so does a program that connects the moment it is exec'd (bash's
/dev/tcp, a millisecond or two after exec). Captured on the wire at the peer."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from cruxd.testing import BIN, Daemon, crux_run, status, toml, wait_for
from tests.rig.capture import Tcpdump
from tests.rig.fabric import Fabric
from tests.rig.system_host import NOBODY, RUN, SystemHost, can_run_as
from tests.rig.tcp import can_steer_tcp, iperf3_servers
from tests.test_probing_agents import agent_config
from transport.decision_table import Decision, TableReader

WHY = can_steer_tcp() or can_run_as(NOBODY)
pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(WHY is not None, reason=str(WHY))]
DPORT = 5201
JOB = ("--gpus", "8", "--nnodes", "2", "--flops-per-iter", "1e12", "--compute-s", "1",
       "--allreduce-bytes", "2e9")
KEY = {"CRUX_JOB_KEY": "the-ranks-share-this-key"}  # 24 bytes, the same for every rank


def tcp_ports_to(doc: dict[str, Any], job: str, peer_host: str) -> list[int] | None:
    for j in (doc.get("cluster") or {}).get("jobs", []):
        if j["job_id"] == job:
            for r in j.get("routes", []):
                if r.get("peer_host") == peer_host and r.get("tcp_dport") == DPORT \
                        and r.get("tcp_sports"):
                    return [int(p) for p in r["tcp_sports"]]
    return None


def decision(h: SystemHost, f: Fabric, job: str) -> Decision | None:
    """The job's decision toward h1 in h0's table once it has TCP ports, read while the job
    runs (its entries go with it)."""
    with TableReader(h.path(RUN / "decisions")) as t:
        d = t.lookup(job, f.address("h1"))
    return d if d is not None and d.tcp_sports else None


class Capture(Tcpdump):
    """tcpdump of the SYNs toward DPORT that reach `host` (the peer), read with scapy."""

    def __init__(self, f: Fabric, host: str, path: Path) -> None:
        super().__init__(f, host, path, f"tcp dst port {DPORT} and tcp[tcpflags] & tcp-syn != 0")

    def syns(self, src: str) -> list[tuple[float, int, int]]:
        """(time, source port, TOS) of the jobs' SYNs from `src`, in order: the agents'
        TTL-limited probes arrive with a TTL of 1 or 2 and are left out."""
        from scapy.layers.inet import IP, TCP

        return [(float(p.time), int(p[TCP].sport), int(p[IP].tos)) for p in self.stop()
                if IP in p and p[IP].src == src and p[IP].ttl > 32]


def test_a_users_first_connections_leave_from_decided_ports_in_the_decided_class(
        tmp_path: Path) -> None:
    with Fabric(hosts_per_leaf=1, leaves=2, spines=2) as f, \
            iperf3_servers(f, ["h1"], DPORT), SystemHost() as h:
        cfg = agent_config(f, "h0", tmp_path)
        cfg["probing"]["tcp_dport"] = DPORT
        cfg["daemon"]["host_id"] = "h0"
        (tmp_path / "h0").mkdir()
        config = tmp_path / "h0" / "cruxd.toml"
        config.write_text(toml({**cfg, "metrics": {"listen": ""}}))
        sys_cruxd = h.cruxd(config, tmp_path / "h0" / "cruxd.log", netns=f.ns("h0"),
                            state_dir=tmp_path / "h0" / "state")
        cfg1 = agent_config(f, "h1", tmp_path)
        cfg1["probing"]["tcp_dport"] = DPORT
        h1 = Daemon(tmp_path, "h1", cfg1, netns=f.ns("h1")).start()
        sock = h.path(RUN / "agent.sock")
        anchors: list[subprocess.Popen[bytes]] = []
        try:
            h1.wait_log("agent h1")
            wait_for("h0's agent", lambda: sock.is_socket() and sys_cruxd.poll() is None)
            # an earlier job between the two hosts: the agent has probed h1's port by now,
            # as it has on a host that has run jobs before
            anchors += [crux_run(sock, "warm", *JOB, "--node-rank", "0"),
                        crux_run(h1.socket, "warm", *JOB, "--node-rank", "1")]
            wait_for("TCP ports toward h1", lambda: tcp_ports_to(status(sock), "warm", "h1"),
                     timeout=90)
            # h1's rank runs as root, h0's as nobody: uids that say nothing across hosts,
            # so the job's ranks share a key, as a launcher gives them (job_claims.py)
            anchors += [crux_run(h1.socket, job, *JOB, "--node-rank", "1", env=KEY)
                        for job in ("user", "quick")]
            cap = Capture(f, "h1", tmp_path / "syn.pcap")
            iperf = h.as_user([str(BIN / "crux-run"), "--job-id", "user", *JOB,
                               "--node-rank", "0", "--", "iperf3", "-c", f.address("h1"),
                               "-p", str(DPORT), "-t", "1"], in_group=True, netns=f.ns("h0"),
                              env=KEY)
            decided = {"user": wait_for("user's decision", lambda: decision(h, f, "user"))}
            assert decided["user"] is not None
            out, err = iperf.communicate(timeout=60)
            assert iperf.returncode == 0, err + out
            assert "warning" not in err, err
            iperf_syns = cap.syns(f.address("h0"))
            cap = Capture(f, "h1", tmp_path / "syn2.pcap")
            # connects the moment it starts; prints when it started (after exec)
            quick = h.as_user([str(BIN / "crux-run"), "--job-id", "quick", *JOB,
                               "--node-rank", "0", "--", "bash", "-c",
                               f"date +%s.%N; exec 3<>/dev/tcp/{f.address('h1')}/{DPORT}; sleep 2"],
                              in_group=True, netns=f.ns("h0"), env=KEY)
            decided["quick"] = wait_for("quick's decision", lambda: decision(h, f, "quick"))
            qout, qerr = quick.communicate(timeout=60)
            assert quick.returncode == 0, qerr
            assert "warning" not in qerr, qerr
            quick_syns = cap.syns(f.address("h0"))
        finally:
            for a in anchors:
                a.kill()
                a.wait()
            sys_cruxd.terminate()
            sys_cruxd.wait(20)
            h1.stop()

    started = float(qout.split()[0])
    print(f"iperf3 SYNs (time, port, TOS): {iperf_syns}; quick: {quick_syns}, first SYN "
          f"{(quick_syns[0][0] - started) * 1e3:.1f} ms after its exec")
    for job, syns in (("user", iperf_syns), ("quick", quick_syns)):
        d = decided[job]
        assert d is not None and d.tcp_dport == DPORT and d.tcp_sports, (job, d)
        # iperf3: the control connection, then the data stream; quick: its one connect
        assert len({port for _, port, _ in syns}) >= (2 if job == "user" else 1), syns
        for _, port, tos in syns:  # every SYN, the very first one included
            assert port in d.tcp_sports, (job, port, d.tcp_sports)
            assert tos == d.traffic_class, (job, tos, d.traffic_class)
