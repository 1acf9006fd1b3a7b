"""End to end, TCP: cruxd agents on the namespace Clos (2 leaves x 2 hosts, 2 spines,
kernel ECMP) probe their jobs' peers with TCP SYNs toward iperf3's port too; the leader
gives two rings crossing the same leaf pair different spines and attaches the chosen
paths' TCP ports; real iperf3 clients run under crux-run with the socket interposer
preloaded, and their connections leave from decided ports, cross the planned spines
and land in their level's DSCP class on an emulated switch port. Against an ECMP
collision of the second job with the first, the plan's ports double the throughput
through two rate-limited spine uplinks."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cruxd.testing import BIN, Daemon, crux_run, running, status, wait_for
from tests.rig.fabric import Fabric
from tests.rig.probe import spine_of
from tests.rig.tcp import can_steer_tcp, iperf3_servers, tcp_sweep_from
from tests.test_probing_agents import agent_config
from transport.decision_table import TableReader

WHY = can_steer_tcp()
pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(WHY is not None, reason=str(WHY))]
DPORT = 5201
RATE = 20.0  # Mbit/s of every leaf-0 uplink in the throughput part
JOBS = (("h0", "big", 0, 1e12), ("h2", "big", 1, 1e12),  # 'small' is 10x as intensive
        ("h1", "small", 0, 1e13), ("h3", "small", 1, 1e13))


def routes_with_tcp(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]] | None:
    """Each job's routes once both are scheduled with a UDP port and 8 TCP ports on every
    route (the TCP sweep ends after the UDP one: the leader plans twice)."""
    jobs = {j["job_id"]: j for j in (doc.get("cluster") or {}).get("jobs", [])}
    if set(jobs) != {"big", "small"}:
        return None
    for j in jobs.values():
        rs = j.get("routes", [])
        if j.get("state") != "scheduled" or len(rs) != 2 or not all(
                r.get("sport") and r.get("tcp_dport") == DPORT
                and len(r.get("tcp_sports", [])) == 8 for r in rs):
            return None
    return {jid: j["routes"] for jid, j in jobs.items()}


def iperf3(f: Fabric, src: str, dst: str, *args: str, job: Path | None = None,
           job_id: str = "") -> subprocess.Popen[str]:
    """iperf3 -c from `src` to `dst`:5201, --json; under crux-run (the job's agent socket
    `job`) or, without, as ECMP would place it."""
    cmd = ["iperf3", "-c", f.address(dst), "-p", str(DPORT), "--json", *args]
    if job is not None:  # the interposer comes from crux-run alone, as a user's job gets it
        cmd = [str(BIN / "crux-run"), "--socket", str(job), "--job-id", job_id, "--", *cmd]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return subprocess.Popen(["ip", "netns", "exec", f.ns(src), *cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def finish(p: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = p.communicate(timeout=120)
    try:
        doc: dict[str, Any] = json.loads(out)
    except ValueError:
        doc = {}
    assert p.returncode == 0, f"iperf3: {doc.get('error') or out[-2000:]} {err[-2000:]}"
    return doc


def mbits(doc: dict[str, Any]) -> float:
    return float(doc["end"]["sum_received"]["bits_per_second"]) / 1e6


def local_ports(doc: dict[str, Any]) -> set[int]:
    return {int(c["local_port"]) for c in doc["start"]["connected"]}


def test_iperf3_under_crux_run_takes_the_planned_spine_port_and_class(tmp_path: Path) -> None:
    with Fabric(hosts_per_leaf=2, leaves=2, spines=2) as f, \
            iperf3_servers(f, ["h2", "h3"], DPORT):
        daemons = []
        for h in f.host_names:
            cfg = agent_config(f, h, tmp_path)
            cfg["probing"]["tcp_dport"] = DPORT
            daemons.append(Daemon(tmp_path, h, cfg, netns=f.ns(h)))
        sock = {d.name: d.socket for d in daemons}
        with running(daemons, "agent h") as anchors:
            for host, job, rank, flops in JOBS:
                anchors.append(crux_run(
                    sock[host], job, "--gpus", "8", "--node-rank", str(rank), "--nnodes", "2",
                    "--flops-per-iter", str(flops), "--compute-s", "1",
                    "--allreduce-bytes", "2e9"))
            routes = wait_for("both jobs scheduled with TCP ports",
                              lambda: routes_with_tcp(status(sock["h0"])), timeout=90)
            jobs = {j["job_id"]: j for j in status(sock["h0"])["cluster"]["jobs"]}
            out = {jid: next(r for r in rs if r["src_host"] in ("h0", "h1"))
                   for jid, rs in routes.items()}  # the leaf 0 -> leaf 1 routes
            spine = {jid: spine_of(r["hops"][1]) for jid, r in out.items()}
            ports = {jid: set(r["tcp_sports"]) for jid, r in out.items()}
            dscp = {jid: int(j.get("dscp", 0)) for jid, j in jobs.items()}
            print(f"plan: spines {spine}, DSCP {dscp}, TCP ports {ports}")
            # the plan moved the rings apart, with TCP ports probed onto those spines
            assert spine["big"] != spine["small"]
            assert all(61000 <= p <= 65535 for ps in ports.values() for p in ps)
            with TableReader(daemons[0].table) as t:
                entry = t.lookup("big", f.address("h2"))
                assert entry is not None and set(entry.tcp_sports) == ports["big"]
                assert entry.tcp_dport == DPORT and entry.dscp == dscp["big"]

            # an emulated switch port per leaf-0 uplink: one HTB class per DSCP in use
            classes = sorted({0, *dscp.values()})
            for s in range(f.spines):
                f.priority_queues("l0", f.uplink(0, s), RATE, dscp_by_level=classes)
            cls = {jid: f"1:{10 + classes.index(d)}" for jid, d in dscp.items()}

            # 1. 'big' alone: three connections (control + 2 streams) from decided ports,
            # on its spine only, in its class
            up = f.uplink(0, spine["big"])
            before = f.class_bytes("l0", up)
            with f.uplink_counts("h0", "h2", sorted(ports["big"]), "tcp", DPORT) as read:
                doc = finish(iperf3(f, "h0", "h2", "-P", "2", "-t", "2", job=sock["h0"],
                                    job_id="big"))
                delta = read()
            gained = {c: n - before.get(c, 0) for c, n in f.class_bytes("l0", up).items()}
            # what crossed the port (written but unsent bytes never left the host)
            sent = int(doc["end"]["sum_received"]["bytes"])
            print(f"big: ports {sorted(local_ports(doc))}, packets per spine {delta}, "
                  f"class bytes {gained}, {sent} bytes received")
            assert local_ports(doc) <= ports["big"] and len(local_ports(doc)) == 2
            assert delta[spine["big"]] > 0 and sum(delta) == delta[spine["big"]], delta
            assert gained[cls["big"]] >= sent  # payload plus headers, all in its class
            others = sum(n for c, n in gained.items() if c not in (cls["big"], "1:1"))
            assert others < 0.05 * sent, gained  # 1:1 is the port's parent class: all

            # 2. 'small' as ECMP may hash it: onto big's spine (a port probed there) ...
            probe = tcp_sweep_from(f, "h1", "h3", DPORT, expected=2, start=63000)
            collide = next(p["sports"][0] for p in probe["paths"]
                           if spine_of(p["hops"][1]) == spine["big"])
            big = iperf3(f, "h0", "h2", "-t", "4", job=sock["h0"], job_id="big")
            small = iperf3(f, "h1", "h3", "-t", "4", "--cport", str(collide))
            same = [mbits(finish(big)), mbits(finish(small))]
            # ... and as the plan steers it, under crux-run
            big = iperf3(f, "h0", "h2", "-t", "4", job=sock["h0"], job_id="big")
            with f.uplink_counts("h1", "h3", sorted(ports["small"]), "tcp", DPORT) as read:
                small = iperf3(f, "h1", "h3", "-t", "4", job=sock["h1"], job_id="small")
                planned = finish(small)
                delta = read()
            apart = [mbits(finish(big)), mbits(planned)]
            print(f"through two {RATE} Mbit/s uplinks: colliding {same} = {sum(same):.2f}, "
                  f"planned {apart} = {sum(apart):.2f} Mbit/s")
            assert local_ports(planned) <= ports["small"]
            assert delta[spine["small"]] > 0 and sum(delta) == delta[spine["small"]], delta
            assert sum(same) <= RATE * 1.15, same
            assert sum(apart) > 1.6 * sum(same) and sum(apart) > 0.8 * 2 * RATE, apart
