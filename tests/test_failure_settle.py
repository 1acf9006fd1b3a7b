"""After a failure the leader re-plans once, when the agents concerned have probed again
(cruxd/leader/service.py, _awaiting_reprobe), not once per agent that finds it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cruxd.control.host_plans import PublishedPlan
from cruxd.control.records import AgentReport, HostInventory, Nic, PathTable, ProbedPath
from cruxd.leader.service import Leader
from tests.inproc_leader import inproc_leader


def leader(tmp_path: Path, settle_s: float, plans: list[PublishedPlan]) -> Leader:
    return inproc_leader(tmp_path, plans, failure_settle_s=settle_s)


def report(host: str, addr: str, *tables: PathTable) -> AgentReport:
    return AgentReport(HostInventory(host, "1.0", 8, (Nic("mlx5_0", addr, 0, 100.0),)),
                       (), tables)


def table(dst: str, via: str, probed_ms: int) -> PathTable:
    return PathTable(dst, (ProbedPath(("tor0", via, "tor1"), (49152,)),),
                     probed_unix_ms=probed_ms)


async def _run(tmp_path: Path, settle_s: float, reprobed: bool) -> list[PublishedPlan]:
    plans: list[PublishedPlan] = []
    ld = leader(tmp_path, settle_s, plans)
    ld.start()
    try:
        def tell(r: AgentReport) -> None:
            ld._event(*ld.state.ingest(r, ld.clock()))

        tell(report("h0", "10.0.0.1", table("h2", "agg1", 1000)))
        tell(report("h1", "10.0.0.2", table("h3", "agg1", 1000)))
        while not plans:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        before = len(plans)
        # agg1 fails: h0 finds it first, on its own sweep
        tell(report("h0", "10.0.0.1", table("h2", "agg2", int(ld.clock() * 1000))))
        while len(plans) == before:
            await asyncio.sleep(0.02)
        if reprobed:  # h1 was asked to probe again: it does, and finds it too
            await asyncio.sleep(0.2)
            tell(report("h1", "10.0.0.2", table("h3", "agg2", int(ld.clock() * 1000) + 1)))
        for _ in range(int(settle_s * 50) + 50):
            if len(plans) >= before + 2:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        return plans[before:]
    finally:
        await ld.stop()


def test_one_replan_takes_the_whole_failure_in(tmp_path: Path) -> None:
    plans = asyncio.run(_run(tmp_path, 30.0, reprobed=True))
    asked, replanned = plans  # nothing else: h1's report re-plans nothing on its own
    assert asked.causes[0] == "reprobe after a failure" and asked.reprobe == {"h1": ("h3",)}
    assert replanned.causes == ("path table changed: h0", "path table changed: h1")
    assert replanned.reprobe == {}  # h1 probed after the loss: nothing left to ask


def test_the_replan_comes_after_the_settle_time_without_the_reprobe(tmp_path: Path) -> None:
    plans = asyncio.run(_run(tmp_path, 0.5, reprobed=False))
    asked, replanned = plans
    assert asked.reprobe == {"h1": ("h3",)}
    assert replanned.causes == ("path table changed: h0",)
    assert replanned.reprobe == {"h1": ("h3",)}  # still asked, in the plan that settles it


def test_a_host_that_probed_after_the_failure_is_not_waited_for_again(tmp_path: Path) -> None:
    """Agents find a failure one sweep at a time, and each newly lost hop asks again the hosts
    whose paths cross it; a host that already probed after the first loss has seen the fabric
    without it, and is not waited for (it is not sent the same request twice)."""
    async def run() -> list[PublishedPlan]:
        plans: list[PublishedPlan] = []
        ld = leader(tmp_path, 30.0, plans)
        ld.start()
        try:
            def tell(r: AgentReport) -> None:
                ld._event(*ld.state.ingest(r, ld.clock()))

            def ms() -> int:
                return int(ld.clock() * 1000)

            both = (ProbedPath(("tor0", "agg1", "tor1"), (49152,)),
                    ProbedPath(("tor0", "agg2", "tor1b"), (49153,)))
            tell(report("h0", "10.0.0.1", table("h2", "agg1", 1000)))
            tell(report("h1", "10.0.0.2", PathTable("h3", both, probed_unix_ms=1000)))
            tell(report("h4", "10.0.0.5", table("h5", "tor1b", 1000)))
            while not plans:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)
            before = len(plans)
            tell(report("h0", "10.0.0.1", table("h2", "agg2", ms())))  # agg1 lost
            while len(plans) == before:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)
            # h1 probes again, keeps its agg2 path; h4 then loses tor1b, which h1 crosses
            tell(report("h1", "10.0.0.2", PathTable("h3", both[1:], probed_unix_ms=ms())))
            await asyncio.sleep(0.1)
            tell(report("h4", "10.0.0.5", table("h5", "agg9", ms())))
            for _ in range(100):
                if any(not p.causes[0].startswith("reprobe") for p in plans[before:]):
                    break
                await asyncio.sleep(0.02)
            return plans[before:]
        finally:
            await ld.stop()

    plans = asyncio.run(run())
    replanned = [p for p in plans if not p.causes[0].startswith("reprobe")]
    assert len(replanned) == 1  # within the 30 s settle: nobody left to wait for
    assert replanned[0].causes[0] == "path table changed: h0"
