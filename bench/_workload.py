"""The workload of bench/control_plane.py: jobs over consecutive hosts (JobSpec), the hosts'
names and NIC addresses in the clos2 topology, and both as the protobuf messages a crux agent
reports (bench/_fake_agents.py simulates the agents; the real leader plans them).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

GPUS_PER_HOST = 8
NICS_PER_HOST = 4
NIC_GBPS = 100.0
# hosts a job spans: mostly single-host jobs, as in the traces; multi-host jobs
# sit on consecutive hosts (a packing scheduler), starting anywhere.
SPAN_WEIGHTS = {1: 0.55, 2: 0.20, 4: 0.15, 8: 0.10}
SINGLE_HOST_GPUS = {1: 0.4, 2: 0.3, 4: 0.2, 8: 0.1}


@dataclass(frozen=True)
class JobSpec:
    job_id: str
    hosts: tuple[int, ...]  # host indices, ring order
    gpus: int  # per host
    flops_per_iter: float  # the whole job's W_j
    compute_s: float
    allreduce_bytes: float


def make_job(rng: random.Random, job_id: str, hosts: tuple[int, ...]) -> JobSpec:
    gpus = (GPUS_PER_HOST if len(hosts) > 1 else
            rng.choices(list(SINGLE_HOST_GPUS), list(SINGLE_HOST_GPUS.values()))[0])
    compute = rng.uniform(0.1, 2.0)
    # achieved 30-60 % of a 312 TFLOP/s (A100 bf16) GPU during compute
    flops = len(hosts) * gpus * compute * 312e12 * rng.uniform(0.3, 0.6)
    nbytes = math.exp(rng.uniform(math.log(1e8), math.log(1e10)))  # 50M-5B fp16 params
    return JobSpec(job_id, hosts, gpus, flops, compute, nbytes)


def make_jobs(n_hosts: int, n_jobs: int, seed: int = 0) -> list[JobSpec]:
    rng = random.Random(seed)
    spans = list(SPAN_WEIGHTS)
    out = []
    for k in range(n_jobs):
        span = min(n_hosts, rng.choices(spans, list(SPAN_WEIGHTS.values()))[0])
        start = rng.randrange(n_hosts)
        out.append(make_job(rng, f"job{k}", tuple((start + i) % n_hosts for i in range(span))))
    return out


def host_id(i: int) -> str:
    return f"h{i}"  # the clos2 builder's host names


def nic_address(i: int, port: int) -> str:
    return f"10.{port + 1}.{i >> 8}.{i & 255}"


def local_job_pb(spec: JobSpec, host: int, registered_ms: int) -> Any:
    from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb

    rank = spec.hosts.index(host)
    return cpb.LocalJob(
        job_id=spec.job_id, gpus=spec.gpus, node_rank=rank, nnodes=len(spec.hosts),
        registered_unix_ms=registered_ms,
        measurement=cpb.JobMeasurement(flops_per_iter=spec.flops_per_iter / len(spec.hosts),
                                       compute_s=spec.compute_s,
                                       allreduce_bytes=spec.allreduce_bytes, source="hints"),
        command="python train.py")


def inventory_pb(i: int) -> Any:
    from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb

    return lpb.HostInventory(
        host_id=host_id(i), agent_version="bench", gpus=GPUS_PER_HOST,
        nics=[lpb.Nic(name=f"mlx5_{p}/1", address=nic_address(i, p), port=p,
                      speed_gbps=NIC_GBPS) for p in range(NICS_PER_HOST)],
        measurement_source="static (declared hints)", probing_source="none")

