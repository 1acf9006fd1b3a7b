"""Re-plans by cause and decision changes per job (cruxd/control/replan_stats.py)."""

from __future__ import annotations

from cruxd.control.host_plans import PublishedPlan
from cruxd.control.records import JobAssignment, JobState, PeerRoute
from cruxd.control.replan_stats import ReplanStats, cause_kind


def assignment(job: str, level: int = 1, sport: int = 49152, rank: int = 0) -> JobAssignment:
    route = PeerRoute("h0", "h1", ("10.0.0.2",), sport=sport)
    return JobAssignment(job, JobState.SCHEDULED, level=level, dscp=8 * level, rank=rank,
                         hosts=("h0", "h1"), routes=(route,))


def plan(gen: int, *jobs: JobAssignment, causes: tuple[str, ...] = ("x",)) -> PublishedPlan:
    return PublishedPlan(gen, gen * 1000, 4, jobs, causes)


def test_cause_kind_is_the_cause_up_to_its_colon() -> None:
    assert cause_kind("measurement changed: a on h0") == "measurement changed"
    assert cause_kind("first plan") == "first plan"


def test_replans_count_by_cause_and_jobs_count_their_changes() -> None:
    st = ReplanStats()
    p1 = plan(1, assignment("a"), causes=("job arrived: a",))
    assert st.record(None, p1) == []
    assert st.replans == {"job arrived": 1} and st.decision_changes == {"a": 0}
    # b arrives; a keeps its decision (only its rank moves: not the agents' to apply)
    p2 = plan(2, assignment("a", rank=1), assignment("b"),
              causes=("job arrived: b", "agent joined: h3"))
    assert st.record(p1, p2) == []
    assert st.replans == {"job arrived": 2, "agent joined": 1}
    assert st.decision_changes == {"a": 0, "b": 0}
    # nothing any agent applies changes: counted apart, not a re-plan
    p3 = plan(3, assignment("a", rank=1), assignment("b"), causes=("measurement changed: b",))
    assert st.record(p2, p3) == []
    assert st.unchanged == 1 and "measurement changed" not in st.replans
    # a's port and b's level change
    p4 = plan(4, assignment("a", sport=49153), assignment("b", level=2),
              causes=("path table changed: h0", "path table changed: h1"))
    assert st.record(p3, p4) == ["a", "b"]
    assert st.replans["path table changed"] == 1  # once per plan, however many causes
    assert st.decision_changes == {"a": 1, "b": 1}
    # a leaves: a re-plan; a keeps its count until the leader forgets the job
    p5 = plan(5, assignment("b", level=2), causes=("job ended: a",))
    assert st.record(p4, p5) == []
    assert st.replans["job ended"] == 1 and st.decision_changes == {"a": 1, "b": 1}
    st.forget({"a", "b"})
    assert st.decision_changes == {"a": 1, "b": 1}
    st.forget({"b"})
    assert st.decision_changes == {"b": 1}
