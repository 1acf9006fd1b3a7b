"""Hints from a fabric the agents discovered by probing reproduce the rig's real tiers:
cruxd agents sweep paths on the namespace Clos (2 leaves x 2 hosts, 2 spines), the leader
builds the fabric from their hop lists, and every export groups the hosts by their real
leaf, in one pod, with the leaf named by one of that leaf router's own addresses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cruxd.testing import Daemon, crux_run, cruxctl, running, status, wait_for
from tests.rig.fabric import MAX_SPINES, Fabric, can_build
from tests.test_hints_volcano_slurm import parse_topology_conf
from tests.test_probing_agents import agent_config, routes_by_job

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(can_build() is not None, reason=str(can_build()))]


def leaf_addresses(f: Fabric, leaf: int) -> set[str]:
    """Every address of rig leaf router l<leaf>: toward its hosts and toward each spine."""
    hosts = [h for h in f.host_names if f.leaf_of(h) == leaf]
    return ({f"10.2.{int(h[1:])}.1" for h in hosts}
            | {f"10.3.{leaf * MAX_SPINES + s}.1" for s in range(f.spines)})


def hints(d: Daemon, fmt: str) -> str:
    run = cruxctl("hints", "--format", fmt, socket_path=d.socket)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_hints_from_probed_fabric_reproduce_the_rig_tiers(tmp_path: Path) -> None:
    with Fabric(hosts_per_leaf=2, leaves=2, spines=2) as f:
        daemons = [Daemon(tmp_path, h, agent_config(f, h, tmp_path), netns=f.ns(h))
                   for h in f.host_names]
        with running(daemons, "agent h") as jobs:
            for host, job, rank in (("h0", "big", 0), ("h2", "big", 1), ("h1", "small", 0),
                                    ("h3", "small", 1)):
                jobs.append(crux_run(daemons[int(host[1:])].socket, job, "--gpus", "4",
                                     "--node-rank", str(rank), "--nnodes", "2",
                                     "--flops-per-iter", "1e12", "--compute-s", "1",
                                     "--allreduce-bytes", "2e9"))
            wait_for("both jobs scheduled on probed ports",
                     lambda: routes_by_job(status(daemons[0].socket)), timeout=60)
            assert status(daemons[0].socket)["cluster"]["topology"] == "discovered"
            sf = json.loads(hints(daemons[0], "spiderflow"))
            arnold = json.loads(hints(daemons[0], "arnold"))
            labels = json.loads(hints(daemons[0], "labels"))
            slurm = hints(daemons[0], "slurm")
            volcano = list(yaml.safe_load_all(hints(daemons[0], "volcano")))
    real = {frozenset(h for h in f.host_names if f.leaf_of(h) == k): k for k in range(f.leaves)}

    # SpiderFlow: one vertex per real leaf, named by that leaf's own address, GPUs right
    got = {frozenset(h["host"] for h in v["hosts"]): v for v in sf["vertices"]}
    assert set(got) == set(real)
    for hosts, v in got.items():
        assert set(v["leaves"]) <= leaf_addresses(f, real[hosts]), v["leaves"]
        assert (v["gpus"], v["gpus_free"]) == (16, 8)  # 2 hosts x 8, a 4-GPU job on each
    # Arnold: the four hosts form one minipod (a 2-tier Clos is one pod)
    assert len(arnold["minipods"]) == 1
    assert {n["minipod"] for n in arnold["nodes"].values()} == {arnold["minipods"][0]["id"]}
    # labels, Volcano and Slurm group the hosts exactly as the rig does
    by_leaf: dict[str, set[str]] = {}
    for host, lab in labels.items():
        by_leaf.setdefault(lab["crux.io/leaf"], set()).add(host)
    assert {frozenset(v) for v in by_leaf.values()} == set(real)
    assert len({lab["crux.io/pod"] for lab in labels.values()}) == 1
    tier1 = [d for d in volcano if d["spec"]["tier"] == 1]
    assert {frozenset(m["selector"]["exactMatch"]["name"] for m in d["spec"]["members"])
            for d in tier1} == set(real)
    switches = parse_topology_conf(slurm)
    assert {frozenset(s["nodes"]) for s in switches.values() if s["nodes"]} == set(real)
