"""Job arrivals shaped like the seed's two-week trace (§2.2): pure, seeded, no I/O.

Per job, in arrival order (every draw from one `np.random.default_rng(seed)`;
placement draws nothing, so a seed fixes the jobs):
  * arrival: `jobs` arrivals of a Poisson process over `days` (given their count,
    a Poisson process's arrival times are sorted uniform draws);
  * GPUs: as `cruxd.workload` (sizes 8..512, > 10 % of jobs >= 128 GPUs);
  * model: jobs of >= 128 GPUs are GPT variants (the trace, §2.2), smaller ones mix
    the §6.3 models (`cruxd.sim.profiles.SMALL_MIX`); the profile (GPT: by size)
    gives compute time, overlap and traffic at real sizes. Compute time is the
    profile's x U(0.8, 1.2) x `compute_scale` (the calibration, `COMPUTE_SCALE`),
    network bytes x U(0.8, 1.2) x `bytes_scale` (1; a knob), overlap +- 0.05;
  * standalone duration: lognormal, median `median_s` (25 min), shape `sigma`
    (1.5), clipped to [`min_s`, `max_s`] (5 min, 7 days), independent of size. At
    the seed's rate (5,000 jobs in 14 days) that is ~19 jobs and ~1,000 GPUs in use
    on average and peaks of 35+ jobs (seed: 30+ jobs on 1,000+ GPUs). `load`
    instead sets the median so that the expected GPU demand is `load` x the
    fabric's GPUs (ignoring the clipping);
  * work: `iterations` = duration / `standalone_period` (max(compute, (1 - o)
    compute + t), t = largest flow's bytes over its NIC link rate).

Placement imitates the trace's packing scheduler ("GPUs in the same host or under
the same switch") on the standalone schedule: a job holds its GPUs from its start
to start + its standalone duration. Jobs start in arrival order (FIFO, no
backfilling): the head of the queue waits until enough GPUs are free and those
behind it wait too; a job's `SimJob.arrival_s` is its start. Hosts are grouped by
the set of ToRs they link to. As in `cruxd.workload`, a job that fits one host is
split over two with probability `split_prob` (1/2) so that it still uses the
network. One host: the fullest host with room (best fit). Split: best fit per
half, the second half under the first's ToR when possible. Larger jobs (or small
ones no host has room for): whole free hosts of the one ToR group that fits the
job most tightly, else of the groups with the most whole free hosts first; then
partly free hosts, emptiest first; the ring visits hosts in topology order.
That is the `packed` placement; `placement` picks another (`cruxd.sim.placement`:
none, hived, muri, crux-hints). `muri` and `crux-hints` also see the running jobs'
planned link loads (`cruxd.sim.hint_placement.FabricLoad`).
The simulator does not enforce this: under contention a job runs longer than its
standalone duration and may overlap jobs that later got its GPUs. Multi-host jobs
send their profile's collectives (`cruxd.sim.profiles.profile_flows`); single-host
jobs have no network flows. `min_period_s` (0: off) is a simulation speed device: a job
whose standalone iteration is shorter is simulated with k = ceil(min_period_s /
period) iterations merged into one (k x compute, k x bytes, the same standalone rate),
so that a 20 ms job does not cost a GPT's window thousands of events.
Ids: "job<index>-<kind>"; `Job.pattern` is the kind.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from cruxd import workload as wl
from cruxd.model.jobs import Job
from cruxd.model.topology import Topology
from cruxd.sim import profiles as pf
from cruxd.sim.hint_placement import Advisor, FabricLoad
from cruxd.sim.placement import PLACEMENTS, Extra, Placement, place
from cruxd.sim.run import SimJob

DAY_S = 86400.0
MEDIAN_S = 1500.0
SIGMA = 1.5
MIN_S = 300.0
MAX_S = 7 * DAY_S
# The one calibrated number of the workload: the profiles' compute times are multiplied
# by it so that ECMP under `none` placement on the Clos gives the seed's "None" 0.39
# (Fig. 25). Measured with ecmp alone on 2-day slices of the trace (seed 0): 0.3 ->
# 0.247, 0.4 -> 0.316, 0.5 -> 0.380, 0.6 -> 0.438; 0.52 interpolates 0.39. Read it as
# per-GPU batches about half the cited ones, or GPUs about twice as fast.
COMPUTE_SCALE = 0.52

IntArray = npt.NDArray[np.int64]


def trace_jobs(topo: Topology, *, jobs: int, days: float, seed: int = 0, max_gpus: int = 512,
               median_s: float = MEDIAN_S, sigma: float = SIGMA, min_s: float = MIN_S,
               max_s: float = MAX_S, load: float | None = None,
               split_prob: float = wl.SPLIT_PROB, bytes_scale: float = 1.0,
               compute_scale: float = COMPUTE_SCALE, placement: str = "packed",
               min_period_s: float = 0.0) -> list[SimJob]:
    """`jobs` trace jobs over `days`, placed on `topo` by `placement` (a name of
    cruxd.sim.placement.PLACEMENTS); see the module docstring."""
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; placements: "
                         f"{', '.join(PLACEMENTS)}")
    if (jobs < 0 or not days > 0 or not sigma >= 0 or not 0 < min_s <= max_s
            or bytes_scale < 0 or not compute_scale > 0):
        raise ValueError("need jobs, sigma, bytes_scale >= 0, days, compute_scale > 0, "
                         "0 < min_s <= max_s")
    hosts = [h for h in topo.hosts if topo.nodes[h].gpus > 0]
    cap: IntArray = np.array([topo.nodes[h].gpus for h in hosts], dtype=np.int64)
    sizes, probs = wl.size_distribution(int(cap.sum()), max_gpus)
    if load is not None:
        mean_gpus = float(np.dot(sizes, probs))
        median_s = load * float(cap.sum()) * days * DAY_S / max(jobs, 1) / mean_gpus / math.exp(
            sigma * sigma / 2)
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0.0, days * DAY_S, size=jobs))
    ports = {h: topo.nic_ports(h) for h in hosts}
    width = max(4, len(str(jobs - 1)))
    drawn: list[_Draw] = []
    for i in range(jobs):
        gpus = int(rng.choice(sizes, p=probs))
        mix = {"gpt": 1.0} if gpus >= pf.LARGE_JOB_GPUS else pf.SMALL_MIX
        kind = list(mix)[int(rng.choice(len(mix), p=list(mix.values())))]
        prof = pf.profile(kind, gpus)
        compute = compute_scale * prof.compute_s * float(rng.uniform(*COMPUTE_JITTER))
        jitter = float(rng.uniform(-wl.OVERLAP_JITTER, wl.OVERLAP_JITTER))
        overlap = float(np.clip(prof.overlap + jitter, 0.0, wl.MAX_OVERLAP))
        scale = bytes_scale * float(rng.uniform(*wl.BYTES_JITTER))
        duration = float(np.clip(median_s * math.exp(sigma * float(rng.standard_normal())),
                                 min_s, max_s))
        split = bool(rng.random() < split_prob)
        drawn.append(_Draw(f"job{i:0{width}d}-{kind}", gpus, prof, compute, overlap, scale,
                           duration, split))
    group, pod = host_groups(topo, hosts)
    fabric = FabricLoad(topo, group, hosts) if placement in ("muri", "crux-hints") else None
    advisor = Advisor(topo, hosts, cap, fabric) if placement == "crux-hints" and fabric else None
    free = cap.copy()
    out: list[SimJob] = []
    running: list[tuple[float, int, Placement]] = []  # (end, index, placement) heap
    queue: deque[int] = deque()
    now, nxt = 0.0, 0
    while nxt < jobs or queue:
        if queue:
            d = drawn[queue[0]]
            extra = _extra(d, fabric, advisor)
            placed = place(placement, free, cap, group, pod, d.gpus, d.split,
                           unit=d.profile.unit, extra=extra)
            if placed is not None or (not running and nxt >= jobs):
                queue.popleft()
                if placed is None:
                    continue  # larger than the fabric: cannot happen with size_distribution
                for h, g in placed:
                    free[h] -= g
                members = tuple((hosts[h], g) for h, g in placed)
                flows = pf.profile_flows(d.profile, members, {h: ports[h] for h, _ in members},
                                         d.bytes_scale)
                job = Job(id=d.id, hosts=members, compute_s=d.compute_s,
                          flops=d.gpus * d.compute_s * wl.FLOPS_PER_GPU, overlap=d.overlap,
                          flows=flows, pattern=d.profile.kind)
                period = standalone_period(job, topo)
                if period < min_period_s:
                    job, period = _merged(job, math.ceil(min_period_s / period), period)
                out.append(SimJob(job, arrival_s=now, iterations=max(1.0, d.duration / period)))
                if fabric is not None:  # the job as simulated: merged bytes over merged period
                    fabric.add(len(out), job.flows, period, _rate(d))
                heapq.heappush(running, (now + d.duration, len(out), placed))
                continue
        t_dep = running[0][0] if running else math.inf
        t_arr = float(arrivals[nxt]) if nxt < jobs else math.inf
        if t_dep <= t_arr:
            now = t_dep
            _, key, gone = heapq.heappop(running)
            for h, g in gone:
                free[h] += g
            if fabric is not None:
                fabric.remove(key)
        else:
            now = t_arr
            queue.append(nxt)
            nxt += 1
    return out


def _merged(job: Job, k: int, period: float) -> tuple[Job, float]:
    """`k` iterations of `job` as one: k x the compute and k x the bytes."""
    flows = tuple(replace(f, bytes=f.bytes * k) for f in job.flows)
    return replace(job, compute_s=job.compute_s * k, flops=job.flops * k, flows=flows), period * k


COMPUTE_JITTER = (0.8, 1.2)  # per-GPU batch and GPU clocks vary around the profile


@dataclass(frozen=True, slots=True)
class _Draw:
    id: str
    gpus: int
    profile: pf.Profile
    compute_s: float
    overlap: float
    bytes_scale: float
    duration: float
    split: bool


def _rate(d: _Draw) -> float:
    """Bytes per second of compute a full host of the job sends (ring and all-to-all;
    pipeline traffic is spread over many host pairs and left out): how communication-
    heavy muri deems it."""
    p = d.profile
    return d.bytes_scale * (2 * p.dp_bytes + 8 * p.a2a_bytes) / d.compute_s


def _layout(d: _Draw) -> tuple[int, int, int] | None:
    """(DP, TP, PP) of a GPT job of whole 8-GPU nodes (Arnold's input), else None."""
    p = d.profile
    if p.kind != "gpt" or d.gpus % 8 or d.gpus < 16:
        return None
    return d.gpus // (p.unit * p.pp_stages), p.unit, p.pp_stages


def _extra(d: _Draw, fabric: FabricLoad | None, advisor: Advisor | None) -> Extra | None:
    if fabric is None:
        return None
    layout = _layout(d)
    advise = None
    if advisor is not None:
        def advise(free: IntArray, need: int, unit: int) -> Placement | None:
            return advisor.advise(free, need, unit, layout)
    return Extra(uplink_load=fabric.uplink_load(), heavy=fabric.heavy(_rate(d)),
                 advise=advise)


def standalone_period(job: Job, topo: Topology) -> float:
    """Approximate iteration time alone: max(compute, (1 - o) compute + t), t = the
    slowest network flow's bytes over its source NIC link (or its host's first)."""
    t = 0.0
    for f in job.flows:
        if f.src == f.dst:
            continue
        up = topo.uplinks(f.src)
        link = up[f.src_port] if f.src_port is not None and f.src_port < len(up) else up[0]
        t = max(t, f.bytes / (float(topo.capacity[link]) * 1e9 / 8.0))
    if t == 0.0:
        return job.compute_s
    return max(job.compute_s, (1.0 - job.overlap) * job.compute_s + t)


def trace_stats(jobs: list[SimJob], topo: Topology) -> dict[str, Any]:
    """Size mix and load of a trace on its standalone schedule (a job that ends
    within 1 us of another's start frees its GPUs first); mean GPUs in use are
    averaged from the first to the last start."""
    total = topo.total_gpus()
    if not jobs:
        return {"jobs": 0, "gpus": total}
    gpus = np.array([s.job.gpus for s in jobs])
    starts = [s.arrival_s for s in jobs]
    ends = [s.arrival_s + (s.iterations or 0.0) * standalone_period(s.job, topo) for s in jobs]
    events = sorted([(e - 1e-6, -1, -int(g)) for e, g in zip(ends, gpus, strict=True)]
                    + [(s.arrival_s, 1, s.job.gpus) for s in jobs])
    n = used = peak_n = peak_g = 0
    area, last, stop = 0.0, min(starts), max(starts)
    for t, dn, dg in events:
        area += used * max(0.0, min(t, stop) - last)
        last = max(last, min(t, stop))
        n, used = n + dn, used + dg
        peak_n, peak_g = max(peak_n, n), max(peak_g, used)
    span = stop - min(starts)
    return {
        "jobs": len(jobs),
        "gpus": total,
        "share_ge_128": float(np.mean(gpus >= wl.LARGE_JOB_GPUS)),
        "largest": int(gpus.max()),
        "multi_host": float(np.mean([len(s.job.hosts) > 1 for s in jobs])),
        "peak_jobs": peak_n,
        "peak_gpus": peak_g,
        "mean_gpus": area / span if span > 0 else 0.0,
        "median_duration_s": float(np.median(np.array(ends) - starts)),
        **_spans(jobs, topo),
    }


def _spans(jobs: list[SimJob], topo: Topology) -> dict[str, float]:
    """The fraction of jobs whose hosts span more than one ToR group, and more than one
    pod: how fragmented the placement left them."""
    hosts = [h for h in topo.hosts if topo.nodes[h].gpus > 0]
    group, pod = host_groups(topo, hosts)
    where = {h: (int(g), int(p)) for h, g, p in zip(hosts, group, pod, strict=True)}
    tors = [len({where[h][0] for h, _ in s.job.hosts}) for s in jobs]
    pods = [len({where[h][1] for h, _ in s.job.hosts}) for s in jobs]
    return {"span_tors": float(np.mean(np.array(tors) > 1)),
            "span_pods": float(np.mean(np.array(pods) > 1))}


def host_groups(topo: Topology, hosts: list[str]) -> tuple[IntArray, IntArray]:
    """Per host, its ToR group (hosts linked to the same set of ToRs share one) and its
    pod (ToR groups linked to the same set of switches above them)."""
    tor_keys: dict[frozenset[str], int] = {}
    pod_keys: dict[frozenset[str], int] = {}
    group, pod = [], []
    for h in hosts:
        tors = frozenset(topo.links[i].dst for i in topo.uplinks(h))
        group.append(tor_keys.setdefault(tors, len(tor_keys)))
        above = frozenset(topo.links[i].dst for t in tors for i in topo.uplinks(t)
                          if not topo.is_host(topo.links[i].dst))
        pod.append(pod_keys.setdefault(above, len(pod_keys)))
    return np.array(group, dtype=np.int64), np.array(pod, dtype=np.int64)
