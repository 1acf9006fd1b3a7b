"""After a failure the leader re-plans once, when the agents concerned have probed again
(cruxd/leader/service.py, _awaiting_reprobe), not once per agent that finds it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cruxd.config.parse import parse_config
from cruxd.control.host_plans import PublishedPlan
from cruxd.control.records import AgentReport, HostInventory, Nic, PathTable, ProbedPath
from cruxd.leader.service import Leader


def leader(tmp_path: Path, settle_s: float, plans: list[PublishedPlan]) -> Leader:
    cfg = parse_config(f"""
[daemon]
roles = ["leader"]
state_dir = "{tmp_path}"
[leader]
listen = "127.0.0.1:0"
debounce_ms = 0
profiling_s = 0
failure_settle_s = {settle_s}
""", "<test>")
    return Leader(cfg, None, plans.append)


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
