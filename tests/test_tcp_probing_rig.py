"""The TCP TTL prober on the namespace Clos (kernel ECMP): toward a real listener
(iperf3 -s) it finds both spines, a real TCP connection from a probed port crosses the
spine the probe named, the listener keeps no half-open connection even when our kernel's
RSTs are dropped, and a port a live connection holds is re-verified without a SYN ever
reaching the peer."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from cruxd.testing import wait_for
from tests.rig.fabric import MAX_SPINES, Fabric, can_build
from tests.rig.probe import spine_of
from tests.rig.tcp import (
    can_listen,
    iperf3_servers,
    tcp_states,
    tcp_sweep_from,
    tcp_trace_from,
)

WHY = can_build() or can_listen()
pytestmark = [pytest.mark.root, pytest.mark.skipif(WHY is not None, reason=str(WHY))]
DPORT = 5201

# h0's output chain: its kernel's RSTs (sent from no user's socket) are dropped, the
# prober's own (a root process's raw socket) pass; KILL_RST drops both
KEEP_OURS = ("tcp flags & rst == rst meta skuid 0 accept\n"
             "    tcp flags & rst == rst drop")
KILL_RST = "tcp flags & rst == rst drop"


def nft(f: Fabric, host: str, table: str, hook: str, rules: str) -> None:
    script = (f"table ip {table} {{\n  chain c {{\n    type filter hook {hook} priority 0; "
              f"policy accept;\n    {rules}\n  }}\n}}\n")
    run = subprocess.run(["ip", "netns", "exec", f.ns(host), "nft", "-f", "-"], input=script,
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr


def nft_drop(f: Fabric, host: str, table: str) -> None:
    f.exec(host, "nft", "delete", "table", "ip", table)


def test_tcp_sweep_finds_both_spines_and_a_connection_takes_the_probed_one() -> None:
    with Fabric(hosts_per_leaf=1, leaves=2, spines=2) as f, \
            iperf3_servers(f, ["h1"], DPORT), iperf3_servers(f, ["h1"], DPORT + 1):
        # unrelated TCP during the sweep (h1 -> h0 from port 5202, iperf3 -R): the socket
        # filter keeps it from the prober, which sees nothing to ignore
        noise = subprocess.Popen(["ip", "netns", "exec", f.ns("h0"), "iperf3", "-c",
                                  f.address("h1"), "-p", str(DPORT + 1), "-R", "-t", "30"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for("iperf3 -R running", lambda: tcp_states(f, "h1", "established", DPORT + 1))
            doc = tcp_sweep_from(f, "h0", "h1", DPORT, ports_per_path=8)
        finally:
            noise.kill()
            noise.wait()
        print(f"TCP sweep: {doc['probes_sent']} ports, {doc['segments']} SYNs, "
              f"stopped {doc['stopped']}, ignored {doc['ignored']} {doc['reasons']}")
        assert doc["stopped"] == "quiet" and doc["ignored"] == 0, doc
        assert sorted(spine_of(p["hops"][1]) for p in doc["paths"]) == [0, 1]
        for p in doc["paths"]:
            s = spine_of(p["hops"][1])
            assert p["hops"] == ["10.2.0.1", f"10.3.{s}.2", f"10.3.{MAX_SPINES + s}.1"], p
            assert len(p["sports"]) == 8 and all(61000 <= x <= 65535 for x in p["sports"])
        # the peer's listener is left with no half-open connection
        wait_for("no SYN_RECV at h1", lambda: not tcp_states(f, "h1", "syn-recv", DPORT))

        for p in doc["paths"]:
            spine = spine_of(p["hops"][1])
            for port in p["sports"][:2]:
                with f.uplink_counts("h0", "h1", [port], "tcp", DPORT) as read:
                    run = f.exec("h0", "iperf3", "-c", f.address("h1"), "-p", str(DPORT),
                                 "--cport", str(port), "-n", "200K", timeout=60)
                    assert run.returncode == 0, run.stdout + run.stderr
                    delta = read()
                # 200 KB are a few packets on veths (GSO sends up to 64 KB at once), plus
                # the handshake; none of them on the other spine
                assert delta[spine] >= 5 and sum(delta) == delta[spine], (port, p, delta)


def test_the_prober_resets_the_listeners_half_open_connections_itself() -> None:
    with Fabric(hosts_per_leaf=1, leaves=2, spines=2) as f, iperf3_servers(f, ["h1"], DPORT):
        nft(f, "h0", "rst", "output", KEEP_OURS)  # as if a host firewall ate the kernel's
        doc = tcp_sweep_from(f, "h0", "h1", DPORT, expected=2, start=61000)
        assert len(doc["paths"]) == 2 and "reset not sent" not in doc["reasons"], doc
        # time for the last RSTs to arrive; SYN-ACKs are retried for a minute without one
        time.sleep(0.5)
        assert tcp_states(f, "h1", "syn-recv", DPORT) == []
        nft_drop(f, "h0", "rst")
        # the check itself can see half-open connections: drop our RSTs too
        nft(f, "h0", "rst", "output", KILL_RST)
        doc = tcp_sweep_from(f, "h0", "h1", DPORT, expected=2, start=62000)
        assert doc["reasons"].get("reset not sent") == doc["probes_sent"], doc
        assert len(tcp_states(f, "h1", "syn-recv", DPORT)) == doc["probes_sent"]


_HOLD = """
import socket, sys, time
s = socket.socket()
s.bind(("", int(sys.argv[2])))
s.connect((sys.argv[1], int(sys.argv[3])))
print("up", flush=True)
time.sleep(120)
"""
_LISTEN = """
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", int(sys.argv[1])))
s.listen()
print("up", flush=True)
c, _ = s.accept()
time.sleep(120)
"""


def test_a_port_held_by_a_live_connection_is_verified_without_reaching_the_peer() -> None:
    port_srv = 5300
    with Fabric(hosts_per_leaf=1, leaves=2, spines=2) as f:
        procs = []
        try:
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", f.ns("h1"), sys.executable, "-c", _LISTEN,
                 str(port_srv)], stdout=subprocess.PIPE, text=True))
            assert procs[0].stdout is not None and procs[0].stdout.readline() == "up\n"
            doc = tcp_sweep_from(f, "h0", "h1", port_srv, expected=2)
            path = doc["paths"][0]
            port, hops = path["sports"][0], path["hops"]
            # every SYN h1 receives from that port, from now on
            nft(f, "h1", "syns", "input",
                f"tcp sport {port} tcp dport {port_srv} tcp flags & syn == syn counter")
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", f.ns("h0"), sys.executable, "-c", _HOLD,
                 f.address("h1"), str(port), str(port_srv)], stdout=subprocess.PIPE, text=True))
            assert procs[1].stdout is not None and procs[1].stdout.readline() == "up\n"

            unknown = tcp_trace_from(f, "h0", "h1", port_srv, port)
            assert unknown == {"hops": None, "reasons": {"port in use": 1}}
            known = tcp_trace_from(f, "h0", "h1", port_srv, port, known={port: hops})
            assert known["hops"] == hops and known["reasons"] == {}
            moved = tcp_trace_from(f, "h0", "h1", port_srv, port,
                                   known={port: [hops[0], "10.9.9.9", hops[2]]})
            assert moved["hops"] is None

            # the connection is untouched and the peer saw one SYN: the connection's own
            assert len(tcp_states(f, "h0", "established", port)) == 1
            listing = f.exec("h1", "nft", "list", "table", "ip", "syns").stdout
            assert "packets 1 " in listing, listing
        finally:
            for p in procs:
                p.kill()
                p.wait()
