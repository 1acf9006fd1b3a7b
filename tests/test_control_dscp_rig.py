"""crux's own RPCs ride the control class ([control] dscp, CS6 by default), on the wire: two
cruxd processes on the namespace fabric, h0 the leader (and an agent), h1 an agent with a
job, so that its reports go up and a plan comes down the plan stream; and cruxctl on h1
asking the leader directly. tcpdump at h1 sees every packet of those TCP connections, both
directions, handshakes included: every one carries the configured DSCP, and setting the key
to another value changes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cruxd.testing import BIN, Daemon, crux_run, running, wait_for
from tests.rig.capture import Tcpdump
from tests.rig.fabric import Fabric, can_build
from tests.rig.tcp import tcp_states
from tests.test_probing_agents import LEADER, agent_config

WHY = can_build()
pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(WHY is not None, reason=str(WHY))]
LEADER_PORT = int(LEADER.rsplit(":", 1)[1])
JOB = ("--gpus", "8", "--nnodes", "1", "--flops-per-iter", "1e12", "--compute-s", "1",
       "--allreduce-bytes", "2e9")


def control_packets(f: Fabric, root: Path, dscp: int | str | None) -> dict[str, Any]:
    """Run the two daemons with [control] dscp = `dscp` (None: the default, unset) and
    capture at h1; (TOS, direction, flags) of every packet to or from the leader's port."""
    daemons = []
    for h in ("h0", "h1"):
        cfg = agent_config(f, h, root)
        cfg["agent"]["probing"] = "none"  # nothing but the control connection on the wire
        cfg["probing"] = {}
        if dscp is not None:
            cfg["control"] = {"dscp": dscp}
        daemons.append(Daemon(root, h, cfg, netns=f.ns(h)))
    cap = Tcpdump(f, "h1", root / "control.pcap", f"tcp port {LEADER_PORT}")
    with running(daemons, "agent h") as anchors:
        anchors.append(crux_run(daemons[1].socket, "job", *JOB))
        daemons[1].wait_log("plan ", timeout=30)
        wait_for("h1's plan with the job", lambda: " 1 job(s)" in daemons[1].log_text())
        # cruxctl on h1 straight to the leader: a client channel of its own
        ctl = f.exec("h1", str(BIN / "cruxctl"), "status", "--json", "--leader", LEADER,
                     "--config", str(daemons[1].config))
        assert ctl.returncode == 0, ctl.stderr
        assert json.loads(ctl.stdout)["cluster"]["leader_address"]
    from scapy.layers.inet import IP, TCP

    h1 = f.address("h1")
    out: dict[str, Any] = {"up": set(), "down": set(), "syn": set(), "synack": set(),
                           "conns": set(), "n": 0}
    for p in cap.stop():
        if IP not in p or TCP not in p:
            continue
        tcp, ip = p[TCP], p[IP]
        up = ip.src == h1
        out["up" if up else "down"].add(ip.tos)
        out["n"] += 1
        if tcp.flags.S and not tcp.flags.A:
            out["syn"].add(ip.tos)
            out["conns"].add(tcp.sport)
        elif tcp.flags.S:
            out["synack"].add(ip.tos)
    return out


@pytest.mark.parametrize("dscp", [None, 10], ids=["default-cs6", "dscp-10"])
def test_control_traffic_carries_the_configured_class(tmp_path: Path, dscp: int | None) -> None:
    with Fabric(hosts_per_leaf=1, leaves=2, spines=1) as f:
        got = control_packets(f, tmp_path, dscp)
    tos = (48 if dscp is None else dscp) << 2
    print(f"dscp {dscp}: {got['n']} packets on {len(got['conns'])} connections, TOS up "
          f"{sorted(got['up'])} down {sorted(got['down'])}")
    # the agent's channel (reports, the plan stream) and cruxctl's: two connections at least
    assert len(got["conns"]) >= 2 and got["n"] > 20, got
    assert got["up"] == {tos} and got["down"] == {tos}, got  # both ways, every packet
    assert got["syn"] == {tos} and got["synack"] == {tos}, got  # from the handshake on


def test_dscp_system_leaves_the_kernels_class(tmp_path: Path) -> None:
    """dscp = "system": no socket option, the packets keep the kernel's class (0)."""
    with Fabric(hosts_per_leaf=1, leaves=2, spines=1) as f:
        got = control_packets(f, tmp_path, "system")
    assert got["up"] == {0} and got["down"] == {0}, got


ETCD_CLIENT = """
import asyncio, sys
from cruxd.config.parse import parse_config
from cruxd.leader.etcd import EtcdClient
cfg = parse_config('[leader]\\nha = "etcd"\\nadvertise = "10.2.0.2:7470"\\n'
                   f'etcd_endpoints = ["{sys.argv[1]}:2379"]\\netcd_insecure = true\\n', "<rig>")
async def main():
    c = EtcdClient(cfg.leader, timeout=1.0, dscp=cfg.control.dscp)
    try:
        await c.get(b"k")  # no etcd answers: a timeout, after the handshake
    except Exception:
        pass
asyncio.run(main())
"""


def test_the_etcd_channel_carries_it(tmp_path: Path) -> None:
    """The HA leader's and agents' etcd client (aetcd on crux's channel) from h0: its packets
    toward a member leave in the control class. A plain listener on h1 stands in for the
    member: only the client's packets are looked at."""
    with Fabric(hosts_per_leaf=1, leaves=2, spines=1) as f:
        member = subprocess.Popen(["ip", "netns", "exec", f.ns("h1"), sys.executable, "-c",
                                   "import socket, time; s = socket.create_server(("
                                   f"'{f.address('h1')}', 2379)); time.sleep(120)"])
        try:
            wait_for("the stand-in member", lambda: tcp_states(f, "h1", "listening", 2379))
            cap = Tcpdump(f, "h1", tmp_path / "etcd.pcap", "tcp dst port 2379")
            run = f.exec("h0", sys.executable, "-c", ETCD_CLIENT, f.address("h1"))
            assert run.returncode == 0, run.stderr
            from scapy.layers.inet import IP, TCP

            sent = [(p[IP].tos, bool(p[TCP].flags.S)) for p in cap.stop() if TCP in p]
        finally:
            member.kill()
            member.wait()
    assert any(syn for _, syn in sent) and {tos for tos, _ in sent} == {48 << 2}, sent
