"""The active leader's etcd lease, kept alive from a thread of its own.

A leader of 10,000 hosts keeps its event loop busy for seconds at a time: thousands of
Reports queue at start-up and after a failover, and a plan's serialisation holds the
GIL. A keep-alive sent from that loop waited behind all of it: with a 2 s lease, a
leader of 10,000 simulated hosts lost its lease every 7-10 s and the three candidates
took turns for minutes (bench/ha.py --simulated 10000, docs/benchmarks.md). The thread
here waits on a blocking gRPC call, which releases the GIL, and needs the GIL only for
the microseconds it takes to build and read one small message, so the keep-alive goes
out on time whatever the loop is doing.

Errors and the lease's end are handed back to the loop (call_soon_threadsafe); the thread
touches no leader state.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import grpc
from aetcd import rpc

from cruxd.leader.etcd import RPC_TIMEOUT_S, EtcdClient


class LeaseKeeper:
    def __init__(self, client: EtcdClient, ttl_s: float) -> None:
        self._client = client
        self._every_s = ttl_s / 3

    async def hold(self, lease_id: int, on_error: Callable[[str], None],
                   on_ok: Callable[[], None]) -> str:
        """Keep `lease_id` alive until it is found expired: the reason. Each failed
        keep-alive calls on_error(why) on this loop, each good one on_ok(). Cancel to
        stop (the thread ends within one interval)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[str] = loop.create_future()
        stop = threading.Event()

        def finish(why: str) -> None:
            if not done.done():
                done.set_result(why)

        thread = threading.Thread(
            target=self._run, name="etcd-lease", daemon=True,
            args=(lease_id, stop, lambda f, *a: loop.call_soon_threadsafe(f, *a),
                  finish, on_error, on_ok))
        thread.start()
        try:
            return await done
        finally:
            stop.set()

    def _run(self, lease_id: int, stop: threading.Event,
             to_loop: Callable[..., object], finish: Callable[[str], None],
             on_error: Callable[[str], None], on_ok: Callable[[], None]) -> None:
        target, options, creds = self._client.channel_args()
        channel = (grpc.secure_channel(target, creds, options=options) if creds is not None
                   else grpc.insecure_channel(target, options=options))
        stub = rpc.LeaseStub(channel)
        try:
            while not stop.wait(self._every_s):
                try:
                    ttl = keep_alive(stub, lease_id, self._client.metadata)
                except (grpc.RpcError, StopIteration) as exc:
                    to_loop(on_error, why_failed(exc))
                    continue
                if ttl <= 0:
                    to_loop(finish, "the lease expired")
                    return
                to_loop(on_ok)
        except RuntimeError:  # call_soon_threadsafe on a closed loop
            return
        finally:
            channel.close()


def keep_alive(stub: Any, lease_id: int, metadata: Any) -> int:
    """One keep-alive of `lease_id` on a blocking LeaseStub: the TTL left (<= 0: gone)."""
    reply = next(iter(stub.LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]),
                                          timeout=RPC_TIMEOUT_S, metadata=metadata)))
    return int(reply.TTL)


def why_failed(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError) and isinstance(exc, grpc.Call):
        return f"{exc.code().name}: {exc.details()}"
    return "no keep-alive reply"
