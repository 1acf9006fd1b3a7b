"""The active leader's etcd lease, kept alive from a thread of its own.

A leader of 10,000 hosts keeps its event loop busy for seconds at a time: thousands of
Reports queue at start-up and after a failover, and a plan's serialisation holds the
GIL. A keep-alive sent from that loop waited behind all of it: with a 2 s lease, a
leader of 10,000 simulated hosts lost its lease every 7-10 s and the three candidates
took turns for minutes (bench/ha.py --simulated 10000, docs/benchmarks.md). The thread
here waits on a blocking gRPC call, which releases the GIL, and needs the GIL only for
the microseconds it takes to build and read one small message, so the keep-alive goes
out on time whatever the loop is doing.

Errors and the lease's end are handed back to the loop; the thread touches no leader state.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from aetcd import rpc

from cruxd.leader.etcd import RPC_TIMEOUT_S, EtcdClient

T = TypeVar("T")


async def in_own_thread(fn: Callable[[], T], name: str, stop: threading.Event) -> T:
    """fn() in a daemon thread of its own, its result or exception here. Not the default
    executor's: a campaign or a term runs for as long as the process may. Leaving (a
    cancel included) sets `stop`, which fn watches."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not done.done():
            done.set_result(value) if ok else done.set_exception(value)

    def run() -> None:
        outcome: tuple[bool, Any]
        try:
            outcome = True, fn()
        except Exception as exc:  # the awaiting task gets it
            outcome = False, exc
        with contextlib.suppress(RuntimeError):  # the loop closed: the daemon stops
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name=name, daemon=True).start()
    try:
        return await done
    finally:
        stop.set()


class LeaseKeeper:
    def __init__(self, client: EtcdClient, ttl_s: float) -> None:
        self._client = client
        self._every_s = ttl_s / 3

    async def hold(self, lease_id: int, on_error: Callable[[str, float], None],
                   on_ok: Callable[[], None]) -> str:
        """Keep `lease_id` alive until it is found expired: the reason. Each failed
        keep-alive calls on_error(why, when it was sent: time.monotonic()) on this loop,
        each good one on_ok(). Cancel to stop (the thread ends within one interval)."""
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        return await in_own_thread(
            lambda: self._run(lease_id, stop, loop, on_error, on_ok), "etcd-lease", stop)

    def _run(self, lease_id: int, stop: threading.Event, loop: asyncio.AbstractEventLoop,
             on_error: Callable[[str, float], None], on_ok: Callable[[], None]) -> str:
        channel = self._client.blocking_channel()
        stub = rpc.LeaseStub(channel)
        try:
            while not stop.wait(self._every_s):
                sent = time.monotonic()
                try:
                    ttl = keep_alive(stub, lease_id, self._client.metadata)
                except (grpc.RpcError, StopIteration) as exc:
                    loop.call_soon_threadsafe(on_error, why_failed(exc), sent)
                    continue
                if ttl <= 0:
                    return "the lease expired"
                loop.call_soon_threadsafe(on_ok)
            return "stopped"
        except RuntimeError:  # call_soon_threadsafe on a closed loop: the daemon stops
            return "stopped"
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
