"""TACCL* (seed §4.4, §6.3): TACCL's intra-job heuristics stretched across jobs.

The seed's authors "implement TACCL's specification for inter-job using the
least-congested-link insight and longest-distance prioritization". Our reading:

priorities: longest distance first. A job's distance is the hop count of its
    longest network flow (candidates are shortest paths, so one number per flow);
    ties go to the larger sum over flows of bytes x hops, then to the smaller id.
    Unique priorities: first = highest level = n - 1.
paths: jobs in that order, each flow in `network_flows` order, take the candidate
    minimising max over its links of (bytes already placed + the flow's bytes) / B_e,
    ties to the first candidate in canonical order; the flow's bytes are then placed.
Oblivious to GPU intensity, iteration time and overlap. See docs/baselines.md.
"""

from __future__ import annotations

import numpy as np

from cruxd.sim.policies.base import Context, Decisions, network_flows

_REL = 1e-9  # relative tolerance for ties between candidate paths


def least_congested(cands: np.ndarray, inv_cap: np.ndarray, placed: np.ndarray,
                    nbytes: float) -> int:
    """Index of the candidate whose most loaded link, with the flow added, is least
    loaded relative to its capacity; ties to the first."""
    worst = ((placed[cands] + nbytes) * inv_cap[cands]).max(axis=1)
    return int(np.flatnonzero(worst <= worst.min() * (1 + _REL))[0])


class Taccl:
    name = "taccl*"

    def decide(self, ctx: Context) -> Decisions:
        if not ctx.jobs:
            return Decisions()
        jobs = sorted(ctx.jobs, key=lambda j: j.id)
        cands: list[list[np.ndarray]] = []
        rank_key: list[tuple[int, float, str]] = []
        for job in jobs:
            mine = [ctx.finder.candidates(f.src, f.dst, f.src_port, f.dst_port)
                    for f in (job.flows[i] for i in network_flows(job))]
            hops = [c.shape[1] if len(c) else 0 for c in mine]
            sizes = [job.flows[i].bytes for i in network_flows(job)]
            cands.append(mine)
            rank_key.append((-max(hops, default=0),
                             -sum(b * h for b, h in zip(sizes, hops, strict=True)), job.id))
        order = sorted(range(len(jobs)), key=lambda k: rank_key[k])
        n = len(jobs)
        level = {jobs[k].id: n - 1 - r for r, k in enumerate(order)}
        inv_cap = 1.0 / ctx.topology.capacity
        placed = np.zeros(len(inv_cap))
        paths: dict[str, tuple[np.ndarray | None, ...]] = {}
        for k in order:
            job = jobs[k]
            chosen: list[np.ndarray | None] = []
            for c, fi in zip(cands[k], network_flows(job), strict=True):
                if len(c) == 0:  # unreachable: leave it to ECMP, which reports it
                    chosen.append(None)
                    continue
                nbytes = job.flows[fi].bytes
                path = np.array(c[least_congested(c, inv_cap, placed, nbytes)], dtype=np.int64)
                placed[path] += nbytes
                chosen.append(path)
            paths[job.id] = tuple(chosen)
        return Decisions(level=level, paths=paths)
