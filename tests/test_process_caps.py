"""Each registered process holds one descriptor in the agent: one job, or one user, may
register at most agent.max_processes_per_job / max_processes_per_user of them (issue 37,
item 8: 1,100 processes of one job starved an agent of nofile 1024)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from cruxd.agent.core import Agent
from cruxd.agent.local_api import Refusal, Refused
from cruxd.agent.local_server import PeerCred
from cruxd.config.parse import parse_config
from cruxd.control.records import LocalJob, Measurement


def test_processes_per_job_and_per_user_are_capped(short_dir: Path) -> None:
    d = short_dir
    (d / "run").mkdir()
    config = parse_config(
        f'[daemon]\nhost_id = "h0"\nstate_dir = "{d}/state"\nruntime_dir = "{d}/run"\n'
        '[agent]\nleader = "127.0.0.1:1"\ngpus = 0\naddresses = ["127.0.0.1"]\n'
        "max_processes_per_job = 3\nmax_processes_per_user = 5\n", "<t>")
    agent = Agent(config, "127.0.0.1:1")
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(8)]
    user = 4242  # a non-root user's processes (the uid is what the socket's peer says)

    def cred(k: int, uid: int = user) -> PeerCred:
        return PeerCred(procs[k].pid, uid, uid)

    async def run() -> None:
        await agent.start()
        try:
            for k in range(3):
                agent.register(LocalJob("a", 8), Measurement(), cred(k))
            agent.register(LocalJob("a", 8), Measurement(), cred(0))  # again: no new one
            with pytest.raises(Refused) as per_job:
                agent.register(LocalJob("a", 8), Measurement(), cred(3))
            assert per_job.value.reason is Refusal.EXHAUSTED
            assert "agent.max_processes_per_job" in str(per_job.value)
            for k in (3, 4):  # another job of the same user: 5 processes in all
                agent.register(LocalJob("b", 8), Measurement(), cred(k))
            with pytest.raises(Refused) as per_user:
                agent.register(LocalJob("c", 8), Measurement(), cred(5))
            assert "agent.max_processes_per_user" in str(per_user.value)
            # root is not capped per user, only per job
            agent.register(LocalJob("d", 8), Measurement(), cred(6, uid=0))
            assert agent.registry.processes("a") == 3 and agent.registry.processes_of(user) == 5
            assert agent.rejected == 2
        finally:
            await agent.stop()

    try:
        asyncio.run(run())
    finally:
        for p in procs:
            p.kill()
            p.wait()
