"""A standby's campaign for the election key, run in a thread of its own on a blocking
channel to etcd (the same target, TLS and DSCP as the leader's asyncio client).

When the active leader of 10,000 hosts dies, every agent tries the candidates in turn,
and the standbys' event loops refuse about 20,000 calls (bench/ha.py --simulated 10000,
docs/benchmarks.md). Campaigning from a thread keeps the election off that loop; it needs
the GIL only to build and read a few small messages. (Measured with it: a standby wins
1-2 s after the kill. The take-over's remaining time was rebuilding the saved view.)
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
            ok: Callable[[], object]) -> tuple[LeaseRef, Any] | None:
        """`seen(kv or None)` hears who holds the key after each look; `failed(why)` each
        etcd error, `ok()` each good look (all called from this thread: the caller hands
        them to its loop)."""
        channel = self._client.blocking_channel()
        kv_stub, lease_stub = rpc.KVStub(channel), rpc.LeaseStub(channel)
        md = self._client.metadata
        try:
            while not stop.is_set():
                try:
                    if lease is None:
                        lease = self.lease = LeaseRef(lease_stub.LeaseGrant(
                            rpc.LeaseGrantRequest(TTL=self._ttl), timeout=RPC_TIMEOUT_S,
                            metadata=md).ID)
                    won = kv_stub.Txn(rpc.TxnRequest(
                        compare=[rpc.Compare(result=rpc.Compare.EQUAL,
                                             target=rpc.Compare.VERSION, key=self._key,
                                             version=0)],
                        success=[rpc.RequestOp(request_put=rpc.PutRequest(
                            key=self._key, value=self._me, lease=lease.id))]),
                        timeout=RPC_TIMEOUT_S, metadata=md).succeeded
                    got = kv_stub.Range(rpc.RangeRequest(key=self._key),
                                        timeout=RPC_TIMEOUT_S, metadata=md).kvs
                    kv = got[0] if got else None
                    ok()
                    seen(kv)
                    if kv is not None and kv.lease == lease.id:  # ours (now, or still)
                        return lease, kv
                    if not won and keep_alive(lease_stub, lease.id, md) <= 0:
                        lease = None  # expired while we waited: a new one next look
                except (grpc.RpcError, StopIteration) as exc:
                    failed(why_failed(exc))
                stop.wait(poll_s)
            return None
        finally:
            channel.close()
