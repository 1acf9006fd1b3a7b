"""Agents report only on change (cruxd/agent/report_change.py), and an open plan stream
keeps a host alive at the leader however old its last report (ClusterState.streams)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from cruxd.agent.report_change import why_report
from cruxd.control.cluster import ClusterState
from cruxd.control.records import (
    FIGURES,
    AgentReport,
    HostInventory,
    LinkObservation,
    LocalJob,
    Measurement,
    Nic,
    PathTable,
    ProbedPath,
)

M = Measurement(1e12, 0.1, 1.0, 0.8, 1e9, "nvml+nic")
PATH = ProbedPath(("tor0", "agg1", "tor1"), (49152,), verified_unix_ms=1000)
INV = HostInventory("h0", "1.0", 8, (Nic("mlx5_0", "10.0.0.1", 0, 100.0),), "live", "sweep")


def report(*jobs: LocalJob, paths: tuple[PathTable, ...] = (), gen: int = 1,
           links: tuple[LinkObservation, ...] = ()) -> AgentReport:
    return AgentReport(INV, jobs, paths, links, gen)


def job(m: Measurement = M, **kw: object) -> LocalJob:
    return replace(LocalJob("a", 8, 0, 2, measurement=m), **kw)  # type: ignore[arg-type]


def why(last: AgentReport | None, new: AgentReport, age_s: float = 1.0,
        reprobe: frozenset[str] = frozenset()) -> str | None:
    return why_report(last, new, age_s, 300.0, 0.05, reprobe)


def test_what_sends_a_report() -> None:
    base = report(job(), paths=(PathTable("h1", (PATH,), probed_unix_ms=1000),))
    assert why(None, base) == "first report"
    assert why(base, base) is None
    assert why(base, base, age_s=300.0) == "refresh"
    assert why(base, replace(base, host=replace(INV, gpus=4))) == "inventory changed"
    assert why(base, replace(base, jobs=())) == "jobs changed"
    assert why(base, replace(base, jobs=(job(qps_applied=3),))) == "job a changed"
    assert why(base, replace(base, jobs=(job(tcp_ports=(29500,)),))) == "job a changed"
    assert why(base, replace(base, jobs=(job(request_profiling=True),))) == "job a changed"
    moved = replace(M, comm_s=0.106)
    assert why(base, replace(base, jobs=(job(moved),))) == "measurement of a moved"
    assert why(base, replace(base, jobs=(job(replace(M, comm_s=0.104)),))) is None
    assert why(base, replace(base, jobs=(job(replace(M, source="hints")),))) is not None
    assert why(base, replace(base, jobs=(job(replace(M, period_s=0.0)),))) is not None
    lost = PathTable("h1", (), probed_unix_ms=2000)
    assert why(base, replace(base, paths=(lost,))) == "paths changed"
    # a sweep that re-verified the same paths goes only when the leader asked for it
    again = PathTable("h1", (replace(PATH, verified_unix_ms=2000),), probed_unix_ms=2000)
    assert why(base, replace(base, paths=(again,))) is None
    assert why(base, replace(base, paths=(again,)), reprobe=frozenset({"h1"})) == \
        "probed h1 again"
    # NIC utilisation and the generation held ride along with the next report
    busy = replace(base, links=(LinkObservation("mlx5_0", 0.9),), applied_generation=7)
    assert why(base, busy) is None


@given(st.sampled_from(FIGURES), st.floats(0.0, 0.049), st.booleans())
def test_small_moves_stay_home_and_the_leader_still_sees_them_within_the_tolerance(
        name: str, rel: float, up: bool) -> None:
    """The leader's view of a figure is within report_change of the agent's: a move
    within it sends nothing, and a move past it sends."""
    x = getattr(M, name)
    base = report(job())
    near = report(job(replace(M, **{name: x * (1 + rel if up else 1 - rel)})))
    far = report(job(replace(M, **{name: x * (1.06 if up else 0.94)})))
    assert why(base, near) is None
    assert why(base, far) == "measurement of a moved"


def state() -> ClusterState:
    return ClusterState(agent_timeout_s=10.0, change_threshold=0.1, profiling_s=0.0,
                        change_hold_s=15.0)


def test_a_host_with_a_stream_open_never_expires_and_one_without_does() -> None:
    s = state()
    s.ingest(report(job()), 0.0)
    s.stream_opened("h0")
    assert s.expire(1000.0) == [] and s.next_deadline() is None
    s.stream_closed("h0", 1000.0)  # the grace starts when the stream ends
    assert s.next_deadline() == 1010.0
    assert s.expire(1009.0) == []
    assert s.expire(1010.5) == ["agent expired: h0", "job lost: a (no live agent reports it)"]


def test_two_streams_count_until_both_end() -> None:
    s = state()
    s.ingest(report(), 0.0)
    s.stream_opened("h0")
    s.stream_opened("h0")  # an agent replacing its stream holds two for a moment
    s.stream_closed("h0", 5.0)
    assert s.expire(100.0) == []
    s.stream_closed("h0", 100.0)
    assert s.expire(111.0) == ["agent expired: h0"]


def test_a_measurement_change_commits_once_held_without_further_reports() -> None:
    """Agents report a move once; no report saying otherwise within change_hold_s is the
    move holding, so the leader re-plans on its own clock."""
    s = state()
    s.ingest(report(job()), 0.0)
    s.stream_opened("h0")
    moved = replace(M, comm_s=0.2)
    assert s.ingest(report(job(moved)), 10.0) == []  # held
    assert s.next_deadline() == 25.0
    assert s.expire(24.0) == []
    assert s.expire(25.0) == ["measurement changed: a on h0"]
    assert s.agents["h0"].baseline["a"] == moved and s.agents["h0"].pending == {}
    # a blip that went back within the hold re-plans nothing
    s.ingest(report(job(replace(moved, comm_s=0.4))), 30.0)
    s.ingest(report(job(moved)), 31.0)
    assert s.expire(100.0) == []
