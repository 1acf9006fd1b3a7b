"""The etcd client the HA leader and the agents use: aetcd (asyncio, maintained, on the
same grpcio and protobuf as crux), on one channel to every member.

aetcd dials one host:port in plaintext. Its `connect` is the one place a channel is made,
so this subclass makes ours there instead: round robin over all members' addresses (a
dead member is skipped without a reconnect by hand) and mutual TLS where configured.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from pathlib import Path

import aetcd
import grpc
from aetcd import rpc, watcher

from cruxd.config.hostport import parse_hostport
from cruxd.config.model import LeaderConfig
from cruxd.errors import UsageError
from cruxd.rpc.tls import dscp_options

RPC_TIMEOUT_S = 2.0
ClientError = aetcd.ClientError
__all__ = ["ClientError", "EtcdClient", "target"]


def target(endpoints: tuple[str, ...]) -> str:
    """A gRPC target naming every member: `ipv4:a:p,b:q` (names resolved once, here)."""
    v4: list[str] = []
    v6: list[str] = []
    for ep in endpoints:
        host, port = parse_hostport(ep)
        try:
            addrs = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise UsageError(f"cannot resolve {host}: {exc}",
                                 where="leader.etcd_endpoints") from None
            addrs = [ipaddress.ip_address(i[4][0]) for i in infos]
        for a in dict.fromkeys(addrs):
            (v4.append(f"{a}:{port}") if a.version == 4 else v6.append(f"[{a}]:{port}"))
    return f"ipv4:{','.join(v4)}" if v4 else f"ipv6:{','.join(v6)}"


def _read(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}", where="leader.etcd_ca") from None


class EtcdClient(aetcd.Client):  # type: ignore[misc]  # aetcd ships no types
    def __init__(self, config: LeaderConfig, timeout: float = RPC_TIMEOUT_S,
                 dscp: int | None = None) -> None:
        super().__init__(timeout=timeout)
        self._dscp = dscp  # [control] dscp: crux's etcd traffic is control traffic too
        self._target = target(config.etcd_endpoints)
        self._tls = (config.etcd_ca, config.etcd_cert, config.etcd_key)

    def channel_args(self) -> tuple[str, list[tuple[str, object]],
                                    grpc.ChannelCredentials | None]:
        """(target, options, credentials or None): the same channel for aio and blocking."""
        options: list[tuple[str, object]] = [
            ("grpc.lb_policy_name", "round_robin"), ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000), *dscp_options(self._dscp)]
        ca, cert, key = (_read(p) for p in self._tls)
        creds = grpc.ssl_channel_credentials(ca, key, cert) if ca is not None else None
        return self._target, options, creds

    def blocking_channel(self) -> grpc.Channel:
        """A blocking channel to the same members, for the threads that campaign and keep
        the lease (cruxd.leader.campaign, cruxd.leader.lease)."""
        target_, options, creds = self.channel_args()
        if creds is not None:
            return grpc.secure_channel(target_, creds, options=options)
        return grpc.insecure_channel(target_, options=options)

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        target_, options, creds = self.channel_args()
        if creds is not None:
            self.channel = grpc.aio.secure_channel(target_, creds, options=options)
        else:
            self.channel = grpc.aio.insecure_channel(target_, options=options)
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self._watcher = watcher.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout,
                                        metadata=self.metadata)
        self._connected.set()

    async def mod_revisions(self, keys: Sequence[bytes]) -> tuple[int, ...]:
        """Each key's mod revision (0: absent), in one round trip and as of one revision:
        a transaction of keys-only ranges, so a hot standby can tell whether its copy of
        the state is current without fetching the (megabytes of) values."""
        await self.connect()
        request = rpc.TxnRequest(success=[
            rpc.RequestOp(request_range=rpc.RangeRequest(key=k, keys_only=True)) for k in keys])
        try:
            reply = await self.kvstub.Txn(request, timeout=self._timeout, metadata=self.metadata)
        except grpc.RpcError as exc:  # as aetcd's own calls report it
            raise ClientError(f"{exc.code().name}: {exc.details()}") from exc
        return tuple(int(r.response_range.kvs[0].mod_revision) if r.response_range.kvs else 0
                     for r in reply.responses)
