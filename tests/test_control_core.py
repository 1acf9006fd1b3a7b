"""The control plane's pure core: validation, cluster state, codec, protobuf conversion,
the agent's plan -> decision-table mapping and its measurement/probing sources."""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cruxd.agent.core import plan_decisions
from cruxd.agent.sources import ReplayMeasurement, StaticMeasurement, StaticPaths
from cruxd.control.cluster import KEEP_EXPIRED_TIMEOUTS, AgentRecord, ClusterState, JobRecord
from cruxd.control.codec import from_dict, to_dict
from cruxd.control.host_plans import PublishedPlan
from cruxd.control.records import (
    AgentReport,
    HostInventory,
    HostPlan,
    JobAssignment,
    JobState,
    LinkObservation,
    LocalJob,
    Measurement,
    Nic,
    PathTable,
    PeerRoute,
    ProbedPath,
)
from cruxd.control.validate import (
    LIMITS,
    MAX_GPUS,
    MAX_HOPS,
    MAX_JOBS_PER_HOST,
    MAX_LINKS,
    MAX_NICS,
    MAX_PATH_TABLES,
    MAX_PATHS_PER_PEER,
    MAX_SPORTS,
    MAX_TEXT,
    InvalidMessage,
    check_address,
    check_host_id,
    check_host_plan,
    check_job_id,
    check_local_job,
    check_report,
)
from cruxd.errors import UsageError
from cruxd.rpc import convert
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb
from tests.paths import EXAMPLES
from transport.decision_table import Decision

MEASURED = Measurement(1e12, 0.1, 1.0, 0.8, 1e9, "hints")
PATH = ProbedPath(("tor0", "agg1", "tor1"), (49153, 52017))


def report(host: str = "h0", *jobs: LocalJob, addr: str = "10.0.0.1",
           paths: tuple[PathTable, ...] = ()) -> AgentReport:
    return AgentReport(HostInventory(host, "1.0", 8, (Nic("mlx5_0", addr, 0, 100.0),)),
                       jobs, paths)


def job(jid: str = "a", rank: int = 0, nnodes: int = 1, m: Measurement = MEASURED,
        gpus: int = 8) -> LocalJob:
    return LocalJob(jid, gpus, rank, nnodes, measurement=m)


def good_report() -> AgentReport:
    return AgentReport(
        host=HostInventory("h0.rack-1", "1.0", 8, (Nic("mlx5_0", "10.0.0.1", 0, 100.0),
                                                   Nic("mlx5_1", "fd00::1", 1, 400.0))),
        jobs=(LocalJob("job-a", 8, 1, 2, 17, MEASURED, 2, 4, "python train.py",
                       tcp_ports_busy=6),
              LocalJob("user@team/b:1", 0)),
        paths=(PathTable("h2", (PATH,)),),
        links=(LinkObservation("tor0->agg1", 0.5, 3),))


def good_plan() -> HostPlan:
    route = PeerRoute("h0", "h2", ("10.0.0.3", "::ffff:10.0.0.4"), 49153, ("tor0",), 0)
    return HostPlan(3, "h0", 1000, 4, (
        JobAssignment("a", JobState.SCHEDULED, 1.5, 1.0, 0, 3, 32, ("h0", "h2"), 16, (route,)),
        JobAssignment("b", JobState.UNMEASURED, hosts=("h0",), note="no W_j measured yet")))


def set_job(r: AgentReport, i: int, **kw: object) -> AgentReport:
    jobs = list(r.jobs)
    jobs[i] = replace(jobs[i], **kw)  # type: ignore[arg-type]
    return replace(r, jobs=tuple(jobs))


def set_measurement(r: AgentReport, i: int, **kw: object) -> AgentReport:
    return set_job(r, i, measurement=replace(r.jobs[i].measurement, **kw))  # type: ignore[arg-type]


def set_path(r: AgentReport, **kw: object) -> AgentReport:
    table = r.paths[0]
    return replace(r, paths=(PathTable(table.dst_host, (replace(PATH, **kw),)),))  # type: ignore[arg-type]


def rejected(field: str, fn: object, *args: object) -> InvalidMessage:
    with pytest.raises(InvalidMessage) as info:
        fn(*args)  # type: ignore[operator]
    assert info.value.field == field, str(info.value)
    assert str(info.value).startswith(f"{field}: ")
    return info.value


# --- validation --------------------------------------------------------------


def test_valid_messages_pass_unchanged() -> None:
    """A well-formed report, job and plan come back as the very same objects."""
    r, hp = good_report(), good_plan()
    assert check_report(r) is r and r == good_report()
    assert check_local_job(r.jobs[0]) is r.jobs[0]
    assert check_host_plan(hp, "h0") is hp and hp == good_plan()
    assert issubclass(InvalidMessage, UsageError)


@pytest.mark.parametrize("name", sorted(LIMITS))
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0, "absurd"])
def test_bad_measurement_is_rejected_naming_the_field(name: str, bad: float | str) -> None:
    """NaN, infinities, negatives and values beyond LIMITS are refused with their path."""
    value = LIMITS[name] * 10 if bad == "absurd" else bad
    r = set_measurement(good_report(), 1, **{name: value})
    rejected(f"jobs[1].measurement.{name}", check_report, r)
    at_limit = set_measurement(good_report(), 1, **{name: LIMITS[name]})
    assert check_report(at_limit) is at_limit


@pytest.mark.parametrize(("field", "build"), [
    ("host.nics", lambda r: replace(r, host=replace(r.host, nics=r.host.nics * MAX_NICS))),
    ("jobs", lambda r: replace(r, jobs=r.jobs[:1] * (MAX_JOBS_PER_HOST + 1))),
    ("paths", lambda r: replace(r, paths=r.paths * (MAX_PATH_TABLES + 1))),
    ("paths[0].paths", lambda r: replace(
        r, paths=(PathTable("h2", (PATH,) * (MAX_PATHS_PER_PEER + 1)),))),
    ("paths[0].paths[0].hops", lambda r: set_path(r, hops=("tor0",) * (MAX_HOPS + 1))),
    ("paths[0].paths[0].sports", lambda r: set_path(r, sports=(49153,) * (MAX_SPORTS + 1))),
    ("links", lambda r: replace(r, links=r.links * (MAX_LINKS + 1))),
])
def test_too_many_entries(field: str, build: object) -> None:
    """Each list is bounded by its MAX_* constant; one entry more is refused."""
    rejected(field, check_report, build(good_report()))  # type: ignore[operator]


@pytest.mark.parametrize("bad_id", ["", "x" * 64, "a b", "a\0b", "-a", ".a", "a\n"])
def test_bad_job_ids(bad_id: str) -> None:
    """Job ids must fit a 64-byte NUL-padded slot and a file name."""
    rejected("jobs[0].job_id", check_report, set_job(good_report(), 0, job_id=bad_id))
    rejected("job_id", check_job_id, bad_id)


def test_good_ids_and_addresses() -> None:
    """The edges of the accepted forms pass; addresses come back normalised."""
    assert check_job_id("a" * 63) == "a" * 63
    assert check_host_id("h" * 253) == "h" * 253
    assert check_address("FD00::0001", "x") == "fd00::1"
    rejected("host_id", check_host_id, "h" * 254)
    rejected("host_id", check_host_id, "h 0")


@pytest.mark.parametrize(("field", "build"), [
    ("host.host_id", lambda r: replace(r, host=replace(r.host, host_id="-h0"))),
    ("host.gpus", lambda r: replace(r, host=replace(r.host, gpus=MAX_GPUS + 1))),
    ("host.nics[1].address", lambda r: replace(r, host=replace(r.host, nics=(
        r.host.nics[0], Nic("mlx5_1", "10.0.0.300", 1))))),
    ("host.nics[0].port", lambda r: replace(r, host=replace(r.host, nics=(
        Nic("mlx5_0", "10.0.0.1", MAX_NICS),)))),
    ("host.agent_version", lambda r: replace(r, host=replace(
        r.host, agent_version="v" * (MAX_TEXT + 1)))),
    ("jobs[1]", lambda r: set_job(r, 1, job_id="job-a")),
    ("jobs[0].node_rank", lambda r: set_job(r, 0, node_rank=2)),
    ("jobs[0].nnodes", lambda r: set_job(r, 0, nnodes=0)),
    ("jobs[0].gpus", lambda r: set_job(r, 0, gpus=MAX_GPUS + 1)),
    ("jobs[0].gpus", lambda r: set_job(r, 0, gpus=-1)),
    ("jobs[0].qps_applied", lambda r: set_job(r, 0, qps_applied=5)),
    ("jobs[0].tcp_ports_busy", lambda r: set_job(r, 0, tcp_ports_busy=2**53 + 1)),
    ("jobs[0].tcp_ports_busy", lambda r: set_job(r, 0, tcp_ports_busy=-1)),
    ("jobs[0].command", lambda r: set_job(r, 0, command="x" * (MAX_TEXT + 1))),
    ("jobs[0].measurement.source", lambda r: set_measurement(r, 0, source="s" * (MAX_TEXT + 1))),
    ("paths[1]", lambda r: replace(r, paths=r.paths * 2)),
    ("paths[0].dst_host", lambda r: replace(r, paths=(PathTable("h 2", (PATH,)),))),
    ("paths[0].paths[0].hops[1]", lambda r: set_path(r, hops=("tor0", "", "tor1"))),
    ("paths[0].paths[0].sports[1]", lambda r: set_path(r, sports=(49153, 65536))),
    ("paths[0].paths[0].sports[0]", lambda r: set_path(r, sports=(0,))),
    ("paths[0].paths[0].verified_unix_ms", lambda r: set_path(r, verified_unix_ms=-1)),
    ("paths[0].paths[1]", lambda r: replace(r, paths=(PathTable("h2", (PATH, PATH)),))),
    ("paths[0].dst_address", lambda r: replace(r, paths=(
        PathTable("h2", (PATH,), dst_address="10.0.0.300"),))),
    ("paths[0].errors", lambda r: replace(r, paths=(PathTable("h2", (PATH,), errors=-2),))),
    ("paths[0].last_error", lambda r: replace(r, paths=(
        PathTable("h2", (PATH,), last_error="e" * (MAX_TEXT + 1)),))),
    ("links[0].utilization", lambda r: replace(r, links=(LinkObservation("l", 1.5),))),
])
def test_report_rules(field: str, build: object) -> None:
    """Every rule of check_report rejects with the dotted path of the offending field."""
    rejected(field, check_report, build(good_report()))  # type: ignore[operator]


def test_local_job_rules() -> None:
    """check_local_job roots its paths at the given field name."""
    rejected("job.node_rank", check_local_job, LocalJob("a", 8, node_rank=1, nnodes=1))
    rejected("reg.qps_applied", check_local_job, LocalJob("a", 8, qps_applied=1), "reg")
    rejected("job.measurement.comm_s", check_local_job,
             LocalJob("a", 8, measurement=Measurement(comm_s=math.nan)))


def _set_assignment(hp: HostPlan, **kw: object) -> HostPlan:
    return replace(hp, jobs=(replace(hp.jobs[0], **kw), *hp.jobs[1:]))  # type: ignore[arg-type]


@pytest.mark.parametrize(("field", "build"), [
    ("host_id", lambda hp: replace(hp, host_id="h1")),
    ("levels", lambda hp: replace(hp, levels=0)),
    ("jobs", lambda hp: replace(hp, jobs=hp.jobs[:1] * (MAX_JOBS_PER_HOST + 1))),
    ("jobs[0].job_id", lambda hp: _set_assignment(hp, job_id="a b")),
    ("jobs[0].level", lambda hp: _set_assignment(hp, level=4)),
    ("jobs[0].dscp", lambda hp: _set_assignment(hp, dscp=64)),
    ("jobs[0].routes[0].sport", lambda hp: _set_assignment(
        hp, routes=(replace(hp.jobs[0].routes[0], sport=65536),))),
    ("jobs[0].routes[0].peer_addresses[1]", lambda hp: _set_assignment(
        hp, routes=(replace(hp.jobs[0].routes[0], peer_addresses=("10.0.0.3", "h2")),))),
    ("jobs[1]", lambda hp: replace(hp, jobs=(hp.jobs[0], hp.jobs[0]))),
])
def test_host_plan_rules(field: str, build: object) -> None:
    """An agent refuses a plan for another host or with out-of-range decisions."""
    rejected(field, check_host_plan, build(good_plan()), "h0")  # type: ignore[operator]


_fields = tuple(LIMITS)
_measurements = st.builds(
    Measurement, *(st.floats(0, LIMITS[n], allow_nan=False) for n in _fields),
    st.text(max_size=MAX_TEXT))
_job_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,62}", fullmatch=True)


@st.composite
def _valid_reports(draw: st.DrawFn) -> AgentReport:
    ids = draw(st.lists(_job_ids, min_size=1, max_size=6, unique=True))
    jobs = []
    for jid in ids:
        nnodes = draw(st.integers(1, 64))
        total = draw(st.integers(0, 64))
        jobs.append(LocalJob(jid, draw(st.integers(0, MAX_GPUS)),
                             draw(st.integers(0, nnodes - 1)), nnodes, 0, draw(_measurements),
                             draw(st.integers(0, total)), total))
    host = draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,30}", fullmatch=True))
    nics = draw(st.lists(st.builds(Nic, st.just("mlx"), st.ip_addresses().map(str),
                                   st.integers(0, MAX_NICS - 1), st.floats(0, 1e5)),
                         max_size=4))
    return AgentReport(HostInventory(host, nics=tuple(nics)), tuple(jobs))


@settings(max_examples=60)
@given(r=_valid_reports(), data=st.data())
def test_valid_report_passes_and_one_nan_fails(r: AgentReport, data: st.DataObject) -> None:
    """Any report from valid strategies passes; one NaN measurement fails naming it."""
    assert check_report(r) is r
    i = data.draw(st.integers(0, len(r.jobs) - 1))
    name = data.draw(st.sampled_from(_fields))
    rejected(f"jobs[{i}].measurement.{name}", check_report,
             set_measurement(r, i, **{name: math.nan}))


# --- cluster state -----------------------------------------------------------


def cluster(profiling_s: float = 0.0) -> ClusterState:
    return ClusterState(agent_timeout_s=10.0, change_threshold=0.1, profiling_s=profiling_s)


def test_join_arrive_grow_leave_end() -> None:
    """The lifecycle of a job over two hosts yields one cause per material event."""
    s = cluster()
    assert s.ingest(report("h0", job("a", 0, 2)), 0) == ["agent joined: h0", "job arrived: a"]
    assert s.ingest(report("h1", job("a", 1, 2), addr="10.0.0.2"), 1) == [
        "agent joined: h1", "job grew: a on h1"]
    assert s.ingest(report("h0", job("a", 0, 2)), 2) == []  # identical re-report
    assert s.ingest(report("h1", addr="10.0.0.2"), 3) == ["job left host: a on h1"]
    assert s.jobs["a"].expired_at is None
    assert s.ingest(report("h0"), 4) == ["job left host: a on h0", "job ended: a"]
    assert s.jobs["a"].expired_at == 4
    assert s.jobs["a"].ended  # it finished: status reads "ended", not "expired"


def test_nic_and_path_changes_are_causes() -> None:
    """A new NIC address or a changed path table re-plans; the same ones do not."""
    s = cluster()
    s.ingest(report("h0", paths=(PathTable("h2", (PATH,)),)), 0)
    assert s.ingest(report("h0", paths=(PathTable("h2", (PATH,)),)), 1) == []
    assert s.ingest(report("h0", addr="10.0.0.9", paths=(PathTable("h2", (PATH,)),)), 2) == [
        "NICs changed: h0"]
    assert s.ingest(report("h0", addr="10.0.0.9"), 3) == ["path table changed: h0"]


def test_reverified_paths_do_not_replan_and_lost_hops_ask_for_reprobes() -> None:
    """A sweep that confirms the same paths (new times only) is no change; a hop
    that vanishes from one agent's paths makes the leader ask every agent whose
    paths cross it, and probed before the loss, to probe again."""
    s = cluster()
    other = ProbedPath(("tor0", "agg2", "tor1"), (49999,))
    s.ingest(report("h0", paths=(PathTable("h2", (PATH, other), probed_unix_ms=500),)), 0)
    s.ingest(report("h1", addr="10.0.0.2", paths=(
        PathTable("h3", (ProbedPath(("tor0", "agg1", "tor9"), (50000,)),),
                  probed_unix_ms=900),)), 0)
    again = PathTable("h2", (replace(PATH, verified_unix_ms=2000), other), probed_unix_ms=2000)
    assert s.ingest(report("h0", paths=(again,)), 2) == []
    assert s.reprobe(2) == {}
    lost = PathTable("h2", (other,), probed_unix_ms=3000)
    assert s.ingest(report("h0", paths=(lost,)), 3) == ["path table changed: h0"]
    assert s.down_hops == {"agg1": 3}
    assert s.reprobe(3) == {"h1": ("h3",)}  # h0 itself no longer crosses agg1
    s.ingest(report("h1", addr="10.0.0.2", paths=(
        PathTable("h3", (ProbedPath(("tor0", "agg2", "tor9"), (50000,)),),
                  probed_unix_ms=3500),)), 3.5)
    assert s.reprobe(3.5) == {}
    assert s.reprobe(1e6) == {} and s.down_hops == {}  # forgotten after a while
    # a table the agent stops keeping (its host's jobs no longer talk to h2) lost nothing
    assert s.ingest(report("h0", paths=()), 1e6 + 1) == ["path table changed: h0"]
    assert s.down_hops == {} and s.reprobe(1e6 + 1) == {}


@pytest.mark.parametrize(("before", "after", "material"), [
    (1.0, 1.05, False), (1.0, 0.95, False), (1.0, 1.2, True), (1.0, 0.8, True),
    (0.0, 0.001, True), (0.5, 0.0, True), (0.0, 0.0, False),
])
def test_measurement_change_threshold(before: float, after: float, material: bool) -> None:
    """Only a relative change beyond the threshold (10%), or known <-> unknown, counts."""
    for name in LIMITS:
        s = cluster()
        s.ingest(report("h0", job(m=Measurement(**{name: before}))), 0)
        causes = s.ingest(report("h0", job(m=Measurement(**{name: after}))), 1)
        assert causes == (["measurement changed: a on h0"] if material else []), name


def test_slow_drift_adds_up_to_a_replan() -> None:
    """Steps below the threshold are judged against the figures of the last change:
    +5 %, +5 % (10.25 % in all) re-plans on the second step, then the base moves."""
    s = cluster()
    s.ingest(report("h0", job(m=Measurement(comm_s=1.0))), 0)
    assert s.ingest(report("h0", job(m=Measurement(comm_s=1.05))), 1) == []
    assert s.ingest(report("h0", job(m=Measurement(comm_s=1.1025))), 2) == [
        "measurement changed: a on h0"]
    assert s.ingest(report("h0", job(m=Measurement(comm_s=1.15))), 3) == []


def test_a_change_must_hold_before_it_replans() -> None:
    """With change_hold_s, a change re-plans only once later reports still show it; a
    one-report blip re-plans nothing and leaves the baseline where it was."""
    s = cluster()
    s.change_hold_s = 10.0
    s.ingest(report("h0", job(m=Measurement(comm_s=1.0))), 0)
    assert s.ingest(report("h0", job(m=Measurement(comm_s=1.5))), 1) == []  # a blip
    assert s.ingest(report("h0", job(m=Measurement(comm_s=1.0))), 2) == []  # gone again
    assert s.agents["h0"].pending == {}
    assert s.ingest(report("h0", job(m=Measurement(comm_s=1.5))), 3) == []
    assert s.ingest(report("h0", job(m=Measurement(comm_s=1.4))), 8) == []
    assert s.agents["h0"].pending == {"a": 3}
    assert s.ingest(report("h0", job(m=Measurement(comm_s=1.45))), 13) == [
        "measurement changed: a on h0"]  # off since 3: held 10 s
    assert s.agents["h0"].pending == {}
    assert s.agents["h0"].baseline["a"].comm_s == 1.45
    assert s.ingest(report("h0", job(m=Measurement(comm_s=1.5))), 14) == []
    # a new shape does not wait
    assert s.ingest(report("h0", job(gpus=4, m=Measurement(comm_s=1.5))), 15) == [
        "measurement changed: a on h0"]


def test_shape_change_is_material() -> None:
    """A job's GPU count or ring position changing is a material change."""
    s = cluster()
    s.ingest(report("h0", job("a", 0, 2)), 0)
    assert s.ingest(report("h0", job("a", 0, 2, gpus=4)), 1) == ["measurement changed: a on h0"]


def test_expiry_and_forgetting() -> None:
    """A silent agent expires after agent_timeout_s, its jobs end, and both are forgotten
    KEEP_EXPIRED_TIMEOUTS timeouts later; a re-reported job then arrives anew."""
    s = cluster(profiling_s=5.0)
    s.ingest(report("h0", job("a")), 0)
    s.advance_profiling(0)
    assert s.jobs["a"].profile == "profiling"
    assert s.next_deadline() == 5.0
    s.advance_profiling(5)
    assert s.jobs["a"].profile == "done"
    assert s.next_deadline() == 10.0
    assert s.expire(10.0) == []  # exactly the timeout: not yet
    assert s.expire(10.5) == ["agent expired: h0", "job lost: a (no live agent reports it)"]
    assert not s.jobs["a"].ended  # it went with its host's agent: lost, not ended
    assert s.agents["h0"].expired and s.agents["h0"].jobs == {}
    assert s.live_agents() == {} and s.merged_jobs() == []
    keep = KEEP_EXPIRED_TIMEOUTS * 10.0
    assert s.next_deadline() == keep  # forgetting h0 is due then: a quiet leader still wakes
    assert s.expire(keep + 1) == []
    assert "h0" not in s.agents and "a" in s.jobs  # the job ended later than the agent spoke
    assert s.expire(10.5 + keep + 1) == []
    assert s.jobs == {}


def test_expired_job_reported_again_arrives_anew() -> None:
    """After expiry the same agent and job come back as new: joined, arrived, profiled."""
    s = cluster(profiling_s=5.0)
    s.ingest(report("h0", job("a")), 0)
    s.advance_profiling(0)
    s.advance_profiling(5)
    s.expire(11)
    assert s.ingest(report("h0", job("a")), 20) == ["agent joined: h0", "job arrived: a"]
    assert (s.jobs["a"].first_seen, s.jobs["a"].profile) == (20, "queued")
    assert s.advance_profiling(20) == ["profiling: a"]


def test_profiling_is_fifo_one_at_a_time() -> None:
    """Jobs are profiled oldest first (not by name), one window of profiling_s each."""
    s = cluster(profiling_s=5.0)
    s.ingest(report("h0", job("b")), 0)
    s.ingest(report("h0", job("b"), job("a")), 1)
    assert s.advance_profiling(1) == ["profiling: b"]
    assert s.jobs["b"].profiling_until == 6.0
    assert s.advance_profiling(5.9) == []
    assert s.jobs["a"].profile == "queued"
    assert s.next_deadline() == 6.0  # before the agent's expiry at 11
    assert s.advance_profiling(6) == ["profiling done: b", "profiling: a"]
    assert s.jobs["a"].profiling_until == 11.0
    assert s.advance_profiling(11) == ["profiling done: a"]
    assert {j.profile for j in s.jobs.values()} == {"done"}


@pytest.mark.parametrize(("profiling_s", "enabled"), [(0.0, True), (5.0, False)])
def test_profiling_off_goes_straight_to_done(profiling_s: float, enabled: bool) -> None:
    """With no window, or profiling disabled, queued jobs are done without a cause."""
    s = cluster(profiling_s)
    s.ingest(report("h0", job("a"), job("b")), 0)
    assert s.advance_profiling(0, enabled=enabled) == []
    assert {j.profile for j in s.jobs.values()} == {"done"}


def test_next_deadline_is_the_earliest() -> None:
    """next_deadline is the min over live agents' expiry and the profiling window's end."""
    s = cluster(profiling_s=50.0)
    assert s.next_deadline() is None
    s.ingest(report("h0", job("a")), 0)
    s.ingest(report("h1", addr="10.0.0.2"), 3)
    assert s.next_deadline() == 10.0
    s.advance_profiling(0)
    assert s.next_deadline() == 10.0
    s.ingest(report("h0", job("a")), 8)
    assert s.next_deadline() == 13.0
    s.jobs["a"].profiling_until = 1.0
    assert s.next_deadline() == 1.0


def test_merged_jobs() -> None:
    """Hosts in node_rank order; W_j summed over hosts; times, sizes and nnodes: max."""
    s = cluster()
    s.ingest(report("ha", job("j", 1, 2, Measurement(2e12, 0.3, 1.0, 0.5, 1e9, "replay"))), 0)
    s.ingest(report("hb", job("j", 0, 2, Measurement(1e12, 0.2, 1.5, 0.9, 2e9, "hints"),
                              gpus=4), addr="10.0.0.2"), 0)
    (m,) = s.merged_jobs()
    assert (m.job_id, m.hosts, m.nnodes) == ("j", (("hb", 4), ("ha", 8)), 2)
    assert m.measurement == Measurement(3e12, 0.3, 1.5, 0.9, 2e9, "hints,replay")


# --- codec -------------------------------------------------------------------


def test_codec_round_trips_records() -> None:
    """AgentRecord and JobRecord survive to_dict -> JSON -> from_dict unchanged."""
    r = good_report()
    agent = AgentRecord(r.host, {j.job_id: j for j in r.jobs},
                        {t.dst_host: t for t in r.paths}, r.links, 12.5, 7, True)
    for cls, obj in ((AgentRecord, agent), (JobRecord, JobRecord("a", 1.0)),
                     (JobRecord, JobRecord("a", 1.0, "profiling", 6.0, 9.5))):
        doc = json.loads(json.dumps(to_dict(obj), allow_nan=False))
        assert from_dict(cls, doc) == obj


def test_codec_round_trips_plan_with_infinity() -> None:
    """A published plan with an infinite intensity and enums round-trips; the scheduler's
    document is not persisted (it is rebuilt by the next plan)."""
    jobs = (*good_plan().jobs, JobAssignment("c", JobState.PROFILING, math.inf, hosts=("h1",)))
    pp = PublishedPlan(4, 1000, 4, jobs, ("job arrived: c",), 0.25, "clos2",
                       {"version": 1, "jobs": [{"job": "a", "intensity": None}]})
    doc = json.loads(json.dumps(to_dict(pp), allow_nan=False))
    assert doc["jobs"][2]["intensity"] == "inf" and doc["jobs"][2]["state"] == 1
    back = from_dict(PublishedPlan, doc)
    assert back == pp and "document" not in doc and back.plan_document() is None
    assert back.jobs[2].state is JobState.PROFILING and math.isinf(back.jobs[2].intensity)


@pytest.mark.parametrize(("path", "value", "where"), [
    (("jobs", "job-a", "measurement", "comm_s"), "fast", "$.jobs.job-a.measurement.comm_s"),
    (("inventory", "nics", 1, "port"), 1.5, "$.inventory.nics[1].port"),
    (("paths", "h2", "paths", 0, "sports"), 49153, "$.paths.h2.paths[0].sports"),
    (("inventory",), [], "$.inventory"),
    (("expired",), "yes", "$.expired"),
])
def test_codec_damaged_dict_names_the_path(path: tuple[object, ...], value: object,
                                           where: str) -> None:
    """A wrong type deep in a document raises ValueError naming where."""
    r = good_report()
    doc = to_dict(AgentRecord(r.host, {j.job_id: j for j in r.jobs},
                              {t.dst_host: t for t in r.paths}))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ValueError, match=f"^{re.escape(where)}: "):
        from_dict(AgentRecord, doc)


def test_codec_rejects_unknown_enum_and_missing_field() -> None:
    """An unknown state number and a missing required field are refused, with the path."""
    doc = to_dict(PublishedPlan(1, 0, 4, good_plan().jobs))
    doc["jobs"][1]["state"] = 42
    with pytest.raises(ValueError, match=r"^\$\.jobs\[1\]\.state: 42 is not a JobState"):
        from_dict(PublishedPlan, doc)
    with pytest.raises(ValueError, match=r"^\$: "):
        from_dict(JobRecord, {"job_id": "a"})


# --- protobuf conversion -----------------------------------------------------


def test_report_round_trips_through_protobuf() -> None:
    """report_to_pb / report_from_pb give back an equal record, also after serializing."""
    r = replace(good_report(), applied_generation=9, seq=42)
    pb = lpb.AgentReport.FromString(convert.report_to_pb(r).SerializeToString())
    assert convert.report_from_pb(pb) == r


def test_host_plan_round_trips_through_protobuf() -> None:
    """host_plan_to_pb / host_plan_from_pb give back an equal record."""
    hp = good_plan()
    pb = lpb.HostPlan.FromString(convert.host_plan_to_pb(hp).SerializeToString())
    assert pb.jobs[0].traffic_class == 32 << 2
    assert convert.host_plan_from_pb(pb) == hp


def test_unknown_job_state_decodes_as_unspecified() -> None:
    """A state number from a newer leader keeps the decision, state UNSPECIFIED."""
    pb = cpb.JobDecision(job_id="a", state=9, level=2, dscp=24)
    a = convert.assignment_from_pb(cpb.JobDecision.FromString(pb.SerializeToString()))
    assert (a.job_id, a.state, a.level, a.dscp) == ("a", JobState.UNSPECIFIED, 2, 24)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_unknown_fields_are_tolerated() -> None:
    """A message with a field this version does not know (field 999) still parses."""
    extra = _varint(999 << 3) + _varint(123456)
    hp = good_plan()
    raw = convert.host_plan_to_pb(hp).SerializeToString() + extra
    assert convert.host_plan_from_pb(lpb.HostPlan.FromString(raw)) == hp
    r = good_report()
    raw = convert.report_to_pb(r).SerializeToString() + extra
    assert convert.report_from_pb(lpb.AgentReport.FromString(raw)) == r


# --- agent: plan -> decision table ------------------------------------------


def test_plan_decisions() -> None:
    """One job-wide entry per job, one per peer address; a repeated address keeps the
    first route's sport; level/dscp/traffic class/generation come from the plan."""
    hp = good_plan()
    second = PeerRoute("h0", "h2", ("10.0.0.3", "10.0.0.4", "10.0.0.5"), 50000)
    hp = _set_assignment(hp, routes=(*hp.jobs[0].routes, second))
    got = plan_decisions(hp)
    assert got == [
        Decision("a", None, 3, 32, 128, 0, 3),
        Decision("a", "10.0.0.3", 3, 32, 128, 49153, 3),
        Decision("a", "10.0.0.4", 3, 32, 128, 49153, 3),  # ::ffff:10.0.0.4 normalised
        Decision("a", "10.0.0.5", 3, 32, 128, 50000, 3),
        Decision("b", None, 0, 0, 0, 0, 3),
    ]


# --- agent: sources ----------------------------------------------------------


def test_static_measurement() -> None:
    """Hints are passed on (source 'hints') only when accepted."""
    hints = Measurement(1e12, 0.1, 1.0, 0.5, 1e9, "whatever")
    on, off = StaticMeasurement(True), StaticMeasurement(False)
    assert on.measure(job(), hints) == replace(hints, source="hints")
    assert off.measure(job(), hints) == Measurement(source="static")
    assert on.name != off.name


def _write(path: Path, doc: object, mtime: int) -> None:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    os.utime(path, ns=(mtime, mtime))


def test_replay_measurement_rereads_and_keeps_last_good(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The file is re-read when its mtime changes; an invalid version is logged and the
    last good contents stay in use."""
    f = tmp_path / "measure.json"
    _write(f, {"jobs": {"a": {"flops_per_iter": 1e12, "comm_s": 0.2}}}, 1_000_000_000)
    src = ReplayMeasurement(f)
    assert src.measure(job("a"), MEASURED) == Measurement(1e12, 0.2, source="replay")
    assert src.measure(job("zz"), MEASURED) == Measurement(source="replay")
    _write(f, {"jobs": {"a": {"flops_per_iter": 2e12, "allreduce_bytes": 5}}}, 2_000_000_000)
    good = Measurement(2e12, allreduce_bytes=5.0, source="replay")
    assert src.measure(job("a"), MEASURED) == good
    for i, bad in enumerate(["{not json", {"jobs": {"a": {"comm_s": -1}}},
                             {"jobs": {"a": {"speed": 1}}}, {"jobs": []}]):
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="cruxd.agent.sources"):
            _write(f, bad, 3_000_000_000 + i)
            assert src.measure(job("a"), MEASURED) == good
        assert any(r.levelno == logging.ERROR and str(f) in r.getMessage()
                   for r in caplog.records), bad


def test_static_paths_keeps_this_hosts_rows() -> None:
    """Only rows whose src is this host become path tables."""
    h0 = StaticPaths(EXAMPLES / "path-table.json", "h0").paths()
    assert h0 == (PathTable("h2", (ProbedPath(("tor0", "agg1", "tor1"), (49153, 52017)),
                                   ProbedPath(("tor0", "agg3", "tor1"), (50342,)))),)
    assert StaticPaths(EXAMPLES / "path-table.json", "h2").paths() == ()


def test_agent_request_profiles_a_done_job_again_only_with_profiling_on() -> None:
    s = cluster(profiling_s=30.0)
    s.ingest(report("h0", job("a")), now=0.0)
    assert s.advance_profiling(0.0) == ["profiling: a"]
    assert s.advance_profiling(31.0) == ["profiling done: a"]
    asked = replace(job("a"), request_profiling=True)
    assert s.ingest(report("h0", asked), now=32.0) == ["profiling requested: a by h0"]
    assert s.ingest(report("h0", asked), now=33.0) == []  # queued already: no re-plan
    assert s.advance_profiling(34.0) == ["profiling: a"]
    off = cluster(profiling_s=0.0)
    off.ingest(report("h0", job("a")), now=0.0)
    off.advance_profiling(0.0, enabled=True)
    assert off.ingest(report("h0", asked), now=1.0) == []  # nothing would ever profile it


def test_measurement_changes_wait_while_a_job_profiles() -> None:
    """While a job is queued for or in its profiling window, other figures moving re-plan
    nothing (its "profiling done" re-plans with the newest); a job's new shape still
    does, and once profiling is over changes count again, against the newest figures."""
    s = cluster(profiling_s=10.0)
    s.ingest(report("h0", job("a", m=Measurement(comm_s=1.0))), 0)
    assert s.advance_profiling(0) == ["profiling: a"]
    assert s.ingest(report("h0", job("a", m=Measurement(comm_s=2.0))), 1) == []
    assert s.ingest(report("h0", job("a", 0, 2, m=Measurement(comm_s=2.0))), 2) == [
        "measurement changed: a on h0"]
    assert s.advance_profiling(11) == ["profiling done: a"]
    assert s.ingest(report("h0", job("a", 0, 2, m=Measurement(comm_s=2.1))), 12) == []
    assert s.ingest(report("h0", job("a", 0, 2, m=Measurement(comm_s=4.0))), 13) == [
        "measurement changed: a on h0"]
    # a second job arriving queues for profiling: the first job's changes wait again
    assert s.ingest(report("h0", job("a", 0, 2, m=Measurement(comm_s=8.0)), job("b")), 14) \
        == ["job arrived: b"]
