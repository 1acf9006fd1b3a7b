"""Agents that probe, a leader that learns the fabric from their hop lists, and the
ports it chooses steering real traffic: cruxd processes inside the hosts of a
namespace Clos (2 leaves x 2 hosts, 2 spines), jobs registered with crux-run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cruxd.testing import Daemon, crux_run, running, status, wait_for
from tests.rig.fabric import Fabric, can_build
from tests.rig.probe import spine_of
from tests.rig.traffic import Flow, run_flows
from transport.decision_table import TableReader

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(can_build() is not None, reason=str(can_build()))]

LEADER = "10.2.0.2:7470"  # h0 runs both roles
RATE = 6.0  # Mbit/s of every leaf-0 uplink in the throughput part; each flow offers 6


def agent_config(f: Fabric, host: str, root: Path) -> dict[str, dict[str, Any]]:
    cfg: dict[str, dict[str, Any]] = {
        "daemon": {"roles": ["agent", "leader"] if host == "h0" else ["agent"]},
        "agent": {"leader": LEADER, "leader_token": str(root / "h0" / "state" / "leader.token"),
                  "probing": "sweep", "addresses": [f.address(host)],
                  "gpus": 8, "report_interval_s": 0.5},
        "probing": {"fabric_prefixes": ["10.2.0.0/15"], "rate_pps": 1000, "timeout_s": 0.3},
    }
    if host == "h0":
        cfg["leader"] = {"listen": LEADER, "profiling_s": 0, "levels": 4,
                         "agent_timeout_s": 10,
                         "insecure_remote": True}  # a lab: plaintext on the rig's fabric
    return cfg


def routes_by_job(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]] | None:
    """Each job's routes once every job is scheduled with a probed port on every route."""
    cluster = doc.get("cluster") or {}
    jobs = {j["job_id"]: j for j in cluster.get("jobs", [])}
    if set(jobs) != {"big", "small"}:
        return None
    if any(j.get("state") != "scheduled" or len(j.get("routes", [])) != 2
           or not all(r.get("sport") for r in j["routes"]) for j in jobs.values()):
        return None
    return {jid: j["routes"] for jid, j in jobs.items()}


def test_agents_probe_leader_discovers_fabric_and_ports_separate_jobs(tmp_path: Path) -> None:
    with Fabric(hosts_per_leaf=2, leaves=2, spines=2) as f:
        daemons = [Daemon(tmp_path, h, agent_config(f, h, tmp_path), netns=f.ns(h))
                   for h in f.host_names]
        with running(daemons, "agent h") as jobs:
            # 'small' is 10x as GPU-intensive; both rings cross leaf 0 <-> leaf 1
            for host, job, rank, flops in (("h0", "big", 0, 1e12), ("h2", "big", 1, 1e12),
                                           ("h1", "small", 0, 1e13), ("h3", "small", 1, 1e13)):
                jobs.append(crux_run(
                    daemons[int(host[1:])].socket, job, "--gpus", "8", "--node-rank",
                    str(rank), "--nnodes", "2", "--flops-per-iter", str(flops),
                    "--compute-s", "1", "--allreduce-bytes", "2e9"))
            routes = wait_for("both jobs scheduled on probed ports",
                              lambda: routes_by_job(status(daemons[0].socket)), timeout=60)
            doc = status(daemons[0].socket)
            cluster = doc["cluster"]
            assert cluster["topology"] == "discovered"
            peers = {a["host_id"]: a.get("peers", []) for a in cluster["agents"]}
            assert {h: [(p["peer_host"], p["paths"]) for p in ps]
                    for h, ps in peers.items()} == {
                "h0": [("h2", 2)], "h1": [("h3", 2)], "h2": [("h0", 2)], "h3": [("h1", 2)]}
            assert all(p["probed_unix_ms"] and p["probes_sent"] for ps in peers.values()
                       for p in ps)

            # the leader gave the two rings different spines in each direction ...
            spine = {(jid, r["src_host"]): spine_of(r["hops"][1])
                     for jid, rs in routes.items() for r in rs}
            assert spine[("big", "h0")] != spine[("small", "h1")]
            assert spine[("big", "h2")] != spine[("small", "h3")]
            # ... the agents wrote those ports into their decision tables ...
            sport = {(jid, r["src_host"]): r["sport"] for jid, rs in routes.items() for r in rs}
            with TableReader(daemons[0].table) as t:
                entry = t.lookup("big", f.address("h2"))
                assert entry is not None and entry.sport == sport[("big", "h0")]
            # ... and real traffic from those ports crosses the spine the plan named
            for (jid, src), port in sport.items():
                dst = next(r["peer_host"] for r in routes[jid] if r["src_host"] == src)
                delta = f.spine_tx_delta(src, dst, [port], count=20)
                assert delta[spine[(jid, src)]] >= 20 and sum(delta) - max(delta) < 5, delta

        # with leaf 0's uplinks limited, the plan's ports carry twice what the ports of
        # an ECMP collision (small's flow hashed onto big's spine) do
        # (spine_tx_delta counts only the candidate's own packets, so the agents' probes
        # and IPv6 chatter crossing the other spine cannot fake or spoil a collision)
        big = spine[("big", "h0")]
        collide = next(p for p in range(0xC000, 0xC100)
                       if (d := f.spine_tx_delta("h1", "h3", [p], count=10))[big] >= 10
                       and sum(d) - d[big] < 3)
        for s in range(f.spines):
            f.priority_queues("l0", f.uplink(0, s), RATE, dscp_by_level=[0])
        same = run_flows(f, [Flow("h0", "h2", RATE, sport=sport[("big", "h0")]),
                             Flow("h1", "h3", RATE, sport=collide)])
        apart = run_flows(f, [Flow("h0", "h2", RATE, sport=sport[("big", "h0")]),
                              Flow("h1", "h3", RATE, sport=sport[("small", "h1")])])
        print(f"through two {RATE} Mbit/s spines: colliding {sum(same):.2f} Mbit/s, "
              f"on the plan's ports {sum(apart):.2f} Mbit/s")
        assert sum(same) <= RATE * 1.15, same
        assert sum(apart) > 1.7 * sum(same) and sum(apart) > 0.85 * 2 * RATE, apart
