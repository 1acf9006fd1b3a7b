"""Jobs and the host-to-host flows their collectives produce per iteration."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise


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


def pipeline_p2p(hosts: Sequence[tuple[str, int]], stages: int, bytes_per_direction: float,
                 nic_ports: Mapping[str, int]) -> tuple[FlowSpec, ...]:
    """Inter-host flows of a pipeline's stage-to-stage traffic per iteration.

    The job's GPUs, in ring order, are cut into `stages` equal stages. At every stage
    boundary the whole batch's activations cross forward and their gradients back:
    `bytes_per_direction` per boundary (Megatron with the scatter-gather optimisation
    sends each micro-batch once per boundary, split over the TP ranks). A host sends
    its share (its GPUs over the stage's) to the host at the same position of the next
    stage, spread over the NIC rails; pairs on the same host stay off the network.
    """
    gpus = sum(g for _, g in hosts)
    if stages < 2 or gpus < stages or bytes_per_direction <= 0:
        return ()
    per_stage: list[list[tuple[str, int]]] = [[] for _ in range(stages)]
    seen = 0
    for host, g in hosts:  # a host whose GPUs straddle a boundary joins its first stage
        per_stage[min(stages - 1, seen * stages // gpus)].append((host, g))
        seen += g
    flows: list[FlowSpec] = []
    for here, there in pairwise(per_stage):
        if not here or not there:
            continue
        size = sum(g for _, g in here)
        for i, (src, g) in enumerate(here):
            dst = there[i % len(there)][0]
            if src == dst:
                continue
            share = bytes_per_direction * g / size
            channels = max(1, min(nic_ports.get(src, 1), nic_ports.get(dst, 1)))
            for c in range(channels):
                flows.append(FlowSpec(src, dst, share / channels, c, c))
                flows.append(FlowSpec(dst, src, share / channels, c, c))
    return tuple(flows)


def all_to_all(hosts: Sequence[tuple[str, int]], bytes_per_gpu: float,
               nic_ports: Mapping[str, int]) -> tuple[FlowSpec, ...]:
    """Inter-host flows of an all-to-all in which every GPU sends `bytes_per_gpu`, spread
    evenly over all the job's GPUs (an embedding exchange): host a sends host b
    bytes_per_gpu * g_a * g_b / G. One flow per host pair, on rail (pair index mod
    rails), as NCCL's all-to-all spreads peers over channels."""
    gpus = sum(g for _, g in hosts)
    if len(hosts) < 2 or bytes_per_gpu <= 0:
        return ()
    flows: list[FlowSpec] = []
    for i, (src, ga) in enumerate(hosts):
        for j, (dst, gb) in enumerate(hosts):
            if i == j or src == dst:
                continue
            rails = max(1, min(nic_ports.get(src, 1), nic_ports.get(dst, 1)))
            port = (i + j) % rails
            flows.append(FlowSpec(src, dst, bytes_per_gpu * ga * gb / gpus, port, port))
    return tuple(flows)
