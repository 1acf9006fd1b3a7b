"""The active leader's etcd lease survives a busy event loop (cruxd/leader/lease.py), on a
real single-member etcd: at 10,000 hosts the loop is busy for seconds, and a keep-alive
sent from it let the lease expire (bench/ha.py --simulated 10000)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from cruxd.config.parse import parse_config
from cruxd.leader.election import Election
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
        config = parse_config(f'[leader]\nha = "etcd"\netcd_endpoints = {etcd.endpoints!r}\n'
                              "etcd_insecure = true\n",
                              "<test>").leader
        client = EtcdClient(config)
        try:
            lease = await client.lease(TTL_S)
            hold = asyncio.create_task(LeaseKeeper(client, TTL_S).hold(
                lease.id, lambda why, sent: errors.append(why), lambda: oks.append(1)))
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


def test_a_failure_older_than_a_success_is_not_reported() -> None:
    """A keep-alive sent during an outage may time out after etcd is back and a commit
    has gone through: reporting it would say plans are not published while they are."""
    config = parse_config('[leader]\nha = "etcd"\netcd_endpoints = ["127.0.0.1:1"]\n'
                          "etcd_insecure = true\n",
                          "<test>").leader
    el = Election(config, "127.0.0.1:7470", "h0", client=object())  # type: ignore[arg-type]
    heard: list[str] = []
    el.on_error = heard.append
    sent = time.monotonic()
    el._failed("write", "DEADLINE_EXCEEDED")  # the outage
    el._ok()  # etcd back: a commit succeeded
    el._failed("lease keep-alive", "DEADLINE_EXCEEDED", sent)  # sent before that success
    assert el.error == "" and heard == ["etcd write: DEADLINE_EXCEEDED", ""]
    el._failed("lease keep-alive", "DEADLINE_EXCEEDED", time.monotonic())  # a new failure
    assert el.error == "etcd lease keep-alive: DEADLINE_EXCEEDED"
