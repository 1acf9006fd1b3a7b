"""Where an agent finds the active leader under `[leader] ha = "etcd"`: the election key
in etcd, read when its leader stops answering (not watched: 10,000 agents reading once
per failover cost etcd less than 10,000 standing watches)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from cruxd.config.model import LeaderConfig

if TYPE_CHECKING:
    from cruxd.leader.etcd import EtcdClient


class LeaderFinder:
    def __init__(self, config: LeaderConfig, dscp: int | None) -> None:
        self.config = config
        self.dscp = dscp  # [control] dscp of the etcd channel
        self.key = f"{config.etcd_prefix}/leader".encode()
        self._client: EtcdClient | None = None

    async def __call__(self) -> str | None:
        """The active leader's address, or None (no leader elected, or not readable)."""
        holder = await self.holder(fresh=False)  # any member answers
        return holder[0] if holder else None

    async def term(self) -> int | None:
        """The active leader's term as etcd records it (None: nobody holds the key): the
        election key's create revision, which etcd assigns, so no leader can claim a term
        it did not win (issue 37: a plan of term 2^62 from whoever answered). Read from the
        raft leader: a lagging member may not know the newest election yet."""
        holder = await self.holder(fresh=True)
        return holder[1] if holder else None

    async def holder(self, fresh: bool) -> tuple[str, int] | None:
        """(address, term) of the election key's holder, or None."""
        if self._client is None:
            from cruxd.leader.etcd import EtcdClient  # aetcd only on hosts that use it

            self._client = EtcdClient(self.config, dscp=self.dscp)
        kv = await self._client.get(self.key, serializable=not fresh)
        if kv is None:
            return None
        try:
            address = json.loads(kv.value)["address"]
        except (ValueError, KeyError, TypeError):
            return None
        ok = isinstance(address, str) and 0 < len(address) <= 300
        return (address, int(kv.create_revision)) if ok else None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
