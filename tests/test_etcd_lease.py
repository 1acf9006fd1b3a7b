"""The active leader's etcd lease survives a busy event loop (cruxd/leader/lease.py), on a
real single-member etcd: at 10,000 hosts the loop is busy for seconds, and a keep-alive
sent from it let the lease expire (bench/ha.py --simulated 10000)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from cruxd.config.parse import parse_config
from cruxd.leader.etcd import EtcdClient
from cruxd.leader.lease import LeaseKeeper
from cruxd.testing.etcd_rig import EtcdCluster, etcd_missing

pytestmark = [pytest.mark.skipif(etcd_missing() is not None, reason=etcd_missing() or "")]
TTL_S = 2


def test_the_lease_outlives_a_loop_blocked_past_it(tmp_path: Path) -> None:
    etcd = EtcdCluster(tmp_path, members=1).start()
    errors: list[str] = []
    oks: list[int] = []

    async def run() -> tuple[int, str | None]:
        config = parse_config(f'[leader]\nha = "etcd"\netcd_endpoints = {etcd.endpoints!r}\n',
                              "<test>").leader
        client = EtcdClient(config)
        try:
            lease = await client.lease(TTL_S)
            hold = asyncio.create_task(LeaseKeeper(client, TTL_S).hold(
                lease.id, errors.append, lambda: oks.append(1)))
            await asyncio.sleep(0.1)  # the keeper's thread is up
            end = time.monotonic() + 2.5 * TTL_S
            while time.monotonic() < end:  # the loop busy in Python, past the lease
                sum(range(10_000))
            left = (await client.get_lease_info(lease.id)).TTL
            await asyncio.sleep(TTL_S / 2)  # the answers queued meanwhile reach the loop
            done = hold.result() if hold.done() else None
            hold.cancel()
            await asyncio.gather(hold, return_exceptions=True)
            return left, done
        finally:
            await client.close()

    try:
        left, done = asyncio.run(run())
    finally:
        etcd.stop()
    assert done is None  # never "the lease expired"
    assert left > 0, "the lease expired while the loop was busy"
    assert not errors and len(oks) >= 3
