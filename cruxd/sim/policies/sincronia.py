"""Sincronia (Agarwal et al., SIGCOMM'18) as an inter-job baseline (seed §6.3).

Every job's per-iteration collective is one coflow. Its demand on link e is
M_{j,e}, the bytes its flows put on e per iteration on the paths ECMP will really
hash them onto (same 5-tuple hash as the run), measured in seconds of link time
(M_{j,e} / B_e; Sincronia's ports all have one rate, ours need not). BSSI
(Bottleneck-Select-Scale-Iterate) then orders the coflows from the last to the
first: take the most loaded link b over the coflows still unordered, put last the
coflow with the largest d_{c,b} / w_c (weights start at 1), scale the others'
weights w_c -= w_last * d_{c,b} / d_{last,b}, drop it, iterate. The order becomes
unique priorities (first = highest level = n - 1); paths stay with ECMP. Like the
original, it sees bytes only: not GPU intensity, iteration time or overlap.
`compress=True` fits the order to the fabric's ctx.levels the way Sincronia does
with few queues (seed §4.3, Fig. 13): the first levels - 1 coflows get a level each,
all the others share the lowest. See docs/baselines.md.
"""

from __future__ import annotations

import numpy as np

from cruxd.model.jobs import Job
from cruxd.sim.flow_hash import hash_path, source_port
from cruxd.sim.policies.base import Context, Decisions, network_flows

_REL = 1e-9  # relative tolerance for ties


def ecmp_link_bytes(ctx: Context, job: Job) -> dict[int, float]:
    """M_{j,e}: bytes per iteration on each link, on the job's ECMP-hashed paths."""
    loads: dict[int, float] = {}
    for fi in network_flows(job):
        f = job.flows[fi]
        path = hash_path(ctx.finder, f, source_port(job.id, fi, ctx.seed), ctx.seed)
        for link in path.tolist():
            loads[link] = loads.get(link, 0.0) + f.bytes
    return loads


def bssi(demand: np.ndarray) -> list[int]:
    """Sincronia's BSSI order of coflows (rows of `demand`, links as columns), first
    to last. Ties: the lowest link index as bottleneck; among coflows, the larger
    demand on the bottleneck, then the larger row index, goes last. Coflows that
    touch no loaded link go first, in row order."""
    n = demand.shape[0]
    weight = np.ones(n)
    alive = np.ones(n, dtype=bool)
    tail: list[int] = []  # last, second to last, ...
    while alive.any():
        total = demand[alive].sum(axis=0)
        if total.size == 0 or total.max() <= 0:
            break
        b = int(np.argmax(total))
        col = demand[:, b]
        cand = np.flatnonzero(alive & (col > 0))
        ratio = weight[cand] / col[cand]  # smallest w / d = largest d / w
        tied = cand[ratio <= ratio.min() * (1 + _REL)]
        last = max(tied.tolist(), key=lambda c: (col[c], c))
        tail.append(last)
        alive[last] = False
        weight[alive] -= weight[last] * col[alive] / col[last]
        np.maximum(weight, 0.0, out=weight)
    return np.flatnonzero(alive).tolist() + tail[::-1]


class Sincronia:
    def __init__(self, name: str = "sincronia", *, compress: bool = False) -> None:
        self.name, self.compress = name, compress

    def decide(self, ctx: Context) -> Decisions:
        if not ctx.jobs:
            return Decisions()
        jobs = sorted(ctx.jobs, key=lambda j: j.id)
        per_job = [ecmp_link_bytes(ctx, j) for j in jobs]
        used = sorted({link for loads in per_job for link in loads})
        col = {link: c for c, link in enumerate(used)}
        demand = np.zeros((len(jobs), len(used)))
        for i, loads in enumerate(per_job):
            for link, nbytes in loads.items():
                demand[i, col[link]] = nbytes
        if used:
            demand *= 8.0 / (ctx.topology.capacity[np.array(used)] * 1e9)  # seconds
        order = bssi(demand)
        top = max(ctx.levels, 1) - 1 if self.compress else len(jobs) - 1
        return Decisions(level={jobs[k].id: max(top - r, 0) for r, k in enumerate(order)})
