"""The two cluster shapes of bench/control_plane.py: their fabrics, workloads and targets.

stress (the default; bench/_workload.py, bench/_leader_rig.py): 1,000 agents on a clos2
  fabric (16 hosts per ToR, 16 aggregation switches, 4 x 100 Gbps NICs per host) and
  5,000 jobs of 1, 2, 4 or 8 consecutive hosts starting anywhere: single-host jobs share
  hosts freely, so the jobs declare ~10x the fabric's GPUs. A load test of the planner.

real: a cluster shaped like a real one, no GPU oversubscription.
  * Fabric: a 1:1 three-tier fat tree ("clos3", written as an explicit nodes/links
    topology file; every switch pair is one aggregated link):
      hosts: 8 GPUs and 8 x 200 Gbps NICs (DGX A100-like), all to their ToR;
      ToR: 16 hosts (128 x 200 Gbps down), one 1.6 Tbps link to each of its pod's
        16 aggregation switches (128 x 200 Gbps up);
      pod: 16 ToRs + 16 aggregation switches (256 hosts, 2,048 GPUs);
      40 pods (10,240 hosts, 81,920 GPUs);
      spines: 16 planes of 16; aggregation switch i of every pod has one 1.6 Tbps link
        to each spine of plane i (256 spines, 40 x 1.6 Tbps down each).
    Hosts between pods have 16 x 16 = 256 equal-cost switch paths per NIC rail (the
    planner keeps 64), inside a pod 16, under one ToR 1.
  * Agents: h0..h{N-1} (default 10,000); h{N} is the real agent's (phase e).
  * Jobs: drawn from the trace's size mix (cruxd.workload: 8..512 GPUs, P = 0.35, 0.20,
    0.15, 0.15, 0.08, 0.05, 0.02; gpt/t5/bert/vgg/resnet per size; W_j = GPUs x compute
    x 100 TFLOP/s, gradient bytes of the model) and placed like its packing scheduler
    (next fit from where the last job ended): a job of more than 8 GPUs takes whole free
    hosts, an 8-GPU job one whole free host or, with probability 1/2 (the trace's
    split), 4 + 4 GPUs on two hosts that have room (so small jobs share hosts). A draw
    that does not fit is skipped (its draw still made), as in cruxd.workload's
    exclusive placement: GPUs are never oversubscribed. The mix averages 53.7 GPUs a
    job, so 10,000 hosts hold ~1,490 of its jobs: asking for more (the default 2,000)
    fills the fabric and stops; --max-gpus 128 (mean 32.9) fits 2,000.
  * Arrivals (phase c): drawn from the same mix (own seed), on hosts kept free for them:
    arrival k on worker k mod W, consecutive whole hosts at the end of its host range.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from _workload import GPUS_PER_HOST, JobSpec, host_id, nic_address

from cruxd import workload as wl

# --- real: the fabric ---------------------------------------------------------------
REAL_NICS = 8
REAL_NIC_GBPS = 200.0
REAL_HOSTS_PER_TOR = 16
REAL_TORS_PER_POD = 16
REAL_AGGS_PER_POD = 16
REAL_SPINES_PER_PLANE = 16  # one plane per aggregation switch index


@dataclass(frozen=True)
class Targets:
    """What the benchmark is asked to meet, per arrival: plan delivered to all agents."""
    all_median_s: float
    all_p99_s: float | None
    leader_rss_mb: float = 1024.0
    agent_cpu_pct: float = 1.0
    agent_rss_mb: float = 60.0


# real: issue 34's (10,000 agents: median 1 s, p99 2 s, RSS 1.5 GB)
TARGETS = {"stress": Targets(0.5, 1.0), "real": Targets(1.0, 2.0, leader_rss_mb=1536.0)}


def clos3_pods(hosts: int) -> int:
    """Pods needed for `hosts` hosts."""
    per_pod = REAL_HOSTS_PER_TOR * REAL_TORS_PER_POD
    return -(-hosts // per_pod)


def clos3_document(pods: int) -> dict[str, Any]:
    """The real shape's fabric as a topology file's explicit {"nodes", "links"} (see
    cruxd/scenario/fabric_section.py); hosts h0.. ToR by ToR, pod by pod."""
    nodes: list[dict[str, Any]] = []
    links: list[dict[str, Any]] = []
    host_bw = REAL_NICS * REAL_NIC_GBPS
    tor_agg = REAL_HOSTS_PER_TOR * host_bw / REAL_AGGS_PER_POD
    agg_spine = REAL_TORS_PER_POD * tor_agg / REAL_SPINES_PER_PLANE
    for plane in range(REAL_AGGS_PER_POD):
        for s in range(REAL_SPINES_PER_PLANE):
            nodes.append({"id": f"spine{plane}.{s}", "kind": "switch", "tier": 3})
    h = 0
    for p in range(pods):
        aggs = [f"agg{p}.{a}" for a in range(REAL_AGGS_PER_POD)]
        for a, agg in enumerate(aggs):
            nodes.append({"id": agg, "kind": "switch", "tier": 2})
            links += [{"a": agg, "b": f"spine{a}.{s}", "gbps": agg_spine}
                      for s in range(REAL_SPINES_PER_PLANE)]
        for t in range(REAL_TORS_PER_POD):
            tor = f"tor{p}.{t}"
            nodes.append({"id": tor, "kind": "switch", "tier": 1})
            links += [{"a": tor, "b": agg, "gbps": tor_agg} for agg in aggs]
            for _ in range(REAL_HOSTS_PER_TOR):
                nodes.append({"id": host_id(h), "kind": "host", "gpus": GPUS_PER_HOST})
                links.append({"a": host_id(h), "b": tor, "gbps": REAL_NIC_GBPS,
                              "count": REAL_NICS})
                h += 1
    return {"name": "clos3", "nodes": nodes, "links": links}


def clos3_topology(pods: int) -> Any:
    """The same fabric, parsed the way the leader parses its topology file."""
    from pathlib import Path

    from cruxd.scenario.cursor import Cursor
    from cruxd.scenario.fabric_section import parse_topology

    return parse_topology(Cursor(clos3_document(pods)), Path("."))


def inventory(i: int, nics: int, gbps: float) -> Any:
    """HostInventory of simulated host i with `nics` NICs of `gbps` (ports 0..nics-1)."""
    from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb

    return lpb.HostInventory(
        host_id=host_id(i), agent_version="bench", gpus=GPUS_PER_HOST,
        nics=[lpb.Nic(name=f"mlx5_{p}/1", address=nic_address(i, p), port=p,
                      speed_gbps=gbps) for p in range(nics)],
        measurement_source="static (declared hints)", probing_source="none")


# --- real: the workload ----------------------------------------------------------------

def _draw(rng: random.Random, sizes: Sequence[int], probs: Sequence[float]
          ) -> tuple[int, bool, str, float, float]:
    """(GPUs, split, kind, compute_s, gradient bytes) of one job of the trace's mix."""
    gpus = rng.choices(list(sizes), list(probs))[0]
    mix = wl.LARGE_MIX if gpus >= wl.LARGE_JOB_GPUS else wl.SMALL_MIX
    kind = rng.choices(list(mix), list(mix.values()))[0]
    model = wl.MODELS[kind]
    compute = rng.uniform(*model.compute_s)
    nbytes = model.grad_bytes * rng.uniform(*wl.BYTES_JITTER)
    split = gpus < 2 * GPUS_PER_HOST and rng.random() < wl.SPLIT_PROB
    return gpus, split, kind, compute, nbytes


def _spec(job_id: str, hosts: Sequence[int], gpus: int, compute: float, nbytes: float
          ) -> JobSpec:
    return JobSpec(job_id, tuple(hosts), gpus // len(hosts),
                   gpus * compute * wl.FLOPS_PER_GPU, compute, nbytes)


def _place(free: list[int], need: int, split: bool, cursor: int) -> list[int] | None:
    """Host indices (next fit from `cursor`, cyclic) for a job of `need` GPUs, or None.
    Whole free hosts for `need` >= 8 unless split (4 + 4 on hosts with room)."""
    n = len(free)
    order = [(cursor + k) % n for k in range(n)]
    if split:
        half = need // 2
        room = [h for h in order if free[h] >= half]
        if len(room) >= 2:
            return room[:2]
    hosts = need // GPUS_PER_HOST
    whole = [h for h in order if free[h] == GPUS_PER_HOST]
    return whole[:hosts] if len(whole) >= hosts else None


def real_workload(n_hosts: int, n_jobs: int, ranges: Sequence[Sequence[int]], arrivals: int,
                  seed: int, max_gpus: int = 512
                  ) -> tuple[list[JobSpec], list[tuple[int, JobSpec]]]:
    """The real shape's jobs on hosts 0..n_hosts-1: (steady-state jobs, arrivals as
    (worker, job)); see the module docstring. `ranges`: each worker's hosts (consecutive)."""
    sizes, probs = wl.size_distribution(n_hosts * GPUS_PER_HOST, max_gpus)
    free = [GPUS_PER_HOST] * n_hosts
    # the arrivals first: whole hosts at the end of their worker's range, kept free
    rng = random.Random(seed + 1)
    arriving: list[tuple[int, JobSpec]] = []
    ends = [len(r) for r in ranges]
    for k in range(arrivals):
        w = k % len(ranges)
        gpus, split, kind, compute, nbytes = _draw(rng, sizes, probs)
        span = 2 if split else max(1, gpus // GPUS_PER_HOST)
        if span > ends[w]:
            raise ValueError(f"arrival {k} ({gpus} GPUs) does not fit in worker {w}'s hosts")
        hosts = list(ranges[w][ends[w] - span:ends[w]])
        ends[w] -= span
        for h in hosts:
            free[h] = 0
        arriving.append((w, _spec(f"arrival{k}-{kind}", hosts, gpus, compute, nbytes)))
    # then the running jobs, until n_jobs are placed or none fits any more
    rng = random.Random(seed)
    jobs: list[JobSpec] = []
    cursor = 0
    draws = 0
    while len(jobs) < n_jobs and max(free) >= GPUS_PER_HOST // 2 and draws < 50 * n_jobs:
        gpus, split, kind, compute, nbytes = _draw(rng, sizes, probs)
        draws += 1
        placed = _place(free, gpus, split, cursor)
        if placed is None:
            continue  # skipped, as cruxd.workload's exclusive placement does
        per_host = gpus // len(placed)
        for h in placed:
            free[h] -= per_host
        cursor = placed[-1]
        jobs.append(_spec(f"job{draws - 1}-{kind}", placed, gpus, compute, nbytes))
    return jobs, arriving


def stress_arrivals(ranges: Sequence[Sequence[int]], arrivals: int, seed: int
                    ) -> list[tuple[int, JobSpec]]:
    """The stress shape's arrivals: 1, 2, 4, 8 consecutive hosts in turn, anywhere in
    worker k mod W's range (on hosts that already run jobs)."""
    from _workload import make_job

    rng = random.Random(seed + 1)
    spans = (1, 2, 4, 8)
    out = []
    for k in range(arrivals):
        w = k % len(ranges)
        span = min(spans[k % len(spans)], len(ranges[w]))
        first = rng.randrange(len(ranges[w]) - span + 1)
        out.append((w, make_job(rng, f"arrival{k}", tuple(ranges[w][first:first + span]))))
    return out
