"""Jobs and the host-to-host flows their collectives produce per iteration."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FlowSpec:
    """Bytes a job sends from one host to another in every iteration.

    `src_port`/`dst_port` pin the flow to a NIC rail (NCCL binds a channel to one
    NIC per host); None lets path selection use any of the host's NIC links.
    """

    src: str
    dst: str
    bytes: float
    src_port: int | None = None
    dst_port: int | None = None


@dataclass(frozen=True)
class Job:
    """A training job as the scheduler sees it.

    compute_s: GPU compute time per iteration, standalone.
    flops: W_j, computation per iteration (FLOPs, summed over the job's GPUs).
    overlap: fraction of compute that communication may overlap; communication
        starts once (1 - overlap) of the compute is done (seed Fig. 12 uses 0.5).
    comm_s: measured t_j (seconds per iteration); None -> derived from flows and paths.
    declared: W_j/t_j are what the job declared, not what was measured. A job must not
        raise its own priority by declaring: such jobs rank below every measured job, and
        their intensity is capped at the lowest measured one (docs/security.md).
    """

    id: str
    hosts: tuple[tuple[str, int], ...]  # (host, GPUs on it), in ring order
    compute_s: float
    flops: float
    overlap: float
    flows: tuple[FlowSpec, ...]
    pattern: str = "flows"
    comm_s: float | None = None
    declared: bool = False

    @property
    def gpus(self) -> int:
        return sum(g for _, g in self.hosts)

    @property
    def network_bytes(self) -> float:
        """Bytes per iteration that cross the network (intra-host hops excluded)."""
        return sum(f.bytes for f in self.flows if f.src != f.dst)


def ring_allreduce(hosts: Sequence[tuple[str, int]], size_bytes: float,
                   nic_ports: Mapping[str, int]) -> tuple[FlowSpec, ...]:
    """Inter-host flows of one ring all-reduce of `size_bytes` over the job's ranks.

    NCCL's ring visits every rank (GPU); intra-host hops ride NVLink, and each
    host-to-host hop of the ring carries 2(K-1)/K * size bytes, K = number of ranks.
    The ring is split into one channel per NIC rail shared by both hosts, each
    channel pinned to NIC port c on both ends, as NCCL binds channels to NICs.
    """
    ranks = sum(g for _, g in hosts)
    if len(hosts) < 2 or ranks < 2:
        return ()
    per_hop = 2.0 * (ranks - 1) / ranks * size_bytes
    flows: list[FlowSpec] = []
    for i, (src, _) in enumerate(hosts):
        dst = hosts[(i + 1) % len(hosts)][0]
        channels = max(1, min(nic_ports.get(src, 1), nic_ports.get(dst, 1)))
        for c in range(channels):
            flows.append(FlowSpec(src, dst, per_hop / channels, c, c))
    return tuple(flows)
