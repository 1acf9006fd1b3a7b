"""[leader] path_selection = "fabric" (adaptive routing): the key and its check, a plan that
keeps levels and DSCP but carries no source port (the routes, the host plan on the wire,
the table entries the agent writes), every host told when the mode changes, a sweeper
that sweeps nobody, and cruxctl status saying so. On the wire: test_path_selection_rig.py."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from google.protobuf import json_format
from rich.console import Console

from cruxd.agent.core import plan_decisions
from cruxd.agent.sweeper import SweepProbing
from cruxd.cli.status_view import print_status
from cruxd.config.parse import ConfigError, parse_config, restart_required
from cruxd.control.host_plans import LeaderPlanConfig, PublishedPlan, make_plan, plan_inputs
from cruxd.control.plan_delta import carry_changes, changed_hosts
from cruxd.control.records import PATHS_BY_CRUX, PATHS_BY_FABRIC, HostPlan, JobState
from cruxd.rpc import convert
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.scheduler.planner import PlanConfig
from tests.test_agent_sweeper import Fabric, plan
from tests.test_discovery import addr, state
from tests.test_tcp_routes import tcp_table

DSCP = (10, 18, 26, 34)  # none of them 0, so a decided class is told from the default


def config(mode: str) -> LeaderPlanConfig:
    return LeaderPlanConfig(PlanConfig(levels=4, dscp=DSCP), path_selection=mode)


def planned(mode: str, generation: int = 1) -> PublishedPlan:
    """Jobs big (h0, h2) and small (h1, h3), every host reporting UDP and TCP ports
    probed onto both spines toward its peer."""
    return make_plan(plan_inputs(state(table_of=tcp_table), 1.0), None, config(mode),
                     generation, 1.0)


# --- the key -------------------------------------------------------------------------


def test_path_selection_defaults_to_crux_and_takes_fabric() -> None:
    assert parse_config("", "<t>").leader.path_selection == PATHS_BY_CRUX
    fabric = parse_config('[leader]\npath_selection = "fabric"\n', "<t>")
    assert fabric.leader.path_selection == PATHS_BY_FABRIC
    # the agents learn it from the leader's plans: read at start, like the listen address
    assert restart_required(parse_config("", "<t>"), fabric) == ["leader.path_selection"]


@pytest.mark.parametrize(("value", "says"), [
    ('"adaptive"', 'must be "crux" or "fabric", got "adaptive"'),
    ('"Fabric"', 'must be "crux" or "fabric", got "Fabric"; did you mean "fabric"?'),
    ("true", "expected a string, got the boolean true"),
])
def test_a_bad_path_selection_names_the_key_and_the_choices(value: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(f"[leader]\npath_selection = {value}\n", "/etc/crux/cruxd.toml")
    assert err.value.key == "leader.path_selection"
    assert str(err.value) == f"/etc/crux/cruxd.toml: leader.path_selection: {says}"


# --- the leader's plan -----------------------------------------------------------------


def test_crux_steers_by_probed_ports_where_the_fabric_mode_sends_none() -> None:
    crux = planned(PATHS_BY_CRUX)
    assert crux.path_selection == PATHS_BY_CRUX
    assert all(r.sport and r.tcp_sports and r.hops for a in crux.jobs for r in a.routes)

    fabric = planned(PATHS_BY_FABRIC)
    jobs = {a.job_id: a for a in fabric.jobs}
    assert {a.state for a in jobs.values()} == {JobState.SCHEDULED}
    # levels and DSCP decided as ever: the more intensive job above, in its level's class
    assert jobs["small"].level > jobs["big"].level
    assert all(a.dscp == DSCP[a.level] for a in jobs.values())
    # ... and no path: the probed tables are not planned on, no port is sent, no hop named
    assert fabric.topology == "star" and fabric.reprobe == {}
    for a in jobs.values():
        assert len(a.routes) == 2  # both ring directions still name their peer
        for r in a.routes:
            assert r.peer_addresses and (r.sport, r.hops, r.tcp_dport, r.tcp_sports) == \
                (0, (), 0, ())


def test_the_host_plan_and_the_table_entries_carry_dscp_and_no_port() -> None:
    fabric = planned(PATHS_BY_FABRIC)
    hp = fabric.for_host("h0")
    assert hp.path_selection == PATHS_BY_FABRIC
    assert convert.host_plan_from_pb(convert.host_plan_to_pb(hp)) == hp
    big = hp.jobs[0]
    entries = {d.peer: d for d in plan_decisions(hp)}
    assert set(entries) == {None, addr(2)}  # the job-wide entry and the peer's
    for d in entries.values():  # port 0 and no TCP ports: the shims leave the port alone
        assert (d.sport, d.tcp_dport, d.tcp_sports) == (0, 0, ())
        assert (d.level, d.dscp, d.traffic_class) == (big.level, big.dscp, big.dscp << 2)
    # a leader from before the key sends "": its plans steer as they always did
    old = convert.host_plan_to_pb(hp)
    old.path_selection = ""
    assert convert.host_plan_from_pb(old).path_selection == PATHS_BY_CRUX


def test_a_changed_mode_sends_every_host_its_whole_plan() -> None:
    crux = carry_changes(None, planned(PATHS_BY_CRUX, 1))
    same = carry_changes(crux, planned(PATHS_BY_CRUX, 2))
    assert changed_hosts(crux, same) == set()  # nothing changed: watermarks only
    fabric = carry_changes(same, planned(PATHS_BY_FABRIC, 3))
    assert {"h0", "h1", "h2", "h3"} <= changed_hosts(same, fabric)
    assert not fabric.unchanged_since("h3", 2)


# --- the agent ---------------------------------------------------------------------------


def test_the_sweeper_sweeps_nobody_while_the_fabric_routes() -> None:
    cfg = parse_config('[agent]\nprobing = "sweep"\n[probing]\nfabric_prefixes = ["10.2.0.0/16"]'
                       "\nrate_pps = 1000\nresponder = false\n", "<t>").probing
    fabric = Fabric()
    changes: list[int] = []

    def mode(hp: HostPlan, path_selection: str) -> HostPlan:
        return dataclasses.replace(hp, path_selection=path_selection)

    async def run() -> None:
        sp = SweepProbing(cfg, "h0", lambda: changes.append(1), fabric)  # type: ignore[arg-type]
        await sp.start()
        try:
            peers = plan(1, ("h1", "10.2.1.2"), reprobe=("h1",))
            sp.plan_changed(mode(peers, PATHS_BY_FABRIC))
            await asyncio.sleep(0.3)  # a sweep toward h1 would have run by now
            assert (sp.sweeps, fabric.made, sp.paths()) == (0, 0, ())
            assert sp.name == "sweep (ttl), idle: the fabric routes" and changes
            sp.plan_changed(mode(plan(2, ("h1", "10.2.1.2")), PATHS_BY_CRUX))
            while sp.sweeps < 1:  # the same peers swept once the leader steers again
                await asyncio.sleep(0.01)
            assert sp.name == "sweep (ttl)" and [t.dst_host for t in sp.paths()] == ["h1"]
            sp.plan_changed(mode(plan(3, ("h1", "10.2.1.2")), PATHS_BY_FABRIC))
            assert sp.paths() == ()  # its tables go with the peers: nothing left to report
        finally:
            await sp.stop()

    asyncio.run(run())


# --- cruxctl status ------------------------------------------------------------------------


def test_status_says_the_fabric_routes_in_text_and_json() -> None:
    route = cpb.PeerRoute(src_host="h0", peer_host="h2", peer_addresses=[addr(2)])
    cluster = cpb.ClusterStatus(leader_host="h0", levels=4, path_selection=PATHS_BY_FABRIC,
                                jobs=[cpb.JobDecision(job_id="big", state=2, level=1,
                                                      dscp=18, routes=[route])])
    console = Console(record=True, width=200)
    print_status(console, None, cluster, 0.0)
    text = console.export_text()
    assert "paths: left to the fabric (adaptive routing); crux sets levels/DSCP only" in text
    assert "h0->h2 fabric" in text
    doc = json_format.MessageToDict(cluster, preserving_proto_field_name=True)
    assert doc["path_selection"] == "fabric"

    console = Console(record=True, width=200)
    print_status(console, None, cpb.ClusterStatus(leader_host="h0", levels=4), 0.0)
    assert "paths: steered by crux" in console.export_text()  # "": a leader before the key


def test_status_reads_a_finished_job_as_ended_and_tags_each_t_j() -> None:
    from cruxd.control.job_notes import ENDED_NOTE, LOST_NOTE

    jobs = [cpb.JobDecision(job_id="done", state=4, note=ENDED_NOTE),
            cpb.JobDecision(job_id="gone", state=4, note=LOST_NOTE),
            cpb.JobDecision(job_id="live", state=2, measurement=cpb.JobMeasurement(
                comm_s=0.05, source="nvml+nccl"))]
    console = Console(record=True, width=250)
    print_status(console, None, cpb.ClusterStatus(leader_host="h0", levels=4, jobs=jobs), 0.0)
    text = console.export_text()
    rows = {line.split("│")[1].strip(): line for line in text.splitlines()
            if line.count("│") > 3 and line.split("│")[1].strip() in ("done", "gone", "live")}
    assert "ended" in rows["done"] and "expired" not in rows["done"]
    assert "expired" in rows["gone"]
    assert "(nccl)" in text  # where live's t_j came from
