"""The candidate agents wait on wins the election (cruxd.leader.campaign), on a real
single-member etcd. Agents that lost their leader ask the next candidate they know of, which
holds their calls; had another candidate won, each agent would have been sent on, a second
call each (4-5 s more to a failover of 10,000 agents, bench/ha.py --simulated). A candidate
nobody waits on takes a free key only at its second look that finds it free."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from cruxd.config.parse import parse_config
from cruxd.leader.election import Election
from cruxd.testing.etcd_rig import EtcdCluster, etcd_missing

pytestmark = [pytest.mark.skipif(etcd_missing() is not None, reason=etcd_missing() or ""),
              pytest.mark.slow]
POLL_S = 0.5  # cruxd.leader.ha.POLL_S


def _election(endpoints: Sequence[str], name: str) -> Election:
    config = parse_config(f'[leader]\nha = "etcd"\netcd_endpoints = {list(endpoints)!r}\n'
                          "etcd_insecure = true\netcd_lease_s = 2\n", "<test>").leader
    return Election(config, f"10.0.0.{name[-1]}:7470", name)


def _is(c: Election, waited: Election) -> Callable[[], bool]:
    return lambda: c is waited


def test_of_two_standbys_the_one_agents_wait_on_takes_the_freed_key(tmp_path: Path) -> None:
    etcd = EtcdCluster(tmp_path, members=1).start()

    async def run() -> list[tuple[str, str]]:
        old, a, b = (_election(etcd.endpoints, n) for n in ("l0", "l1", "l2"))
        rounds = []
        try:
            for i in range(6):  # each candidate waited on in turn: not who campaigns first
                waited = a if i % 2 else b
                await old.win(POLL_S, lambda h: None)
                tasks = {asyncio.create_task(c.win(POLL_S, lambda h: None,
                                                   _is(c, waited))): c for c in (a, b)}
                await asyncio.sleep(2 * POLL_S)  # both have seen the key held
                await old.resign()  # the active leader's lease ends: the key is free
                done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                winner = tasks[done.pop()]
                rounds.append((winner.me.decode(), waited.me.decode()))
                await winner.resign()
        finally:
            for c in (old, a, b):
                await c.client.close()
        return rounds

    try:
        rounds = asyncio.run(run())
    finally:
        etcd.stop()
    for won, waited in rounds:
        assert won == waited


def test_a_standby_nobody_waits_on_is_elected_a_poll_later(tmp_path: Path) -> None:
    etcd = EtcdCluster(tmp_path, members=1).start()

    async def run() -> float:
        el = _election(etcd.endpoints, "l1")
        try:
            started = time.monotonic()
            await el.win(POLL_S, lambda h: None, lambda: False)
            took = time.monotonic() - started
            await el.resign()
            return took
        finally:
            await el.client.close()

    try:
        took = asyncio.run(run())
    finally:
        etcd.stop()
    # its first look found the key free, its second took it
    assert took >= POLL_S
