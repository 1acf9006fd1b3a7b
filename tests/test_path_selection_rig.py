"""[leader] path_selection = "fabric" on the namespace fabric: real cruxd agents (one of them
the leader) that would sweep their jobs' peers over UDP and TCP, a TCP job (iperf3 under
crux-run, the socket interposer preloaded) between two leaves. Captured at the peer: every
SYN of the job carries its level's DSCP and leaves from the port the kernel chose (the one
iperf3 itself reports, inside the kernel's ephemeral range, below crux's probe range), and
no probe leaves the agents; their status says so, and so does cruxctl status."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cruxd.testing import BIN, Daemon, crux_run, cruxctl, running, status, wait_for
from tests.rig.capture import Tcpdump
from tests.rig.fabric import Fabric
from tests.rig.tcp import can_steer_tcp, iperf3_servers, tcp_sweep_from
from tests.test_probing_agents import agent_config
from transport.decision_table import TableReader
from transport.roce import ROCE_DPORT

WHY = can_steer_tcp()
pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(WHY is not None, reason=str(WHY))]
DPORT = 5201
DSCP = [10, 18, 26, 34]  # none is 0, the kernel's own class
JOB = ("--gpus", "8", "--nnodes", "2", "--flops-per-iter", "1e12", "--compute-s", "1",
       "--allreduce-bytes", "2e9")
PROBE_TTL = 32  # probes arrive with the TTL left of a hop-limited one; the job's with ~60


class Capture(Tcpdump):
    """tcpdump at `host` of what `src` sends toward DPORT/tcp or the probes' UDP port."""

    def __init__(self, f: Fabric, host: str, src: str, path: Path) -> None:
        super().__init__(f, host, path,
                         f"src host {src} and ((tcp dst port {DPORT} and "
                         f"tcp[tcpflags] & tcp-syn != 0) or udp dst port {ROCE_DPORT})")

    def packets(self) -> list[tuple[str, int, int, int]]:
        """(protocol, source port, TOS, TTL) of each packet, in order."""
        from scapy.layers.inet import IP, TCP, UDP

        return [("tcp" if TCP in p else "udp", int(p[TCP if TCP in p else UDP].sport),
                 int(p[IP].tos), int(p[IP].ttl))
                for p in self.stop() if IP in p and (TCP in p or UDP in p)]


def job_decided(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The job once scheduled on both hosts, as the leader shows it."""
    for j in (doc.get("cluster") or {}).get("jobs", []):
        if j["job_id"] == "job" and j.get("state") == "scheduled" \
                and len(j.get("hosts", [])) == 2:
            return j
    return None


def test_the_fabric_routes_crux_sets_the_class_and_leaves_ports_and_paths_alone(
        tmp_path: Path) -> None:
    with Fabric(hosts_per_leaf=1, leaves=2, spines=2) as f, iperf3_servers(f, ["h1"], DPORT):
        h0, h1 = f.address("h0"), f.address("h1")
        daemons = []
        for h in ("h0", "h1"):
            cfg = agent_config(f, h, tmp_path)  # probing = "sweep", as on an ECMP fabric
            cfg["probing"]["tcp_dport"] = DPORT
            if h == "h0":
                cfg["leader"].update(path_selection="fabric", dscp=DSCP)
            daemons.append(Daemon(tmp_path, h, cfg, netns=f.ns(h)))
        sock = {d.name: d.socket for d in daemons}
        cap = Capture(f, "h1", h0, tmp_path / "h0.pcap")  # from before the agents start
        with running(daemons, "agent h") as anchors:
            anchors += [crux_run(sock["h0"], "job", *JOB, "--node-rank", "0"),
                        crux_run(sock["h1"], "job", *JOB, "--node-rank", "1")]
            job = wait_for("the job scheduled", lambda: job_decided(status(sock["h0"])))
            with TableReader(daemons[0].table) as t:
                entry = wait_for("its entry toward h1", lambda: t.lookup("job", h1))
            env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
            iperf = subprocess.run(
                ["ip", "netns", "exec", f.ns("h0"), str(BIN / "crux-run"), "--socket",
                 str(sock["h0"]), "--job-id", "job", *JOB, "--node-rank", "0", "--",
                 "iperf3", "-c", h1, "-p", str(DPORT), "-t", "1", "--json"],
                capture_output=True, text=True, timeout=60, env={**env, "CRUX_SHIM_LOG": "1"})
            assert iperf.returncode == 0, iperf.stderr + iperf.stdout[-2000:]
            time.sleep(1.0)  # a sweep of h1 starts at once when peers are known: time for one
            doc = status(sock["h0"])
            text = cruxctl("status", socket_path=sock["h0"])
            agents = {d.name: status(d.socket)["agent"] for d in daemons}
            logs = {d.name: d.log_text() for d in daemons}
            lo, hi = map(int, f.exec("h0", "cat", "/proc/sys/net/ipv4/ip_local_port_range"
                                     ).stdout.split())
        packets = cap.packets()

        # the capture would have seen probes: a TCP sweep like the agents' shows up in it
        control = Capture(f, "h1", h0, tmp_path / "control.pcap")
        tcp_sweep_from(f, "h0", "h1", DPORT, expected=2, max_probes=64)
        probes_seen = [p for p in control.packets() if p[3] <= PROBE_TTL]

    cluster = doc["cluster"]
    print(f"job: level {job['level']} DSCP {job['dscp']}; entry {entry}; captured {packets}; "
          f"control probes {len(probes_seen)}")
    # the leader: the mode, levels and DSCP decided, no port, no path
    assert cluster["path_selection"] == "fabric"
    assert int(job.get("dscp", 0)) == DSCP[int(job.get("level", 0))]
    for r in job["routes"]:
        assert not r.get("sport") and not r.get("tcp_sports") and not r.get("hops"), r
    assert "paths: left to the fabric (adaptive routing); crux sets levels/DSCP only" \
        in text.stdout, text.stdout + text.stderr
    # the table: the class, and port 0 / no TCP ports ("leave the kernel's port")
    assert entry is not None and entry.dscp == int(job.get("dscp", 0))
    assert (entry.sport, entry.tcp_dport, entry.tcp_sports) == (0, 0, ())

    # the wire: the job's SYNs (control connection and data stream) in the decided class,
    # from the ports the kernel picked from its ephemeral range (below crux's TCP probe
    # range), the data stream's being the one iperf3's own socket reports
    result = json.loads(iperf.stdout)
    reported = {int(c["local_port"]) for c in result["start"]["connected"]}
    syns = [(port, tos) for proto, port, tos, ttl in packets
            if proto == "tcp" and ttl > PROBE_TTL]
    ports = {port for port, _ in syns}
    assert len(ports) >= 2 and reported and reported <= ports, (syns, reported)
    assert all(tos == entry.traffic_class for _, tos in syns), syns
    assert all(lo <= p <= hi and p < 61000 for p in ports), (ports, lo, hi)
    # the interposer's own word: class set, port left alone, for every connect
    said = re.findall(r"crux-sock: .* job 'job': ([\w-]+), sport (\d+), tos (\d+)", iperf.stderr)
    assert said and all(s == ("tos-only", "0", str(entry.traffic_class)) for s in said), \
        iperf.stderr

    # no sweeps: not one probe on the wire, no peer probed, and every agent says why
    assert [p for p in packets if p[3] <= PROBE_TTL or p[0] == "udp"] == []
    assert probes_seen, "the capture misses probes: the check above proves nothing"
    for name, a in agents.items():
        assert not a.get("peers"), (name, a.get("peers"))
        assert a["probing_source"].endswith("idle: the fabric routes"), a["probing_source"]
        assert "swept " not in logs[name]
    assert {a["probing_source"] for a in cluster["agents"]} == \
        {f"sweep (ttl, tcp/{DPORT}), idle: the fabric routes"}
