"""crux as the job scheduler's advisor: trace placement from crux's own hint exports.

At each arrival the scheduler's state (GPUs in use per host, and the running jobs'
planned link loads, `FabricLoad`) becomes a `FabricView`, the same view `cruxctl hints`
exports from a live leader, and the placement reads only the exports:

  * a job with a parallelism layout (a GPT job of whole 8-GPU nodes: DP x TP x PP)
    goes where Arnold's MIP on the Arnold export puts it (`arnold_mip.place`): the
    minipods and how many nodes in each. Inside a minipod the MIP is indifferent, so
    the nodes go to the minipod's SpiderFlow vertices (ToR groups) with the most free
    whole nodes, then the highest score, as one contiguous rank range each;
  * any other job that does not fit one host: SpiderFlow's scores (seed 000, §4.1 and
    Eq. 2): the best-scored vertex that holds it, else SpinSearch: grow from the
    best-scored vertex by the widest path (`widest_gbps`), then by free GPUs;
  * a job that fits one host, or one Arnold cannot place on whole free nodes: no
    advice (`None`), and `cruxd.sim.placement` falls back to HiveD's cells.

The planned load of a running job is its standalone rate spread evenly over each
flow's ECMP candidates: what the leader's plan would report before measuring. It is
the scheduler's view at the arrival, the same for every network policy that later
runs on the trace (a placement that depended on the policy would compare different
traces).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from cruxd.hints import arnold, arnold_mip, spiderflow
from cruxd.hints.fabric_view import FabricView, build_view, split_leaves
from cruxd.model.jobs import FlowSpec
from cruxd.model.paths import finder_for
from cruxd.model.topology import Topology

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Placement = list[tuple[int, int]]


class FabricLoad:
    """Running jobs' planned demand per link, in Gbps."""

    def __init__(self, topo: Topology, group: IntArray, hosts: list[str]) -> None:
        self.topo = topo
        self.finder = finder_for(topo)
        self.gbps = np.zeros(len(topo.links))
        self.jobs: dict[int, FloatArray] = {}
        self.rates: dict[int, float] = {}  # bytes/s a host of each multi-host job sends
        cap = np.asarray(topo.capacity, dtype=np.float64)
        # per ToR group: its ToRs' links to the switches above, and their capacity
        self.up_links: list[IntArray] = []
        self.up_cap = np.zeros(int(group.max()) + 1 if len(group) else 0)
        tors_of: dict[int, set[str]] = {}
        for h, g in zip(hosts, group, strict=True):
            tors_of.setdefault(int(g), set()).update(
                topo.links[i].dst for i in topo.uplinks(h))
        for g in range(len(self.up_cap)):
            ids = [i for t in sorted(tors_of.get(g, ())) for i in topo.uplinks(t)
                   if not topo.is_host(topo.links[i].dst)]
            self.up_links.append(np.array(ids, dtype=np.int64))
            self.up_cap[g] = float(cap[ids].sum()) if ids else 0.0

    def add(self, key: int, flows: tuple[FlowSpec, ...], period_s: float, rate: float) -> None:
        vec = np.zeros(len(self.topo.links))
        for f in flows:
            cands = self.finder.candidates(f.src, f.dst, f.src_port, f.dst_port)
            if cands.size:
                np.add.at(vec, cands.ravel(), f.bytes * 8e-9 / period_s / len(cands))
        self.jobs[key] = vec
        self.gbps += vec
        if flows:
            self.rates[key] = rate

    def remove(self, key: int) -> None:
        vec = self.jobs.pop(key, None)
        if vec is not None:
            self.gbps -= vec
        self.rates.pop(key, None)

    def uplink_load(self) -> FloatArray:
        """Per ToR group: demand on its uplinks over their capacity."""
        out = np.array([float(self.gbps[ids].sum()) if len(ids) else 0.0
                        for ids in self.up_links])
        return np.asarray(out / np.maximum(self.up_cap, 1e-9), dtype=np.float64)

    def heavy(self, rate: float) -> bool:
        """At least the median rate of the running multi-host jobs (all, if none run)."""
        return not self.rates or rate >= float(np.median(list(self.rates.values())))


class Advisor:
    """crux-hints' placement for one arriving job (see the module docstring)."""

    def __init__(self, topo: Topology, hosts: list[str], cap: IntArray, load: FabricLoad
                 ) -> None:
        self.topo, self.hosts, self.cap, self.load = topo, hosts, cap, load
        self.index = {h: i for i, h in enumerate(hosts)}
        # the view's fabric part does not change between arrivals: build it once, and
        # per arrival only put in the GPUs used and the loads (view link <- topo links)
        self.base = build_view(topo, levels=1)
        alias = split_leaves(topo)
        at = {(lk.src, lk.dst): k for k, lk in enumerate(self.base.links)}
        self.link_of = np.array([at[(alias.get(lk.src, lk.src), alias.get(lk.dst, lk.dst))]
                                 for lk in topo.links], dtype=np.int64)

    def _view(self, free: IntArray) -> FabricView:
        used = dict(zip(self.hosts, (self.cap - free).tolist(), strict=True))
        hosts = {h: replace(hh, gpus_used=min(hh.gpus, used.get(h, 0)))
                 for h, hh in self.base.hosts.items()}
        per_link = np.bincount(self.link_of, weights=self.load.gbps,
                               minlength=len(self.base.links)).tolist()
        links = tuple(replace(lk, load_gbps=(g,)) if g > 1e-9 else lk
                      for lk, g in zip(self.base.links, per_link, strict=True))
        return replace(self.base, hosts=hosts, links=links)

    def _spiderflow_export(self, view: FabricView) -> dict[str, Any]:
        """The SpiderFlow export's vertices, scores and widest paths, as numbers (what
        `spiderflow.export` writes, without rounding them into JSON at every arrival)."""
        grouped = spiderflow.leaf_groups(view)
        bw, _ = spiderflow.edge_matrices(view, list(grouped))
        return {"vertices": [{"pod": view.leaf_pod[g[0]],
                              "hosts": [{"host": h.host, "gpus": h.gpus,
                                         "gpus_free": h.gpus_free} for h in hh]}
                             for g, hh in grouped.items()],
                "score_gbps": spiderflow.bandwidth_scores(bw).tolist(),
                "widest_gbps": spiderflow.widest_paths(bw)}

    def advise(self, free: IntArray, need: int, unit: int,
               layout: tuple[int, int, int] | None) -> Placement | None:
        if need <= int(self.cap.max()):
            return None  # one host: no fabric to advise on
        view = self._view(free)
        sf = self._spiderflow_export(view)
        if layout is not None:
            got = self._arnold(view, sf, free, layout)
            if got is not None:
                return got
        return self._spiderflow(sf, free, need, unit)

    def _arnold(self, view: FabricView, sf: dict[str, Any], free: IntArray,
                layout: tuple[int, int, int]) -> Placement | None:
        dp, tp, pp = layout
        try:
            plan = arnold_mip.place(arnold.export(view), dp, tp, pp, time_limit_s=5.0)
        except (arnold_mip.ArnoldFitError, ValueError):
            return None
        per_pod: dict[str, list[int]] = {}
        for rank, mp in enumerate(plan.minipod):
            per_pod.setdefault(mp, []).append(rank)
        hosts: list[int | None] = [None] * len(plan.hosts)
        for mp, ranks in per_pod.items():
            # (free whole nodes, score) per vertex of the minipod
            verts = [([self.index[h["host"]] for h in v["hosts"]
                       if h["gpus"] > 0 and h["gpus_free"] == h["gpus"]], s)
                     for v, s in zip(sf["vertices"], sf["score_gbps"], strict=True)
                     if v["pod"] == mp]
            verts.sort(key=lambda vs: (-len(vs[0]), -vs[1]))
            pool = [h for whole, _ in verts for h in whole][:len(ranks)]
            for r, h in zip(ranks, pool, strict=False):
                hosts[r] = h
        if any(h is None for h in hosts):
            return None
        gpn = plan.matrix.gpus_per_node
        return [(int(h), gpn) for h in hosts if h is not None]

    def _spiderflow(self, sf: dict[str, Any], free: IntArray, need: int, unit: int
                    ) -> Placement | None:
        verts = sf["vertices"]
        room = np.array([sum(int(free[self.index[h["host"]]]) // unit * unit
                             for h in v["hosts"]) for v in verts])
        score = np.array(sf["score_gbps"], dtype=np.float64)
        if not len(verts) or room.sum() < need:
            return None
        fits = np.flatnonzero(room >= need)
        if len(fits):
            chosen = [int(fits[np.lexsort((room[fits], -score[fits]))[0]])]
        else:
            start = int(np.lexsort((-room, -score))[0])
            wide = np.asarray(sf["widest_gbps"][start], dtype=np.float64)
            rest = [int(k) for k in np.lexsort((-room, -wide)) if k != start and room[k] > 0]
            chosen, have = [start], int(room[start])
            for k in rest:
                if have >= need:
                    break
                chosen.append(k)
                have += int(room[k])
        taken: Placement = []
        left = need
        for k in chosen:
            members = sorted((self.index[h["host"]] for h in verts[k]["hosts"]),
                             key=lambda i: (-int(free[i]), i))
            for i in members:
                g = min(int(free[i]) // unit * unit, left)
                if g > 0:
                    taken.append((i, g))
                    left -= g
                if left == 0:
                    return taken
        return None
