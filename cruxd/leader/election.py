"""The leader election and the plan state in etcd (docs/control-plane.md, HA).

A campaign is etcd's usual recipe: a lease, and a transaction that creates
`<prefix>/leader` bound to it only if the key does not exist. The key's create revision
is the winner's term; it names the winner's address for agents and standbys. The key
goes when the lease does: a killed leader is replaced one lease TTL later.

Every write of the active leader is a transaction that first compares the key's create
revision with its term. A leader that lost its lease (paused past it, cut off) cannot
record a generation or save state any more, and it publishes a plan only after recording
its generation: that is the fence. Agents also refuse plans of an older term
(HostPlan.term), for streams still open to a deposed leader.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cruxd.config.model import LeaderConfig
from cruxd.leader.campaign import Campaign
from cruxd.leader.etcd import ClientError, EtcdClient
from cruxd.leader.gc_pause import gc_paused
from cruxd.leader.lease import LeaseKeeper, in_own_thread
from cruxd.leader.store import FORMAT

LOG = logging.getLogger(__name__)
MAX_STATE = 64 << 20  # decompressed; bounds what a bad value in etcd can make us hold


class Lost(Exception):
    """This candidate no longer holds the key (another won, or the lease expired)."""


@dataclass(frozen=True)
class Holder:
    address: str
    host: str
    term: int


class Election:
    def __init__(self, config: LeaderConfig, address: str, host: str,
                 client: EtcdClient | None = None, dscp: int | None = None) -> None:
        self.client = client or EtcdClient(config, dscp=dscp)
        p = config.etcd_prefix
        self.key, self.gen_key, self.plan_key, self.state_key = (
            f"{p}/{k}".encode() for k in ("leader", "generation", "plan", "state"))
        self.ttl = config.etcd_lease_s
        self.me = json.dumps({"address": address, "host": host}).encode()
        self.lease: Any = None
        self.term = 0
        self.error = ""  # the last etcd error, "" once a call succeeds
        self._ok_at = 0.0  # time.monotonic() of the last call that succeeded
        self.on_error: Callable[[str], None] = lambda error: None  # hears `error` change

    def _ok(self) -> None:
        self._ok_at = time.monotonic()
        if self.error:
            LOG.info("etcd reachable again")
            self.error = ""
            self.on_error("")

    def _failed(self, what: str, exc: Exception | str, sent: float | None = None) -> None:
        """A call failed; `sent`: when it was sent. A failure of a call sent before a later
        call succeeded is old news (a keep-alive that timed out across an outage which has
        since ended): it would report etcd unreachable while plans are recorded."""
        if sent is not None and sent < self._ok_at:
            return
        msg = f"etcd {what}: {exc}"
        if msg != self.error:
            LOG.warning("%s", msg)
            self.error = msg
            self.on_error(msg)

    async def win(self, poll_s: float, seen: Callable[[Holder | None], None],
                  waited_on: Callable[[], bool] = lambda: True) -> int:
        """Campaign until this candidate holds the key; its term. `seen` hears who holds
        it meanwhile (None: nobody); `waited_on` says whether agents wait on this
        candidate (Campaign.run). The campaign runs in a thread (cruxd.leader.campaign),
        off a standby's loop that may be busy refusing thousands of agents."""
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        campaign = Campaign(self.client, self.key, self.me, self.ttl)

        def heard(kv: Any) -> None:
            loop.call_soon_threadsafe(seen, _holder(kv) if kv is not None else None)

        try:
            got = await in_own_thread(lambda: campaign.run(
                self.lease, poll_s, stop, heard,
                lambda why: loop.call_soon_threadsafe(self._failed, "campaign", why),
                lambda: loop.call_soon_threadsafe(self._ok), waited_on), "etcd-campaign", stop)
        finally:
            self.lease = campaign.lease or self.lease  # resign() revokes it
        assert got is not None  # only a stop ends the campaign without a win
        self.lease, kv = got
        self.term = int(kv.create_revision)
        return self.term

    async def hold(self) -> str:
        """Keep the lease alive while this leader holds the key; why it stopped holding it.
        Unreachable etcd is not a loss: publishing stops (commit fails) until it is back,
        or until the lease is found expired. The keep-alives go from a thread of their own
        (cruxd.leader.lease): a busy loop let a 10,000-host leader's lease expire."""
        why = await LeaseKeeper(self.client, self.ttl).hold(
            self.lease.id, lambda e, sent: self._failed("lease keep-alive", e, sent), self._ok)
        self.lease = None
        return why

    async def commit(self, **values: bytes) -> str | None:
        """Write `generation`, `plan` and/or `state` in one transaction while holding the
        key: None, or why not. A failed comparison raises Lost."""
        t = self.client.transactions
        keys = {"generation": self.gen_key, "plan": self.plan_key, "state": self.state_key}
        try:
            ok, _ = await self.client.transaction(
                compare=[t.create(self.key) == self.term],
                success=[t.put(keys[k], v) for k, v in values.items()], failure=[])
        except ClientError as exc:
            self._failed("write", exc)
            return self.error
        if not ok:
            raise Lost("another leader holds the election key")
        self._ok()
        return None

    async def load(self) -> tuple[int, dict[str, Any] | None]:
        """The highest generation recorded, and the state to resume (resumed())."""
        return resumed(*await self.read())

    async def read(self) -> tuple[Any, Any, Any]:
        """The generation, plan and state records (None where absent)."""
        gen_kv, plan_kv, state_kv = [await self.client.get(k) for k in
                                     (self.gen_key, self.plan_key, self.state_key)]
        return gen_kv, plan_kv, state_kv

    async def revisions(self) -> tuple[int, ...]:
        """The mod revisions of the records read() reads, in one round trip without their
        values: equal to revisions_of(read()) while none of them is written."""
        return await self.client.mod_revisions((self.gen_key, self.plan_key, self.state_key))

    async def resign(self) -> None:
        if self.lease is not None:
            try:
                await self.client.revoke_lease(self.lease.id)
            except ClientError as exc:
                LOG.warning("etcd: cannot revoke the lease: %s", exc)
            self.lease = None


def resumed(gen_kv: Any, plan_kv: Any, state_kv: Any) -> tuple[int, dict[str, Any] | None]:
    """From read()'s records: the highest generation recorded, and the state to resume,
    the cluster view (saved after each change) with the plan of that generation (saved with
    it). Unreadable values are logged and not resumed. No I/O: a thread may run it."""
    generation = 0
    if gen_kv is not None:
        try:
            generation = int(gen_kv.value)
        except ValueError:
            LOG.error("%s is not a generation (%r...); starting from 0",
                      gen_kv.key.decode(errors="replace"), gen_kv.value[:32])
    with gc_paused():
        view, plan = _decoded(state_kv), _decoded(plan_kv)
    if view is None and plan is None:
        return generation, None
    return generation, {**(view or {"format": FORMAT, "agents": {}, "jobs": {}}),
                        "plan": plan}


def revisions_of(kvs: tuple[Any, ...]) -> tuple[int, ...]:
    """What Election.revisions() says of these records, had it been asked when they were
    read."""
    return tuple(int(kv.mod_revision) if kv is not None else 0 for kv in kvs)


def _decoded(kv: Any) -> Any:
    if kv is None:
        return None
    try:
        return json.loads(zlib.decompressobj().decompress(kv.value, MAX_STATE))
    except (zlib.error, ValueError) as exc:
        LOG.error("%s unreadable (%s); not resumed", kv.key.decode(errors="replace"), exc)
        return None


def encode_state(text: str) -> bytes:
    """A state or plan document's JSON (codec_json.to_json), as stored in etcd."""
    return zlib.compress(text.encode(), 3)


def _holder(kv: Any) -> Holder | None:
    try:
        d = json.loads(kv.value)
        return Holder(str(d["address"]), str(d["host"]), int(kv.create_revision))
    except (ValueError, KeyError, TypeError):
        LOG.warning("the election key holds %r..., not a leader record", kv.value[:64])
        return None
