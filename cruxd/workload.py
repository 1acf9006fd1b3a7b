"""Synthetic training jobs for benchmarks and simulation: pure, seeded, no I/O.

Job sizes (GPUs per job) follow the seed's two-week trace (§2.2: over 10% of the
jobs use >= 128 GPUs, the largest 512, most jobs are small):

    GPUs  8     16    32    64    128   256   512
    P     0.35  0.20  0.15  0.15  0.08  0.05  0.02      (>= 128 GPUs: 15%)

Sizes above `max_gpus` or above the fabric's GPU count are dropped and the rest
renormalised (if no size is left, every job gets min(max_gpus, fabric GPUs)).

Models (base values; each job draws around them):

    kind    parameters     gradient bytes   compute/iter (s)  overlap
    gpt     1.5e9 fp16     3.0e9            1.0 - 1.6         0.3
    t5      0.77e9 fp16    1.54e9           0.5 - 0.8         0.4
    bert    0.34e9 fp16    0.68e9           0.25 - 0.4        0.5
    vgg     138e6 fp32     0.55e9           0.15 - 0.25       0.6
    resnet  25.6e6 fp32    0.1e9            0.1 - 0.15        0.8

Compute time is uniform in its range, gradient bytes are the base times U(0.8, 1.2),
overlap is the base + U(-0.05, 0.05). Jobs of >= 128 GPUs are GPT variants as in
the trace (gpt 80%, t5 20%); smaller ones mix gpt 20%, t5 10%, bert 30%, vgg 15%,
resnet 25%. W_j = GPUs * compute_s * 100 TFLOP/s. Every job is data parallel: one
ring all-reduce of its gradients per iteration (`ring_allreduce`, one channel per
NIC rail). Ids are "job<draw index, 4 digits>-<kind>", e.g. "job0042-gpt".

Placement imitates a packing GPU scheduler. Hosts are taken in topology order,
which the builders number ToR by ToR, so "next host" approximates "same ToR first,
then the neighbouring ToRs". A cursor remembers where the last job ended and the
search goes on from there, wrapping around (next fit):
  * a job larger than a host takes whole, entirely free hosts;
  * a job that fits one host goes, with probability 1/2, to two hosts (half of its
    GPUs on each, e.g. 4 + 4) so that it still sends traffic over the network;
    otherwise (or when no two hosts have room) to a single host, where it has no
    network flows.
`exclusive=True`: GPUs are never oversubscribed. A job that does not fit in the
free GPUs is skipped (its draw is still made, so the other jobs do not change), so
fewer than `count` jobs may come back; the ids then have gaps.
`exclusive=False`: when a job does not fit, the whole fabric is freed again and
placement continues round-robin from the cursor, so every job is placed and
thousands of concurrent jobs fit on a 2,000-GPU fabric. THIS OVERSUBSCRIBES GPUs
(a GPU may belong to many jobs at once); it is only meant for measuring planner
latency at scale, not for modelling a real cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cruxd.model.jobs import Job, ring_allreduce
from cruxd.model.topology import Topology

SIZES: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512)
SIZE_PROBS: tuple[float, ...] = (0.35, 0.20, 0.15, 0.15, 0.08, 0.05, 0.02)
LARGE_JOB_GPUS = 128  # from this size on, jobs are GPT variants (trace, §2.2)
SPLIT_PROB = 0.5  # chance that a job fitting one host is spread over two
FLOPS_PER_GPU = 100e12  # sustained FLOP/s of one GPU while computing
BYTES_JITTER = (0.8, 1.2)
OVERLAP_JITTER = 0.05
MAX_OVERLAP = 0.95

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class ModelProfile:
    kind: str
    grad_bytes: float  # all-reduced per iteration
    compute_s: tuple[float, float]  # per iteration, uniform in [lo, hi]
    overlap: float


MODELS: dict[str, ModelProfile] = {
    "gpt": ModelProfile("gpt", 3.0e9, (1.0, 1.6), 0.3),
    "t5": ModelProfile("t5", 1.54e9, (0.5, 0.8), 0.4),
    "bert": ModelProfile("bert", 0.68e9, (0.25, 0.4), 0.5),
    "vgg": ModelProfile("vgg", 0.55e9, (0.15, 0.25), 0.6),
    "resnet": ModelProfile("resnet", 0.1e9, (0.1, 0.15), 0.8),
}
LARGE_MIX: dict[str, float] = {"gpt": 0.8, "t5": 0.2}
SMALL_MIX: dict[str, float] = {"gpt": 0.2, "t5": 0.1, "bert": 0.3, "vgg": 0.15, "resnet": 0.25}


def size_distribution(total_gpus: int, max_gpus: int = 512) -> tuple[list[int], list[float]]:
    """The GPU counts a job may have on a fabric of `total_gpus`, with probabilities."""
    limit = min(max_gpus, total_gpus)
    if limit < 1:
        raise ValueError("no GPUs to place jobs on (fabric or max_gpus is 0)")
    keep = [(s, p) for s, p in zip(SIZES, SIZE_PROBS, strict=True) if s <= limit]
    if not keep:
        return [limit], [1.0]
    mass = sum(p for _, p in keep)
    return [s for s, _ in keep], [p / mass for _, p in keep]


def synth_jobs(topo: Topology, count: int, *, seed: int = 0, max_gpus: int = 512,
               exclusive: bool = True) -> list[Job]:
    """`count` synthetic jobs placed on `topo` (fewer when `exclusive` and the fabric
    fills up); deterministic for a given seed. See the module docstring."""
    if count < 0:
        raise ValueError("count must be >= 0")
    hosts = [h for h in topo.hosts if topo.nodes[h].gpus > 0]
    cap: IntArray = np.array([topo.nodes[h].gpus for h in hosts], dtype=np.int64)
    sizes, probs = size_distribution(int(cap.sum()), max_gpus)
    ports = {h: topo.nic_ports(h) for h in hosts}
    rng = np.random.default_rng(seed)
    free = cap.copy()
    cursor = 0
    jobs: list[Job] = []
    for i in range(count):
        gpus = int(rng.choice(sizes, p=probs))
        kind = _pick(rng, LARGE_MIX if gpus >= LARGE_JOB_GPUS else SMALL_MIX)
        model = MODELS[kind]
        compute = float(rng.uniform(*model.compute_s))
        overlap = float(np.clip(model.overlap + rng.uniform(-OVERLAP_JITTER, OVERLAP_JITTER),
                                0.0, MAX_OVERLAP))
        nbytes = model.grad_bytes * float(rng.uniform(*BYTES_JITTER))
        split = bool(rng.random() < SPLIT_PROB)
        placed = _place(free, cap, gpus, split, cursor)
        if placed is None and not exclusive:
            free[:] = cap  # a fresh "layer" of the fabric: GPUs are now oversubscribed
            placed = _place(free, cap, gpus, split, cursor)
        if placed is None:
            continue  # exclusive: the job does not fit, skip it
        for h, g in placed:
            free[h] -= g
        cursor = placed[-1][0]
        members = tuple((hosts[h], g) for h, g in placed)
        flows = ring_allreduce(members, nbytes, {h: ports[h] for h, _ in members})
        jobs.append(Job(id=f"job{i:04d}-{kind}", hosts=members, compute_s=compute,
                        flops=gpus * compute * FLOPS_PER_GPU, overlap=overlap, flows=flows,
                        pattern="ring_allreduce"))
    return jobs


def _pick(rng: np.random.Generator, mix: Mapping[str, float]) -> str:
    kinds = list(mix)
    return kinds[int(rng.choice(len(kinds), p=list(mix.values())))]


def _place(free: IntArray, cap: IntArray, need: int, split: bool, cursor: int
           ) -> list[tuple[int, int]] | None:
    """(host index, GPUs) for a job of `need` GPUs, searching from `cursor` on
    (cyclically), or None when it does not fit. `free` is not modified."""
    n = len(free)
    if need > int(cap.sum()):
        return None
    ring: IntArray = np.roll(np.arange(n, dtype=np.int64), -cursor)
    if need > int(cap.max()):  # whole hosts
        taken: list[tuple[int, int]] = []
        left = need
        for h in ring[free[ring] == cap[ring]].tolist():
            g = min(int(cap[h]), left)
            taken.append((h, g))
            left -= g
            if left == 0:
                return taken
        return None
    if split and need >= 2 and n >= 2:
        low, high = need // 2, need - need // 2
        first = ring[free[ring] >= high]
        if len(first):
            h1 = int(first[0])
            after = np.roll(ring, -int(np.flatnonzero(ring == h1)[0]) - 1)[:-1]
            second = after[free[after] >= low]
            if len(second):
                return [(h1, high), (int(second[0]), low)]
    single = ring[free[ring] >= need]
    if len(single):
        return [(int(single[0]), need)]
    return None
