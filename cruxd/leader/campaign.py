"""A standby's campaign for the election key, run in a thread of its own on a blocking
channel to etcd (the same target, TLS and DSCP as the leader's asyncio client).

When the active leader of 10,000 hosts dies, every agent tries the candidates in turn,
and the standbys' event loops refuse about 20,000 calls (bench/ha.py --simulated 10000,
docs/benchmarks.md). Campaigning from a thread keeps the election off that loop; it needs
the GIL only to build and read a few small messages. (Measured with it: a standby wins
1-2 s after the kill. The take-over's remaining time was rebuilding the saved view.)

The candidate the agents went to wins when it can. Agents that lost their leader ask the
next candidate they know of, which holds their calls until the election moves
(cruxd.leader.rpcs); if another candidate then wins, each agent is sent on, a second call
each: 4-5 s more to a failover of 10,000 agents. So a candidate that agents wait on tries
for the key at every look and looks every WAITED_ON_POLL_S, and one that nobody waits on
takes a free key only at its second look that finds it free, a poll later. Safety is
etcd's either way; a candidate nobody waits on, alone or with none that agents chose,
is elected one poll later than it would have been.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from aetcd import rpc

from cruxd.leader.etcd import RPC_TIMEOUT_S, EtcdClient
from cruxd.leader.lease import keep_alive, why_failed

WAITED_ON_POLL_S = 0.1  # how often a candidate that agents wait on looks at the key


@dataclass(frozen=True)
class LeaseRef:
    id: int


class Campaign:
    """One candidate's campaign: `run` blocks (call it from a thread) until this candidate
    holds `key`, returning (lease, the key's record), or until `stop` is set (None)."""

    def __init__(self, client: EtcdClient, key: bytes, me: bytes, ttl_s: int) -> None:
        self._client = client
        self.lease: LeaseRef | None = None  # the latest lease granted (read after a cancel)
        self._key, self._me, self._ttl = key, me, ttl_s

    def run(self, lease: LeaseRef | None, poll_s: float, stop: threading.Event,
            seen: Callable[[Any], object], failed: Callable[[str], object],
            ok: Callable[[], object], waited_on: Callable[[], bool] = lambda: True
            ) -> tuple[LeaseRef, Any] | None:
        """`seen(kv or None)` hears who holds the key after each look; `failed(why)` each
        etcd error, `ok()` each good look (all called from this thread: the caller hands
        them to its loop). `waited_on()`: whether agents wait on this candidate now."""
        channel = self._client.blocking_channel()
        kv_stub, lease_stub = rpc.KVStub(channel), rpc.LeaseStub(channel)
        md = self._client.metadata
        free_looks = 0  # looks in a row that found the key free
        try:
            while not stop.is_set():
                hurry = False
                try:
                    if lease is None:
                        lease = self.lease = LeaseRef(lease_stub.LeaseGrant(
                            rpc.LeaseGrantRequest(TTL=self._ttl), timeout=RPC_TIMEOUT_S,
                            metadata=md).ID)
                    hurry = waited_on()
                    won = (hurry or free_looks > 0) and kv_stub.Txn(rpc.TxnRequest(
                        compare=[rpc.Compare(result=rpc.Compare.EQUAL,
                                             target=rpc.Compare.VERSION, key=self._key,
                                             version=0)],
                        success=[rpc.RequestOp(request_put=rpc.PutRequest(
                            key=self._key, value=self._me, lease=lease.id))]),
                        timeout=RPC_TIMEOUT_S, metadata=md).succeeded
                    got = kv_stub.Range(rpc.RangeRequest(key=self._key),
                                        timeout=RPC_TIMEOUT_S, metadata=md).kvs
                    kv = got[0] if got else None
                    free_looks = free_looks + 1 if kv is None else 0
                    ok()
                    seen(kv)
                    if kv is not None and kv.lease == lease.id:  # ours (now, or still)
                        return lease, kv
                    if not won and keep_alive(lease_stub, lease.id, md) <= 0:
                        lease = None  # expired while we waited: a new one next look
                except (grpc.RpcError, StopIteration) as exc:
                    failed(why_failed(exc))
                stop.wait(min(poll_s, WAITED_ON_POLL_S) if hurry else poll_s)
            return None
        finally:
            channel.close()
