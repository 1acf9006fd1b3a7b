"""A multi-host job's arrival or departure re-plans once, when all its hosts have reported it
(control/job_hold.py, leader/service.py _awaiting_job), not once per host."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cruxd.control.cluster import ClusterState
from cruxd.control.host_plans import PublishedPlan
from cruxd.control.job_hold import job_hold
from cruxd.control.records import AgentReport, HostInventory, LocalJob, Measurement, Nic
from cruxd.leader.service import Leader
from tests.inproc_leader import inproc_leader

M = Measurement(1e12, 0.1, 1.0, 0.8, 1e9, "hints")


def report(host: str, *jobs: LocalJob) -> AgentReport:
    addr = f"10.0.0.{int(host[1:]) + 1}"
    return AgentReport(HostInventory(host, "1.0", 8, (Nic("mlx5_0", addr, 0, 100.0),)),
                       jobs, ())


def part(jid: str, rank: int, nnodes: int, ports: tuple[int, ...] = ()) -> LocalJob:
    return LocalJob(jid, 8, rank, nnodes, measurement=M, tcp_ports=ports)


def state() -> ClusterState:
    return ClusterState(agent_timeout_s=10.0, change_threshold=0.1, profiling_s=0.0)


# --- the pure rule ------------------------------------------------------------------------

def test_an_arrival_waits_for_every_host_then_goes() -> None:
    s = state()
    for h in ("h0", "h1", "h2"):
        s.ingest(report(h), 0)  # hosts join before their jobs start ("agent joined" goes at once)
    causes = s.ingest(report("h0", part("a", 0, 2)), 1.0)
    hold = job_hold(s, causes, 1.0, 3.0, None)
    assert hold is not None and hold.waiting == {"a": "1 of 2 hosts reported"}
    assert (hold.start, hold.until) == (1.0, 4.0)
    causes += s.ingest(report("h1", part("a", 1, 2)), 1.5)
    assert job_hold(s, causes, 1.5, 3.0, hold.start) is None  # whole: re-plan now
    # a single-host job is whole at once
    assert job_hold(s, s.ingest(report("h2", part("b", 0, 1)), 2.0), 2.0, 3.0, None) is None
    # and a job that is whole is not held up by another that is not (its ranks may be
    # waiting for their first decision)
    held = s.ingest(report("h0", part("a", 0, 2), part("c", 0, 2)), 3.0)
    assert held == ["job arrived: c"]
    assert job_hold(s, held, 3.0, 3.0, None) is not None
    whole = s.ingest(report("h1", part("a", 1, 2), part("c", 1, 2)), 3.1)
    assert job_hold(s, [*held, *whole], 3.1, 3.0, 3.0) is None
    s.ingest(report("h2", part("b", 0, 1), part("d", 0, 3)), 3.2)
    mixed = ["job arrived: d", "job arrived: e"]  # d: 1 of 3; e: whole (below)
    s.ingest(report("h9", part("e", 0, 1)), 3.2)
    assert job_hold(s, mixed, 3.2, 3.0, None) is None


def test_a_departure_waits_until_no_host_reports_the_job() -> None:
    s = state()
    s.ingest(report("h0", part("a", 0, 2)), 0)
    s.ingest(report("h1", part("a", 1, 2)), 0)
    causes = s.ingest(report("h1"), 5.0)
    assert causes == ["job left host: a on h1"]
    hold = job_hold(s, causes, 5.0, 3.0, None)
    assert hold is not None and hold.waiting == {"a": "1 host(s) still report it"}
    causes += s.ingest(report("h0"), 5.4)
    assert causes[-1] == "job ended: a" and job_hold(s, causes, 5.4, 3.0, 5.0) is None


def test_the_wait_is_bounded_and_other_causes_go_at_once() -> None:
    s = state()
    s.ingest(report("h0"), 0)
    causes = s.ingest(report("h0", part("a", 0, 4)), 1.0)
    assert job_hold(s, causes, 3.9, 3.0, 1.0) is not None
    assert job_hold(s, causes, 4.0, 3.0, 1.0) is None  # settle time over: re-plan
    assert job_hold(s, causes, 1.0, 0.0, None) is None  # 0 turns the hold off
    assert job_hold(s, [*causes, "NICs changed: h5"], 1.0, 3.0, None) is None
    assert job_hold(s, [*causes, "profiling done: z"], 1.0, 3.0, None) is None
    # the window of the held job starts with it; another job's window is planned at once
    assert job_hold(s, [*causes, "profiling: a"], 1.0, 3.0, None) is not None
    s.ingest(report("h7"), 0)
    s.ingest(report("h7", part("z", 0, 1)), 1.0)
    assert job_hold(s, [*causes, "profiling: z"], 1.0, 3.0, None) is None


def test_a_tcp_job_does_not_wait_for_probes_toward_its_ports() -> None:
    """Agents learn which port to probe from the plan's routes: waiting for those probes
    before the plan would wait out job_settle_s for nothing."""
    s = state()
    s.ingest(report("h0"), 0)
    s.ingest(report("h1"), 0)
    causes = s.ingest(report("h0", part("a", 0, 2, (29500,))), 1.0)
    causes += s.ingest(report("h1", part("a", 1, 2, (29501,))), 1.2)
    assert job_hold(s, causes, 1.2, 3.0, 1.0) is None


# --- the leader ---------------------------------------------------------------------------

def leader(tmp_path: Path, settle_s: float, plans: list[PublishedPlan]) -> Leader:
    return inproc_leader(tmp_path, plans, job_settle_s=settle_s)


async def _arrive_and_leave(tmp_path: Path, settle_s: float,
                            second_host: bool) -> list[PublishedPlan]:
    plans: list[PublishedPlan] = []
    ld = leader(tmp_path, settle_s, plans)
    ld.start()
    try:
        def tell(r: AgentReport) -> None:
            ld._event(*ld.state.ingest(r, ld.clock()))

        async def quiet(n: int) -> None:  # until n plans, and then a while
            for _ in range(int(settle_s * 50) + 100):
                if len(plans) >= n:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)

        tell(report("h0"))
        tell(report("h1"))
        await quiet(1)
        tell(report("h0", part("a", 0, 2)))
        await asyncio.sleep(0.3)
        if second_host:
            tell(report("h1", part("a", 1, 2)))
        await quiet(2)
        arrived = len(plans)
        tell(report("h0"))
        await asyncio.sleep(0.3)
        if second_host:
            tell(report("h1"))
        await quiet(arrived + 1)
        return plans[1:]
    finally:
        await ld.stop()


def test_one_replan_per_arrival_and_per_departure(tmp_path: Path) -> None:
    arrival, departure = asyncio.run(_arrive_and_leave(tmp_path, 30.0, second_host=True))
    assert arrival.causes == ("job arrived: a", "job grew: a on h1")
    assert [j.job_id for j in arrival.jobs] == ["a"]
    assert departure.causes == ("job left host: a on h0", "job left host: a on h1",
                                "job ended: a")
    assert departure.jobs == ()


def test_a_host_that_never_reports_holds_the_plan_only_for_the_settle_time(
        tmp_path: Path) -> None:
    arrival, departure = asyncio.run(_arrive_and_leave(tmp_path, 0.6, second_host=False))
    assert arrival.causes == ("job arrived: a",)  # planned with one host of two
    assert [j.job_id for j in arrival.jobs] == ["a"]
    # its only host left: the job ended with it, nothing to wait for
    assert departure.causes == ("job left host: a on h0", "job ended: a")
