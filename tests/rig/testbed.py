"""A scenario file run for real on the namespace Clos: the emulated testbed.

`Layout.of(scenario, scale)` maps the scenario's fabric onto `Fabric`: each tier-1
switch becomes a leaf, each tier-2 switch a spine, hosts keep their order, and every
link's rate is multiplied by `scale` (Gbit/s x 1e-3 = Mbit/s at the default). Each job's
bytes are multiplied by the same factor, so its transfer times, and with them its
compute-to-communication ratio, stay those of the profile; compute times are not scaled.

A job whose scenario entry has `arrival_s` starts that long after the measured window
opens, and one with `iterations` leaves after that many iterations in the window
(tests/rig/testbed_churn.py). tests/rig/testbed_run.py runs the jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cruxd.errors import UsageError
from cruxd.model.topology import NodeKind, Topology
from cruxd.scenario import Scenario
from tests.rig.fabric import MAX_HOSTS, MAX_SPINES, Fabric

# Job k of a scenario listens on RING_PORT + k on each of its hosts: two jobs may share a
# host, each ring on its own port, each port probed and steered for its own job (crux-run
# --tcp-port), as two jobs' listeners on one real host would be
RING_PORT = 5301
Hop = tuple[str, str]  # (src host, dst host) of a ring hop
SpineBytes = dict[str, dict[Hop, list[int]]]  # per job and hop between leaves, per spine


@dataclass(frozen=True)
class EmuJob:
    id: str
    hosts: tuple[str, ...]  # rig host names, ring order
    gpus: int
    compute_s: float
    overlap: float
    hop_bytes: int  # per ring hop and iteration, scaled
    flops: float = 0.0  # W_j, what crux-hints declares
    model_bytes: float = 0.0  # unscaled, what crux-hints declares
    host_gpus: tuple[int, ...] = ()  # GPUs on each host of the ring
    arrival_s: float = 0.0  # starts this long after the measured window opens
    iterations: int | None = None  # leaves after this many iterations in the window
    port: int = RING_PORT  # every rank of the job listens on this TCP port

    @property
    def churns(self) -> bool:
        """Whether the job arrives or leaves mid-run."""
        return self.arrival_s > 0 or self.iterations is not None

    @property
    def hops(self) -> list[tuple[str, str]]:
        """The ring's (src, dst) host pairs, in ring order."""
        return list(zip(self.hosts, self.hosts[1:] + self.hosts[:1], strict=True))


@dataclass(frozen=True)
class Layout:
    leaves: int
    hosts_per_leaf: int
    spines: int
    host_mbit: float
    uplink_mbit: float
    jobs: tuple[EmuJob, ...]
    host_ids: tuple[str, ...] = ()  # the scenario's host of each rig host h0, h1, ...
    spine_ids: tuple[str, ...] = ()  # the scenario's switch of each rig spine
    leaf_ids: tuple[str, ...] = ()  # the scenario's switch of each rig leaf

    @staticmethod
    def of(sc: Scenario, scale: float = 1e-3) -> Layout:
        """The rig that emulates `sc` (UsageError naming what the rig cannot build)."""
        topo = sc.view.topology
        tors, aggs, hosts = _tiers(topo)
        per_leaf = {t: [h for h in hosts if _tor_of(topo, h) == t] for t in tors}
        sizes = {len(v) for v in per_leaf.values()}
        if len(sizes) != 1:
            raise UsageError(f"{sc.name}: the rig needs the same number of hosts under every "
                             f"ToR, got {sorted(sizes)}")
        nics = {len(topo.uplinks(h)) for h in hosts}
        if nics != {1}:
            raise UsageError(f"{sc.name}: the rig gives each host one NIC link, the scenario "
                             f"has {sorted(nics)} (use clos2 with nics_per_host = 1)")
        host_gbps = {topo.links[topo.uplinks(h)[0]].capacity_gbps for h in hosts}
        up = {topo.links[i].capacity_gbps for t in tors for i in topo.out_links.get(t, ())
              if topo.nodes[topo.links[i].dst].kind is NodeKind.SWITCH}
        if len(host_gbps) != 1 or len(up) != 1:
            raise UsageError(f"{sc.name}: the rig needs one host link rate and one uplink "
                             f"rate, got {sorted(host_gbps)} and {sorted(up)}")
        ups = {sum(1 for i in topo.out_links.get(t, ()) if topo.links[i].dst in aggs)
               for t in tors}
        if ups != {len(aggs)}:
            raise UsageError(f"{sc.name}: the rig links every leaf once to every spine")
        if not 1 <= len(aggs) <= MAX_SPINES or len(hosts) > MAX_HOSTS:
            raise UsageError(f"{sc.name}: at most {MAX_SPINES} spines and {MAX_HOSTS} hosts")
        order = [h for t in tors for h in per_leaf[t]]
        host_map = {h: f"h{k}" for k, h in enumerate(order)}
        jobs = []
        for k, (j, timing) in enumerate(zip(sc.view.jobs, sc.simulation.timing, strict=True)):
            ring = tuple(h for h, _ in j.hosts)
            hop = max((f.bytes for f in j.flows), default=0.0)
            jobs.append(EmuJob(j.id, tuple(host_map[h] for h in ring), j.gpus, j.compute_s,
                               j.overlap, int(hop * scale), j.flops,
                               # a ring hop carries 2(K-1)/K of the model over K GPUs
                               hop * j.gpus / (2 * max(1, j.gpus - 1)),
                               tuple(g for _, g in j.hosts), timing.arrival_s,
                               None if timing.iterations is None
                               else max(1, round(timing.iterations)), RING_PORT + k))
        return Layout(len(tors), sizes.pop(), len(aggs), host_gbps.pop() * 1e3 * scale,
                      up.pop() * 1e3 * scale, tuple(jobs), tuple(order), tuple(aggs),
                      tuple(tors))

    def on_host(self, host: str) -> list[tuple[EmuJob, int]]:
        """The jobs with a rank on rig host `host`, each with that rank."""
        return [(j, j.hosts.index(host)) for j in self.jobs if host in j.hosts]

    def leaf_of(self, host: str) -> int:
        """The leaf of a rig host (hosts are numbered leaf by leaf, as Fabric does)."""
        return int(host[1:]) // self.hosts_per_leaf

    def observed_paths(self, carried: SpineBytes) -> dict[str, dict[tuple[str, str], str]]:
        """Per job, the scenario's (src, dst) host pair of every hop between leaves and
        the spine that carried most of its bytes (for cruxd.sim.policies.pinned)."""
        out: dict[str, dict[tuple[str, str], str]] = {}
        for job, hops in carried.items():
            for (a, b), per_spine in hops.items():
                if sum(per_spine) > 0:
                    spine = max(range(len(per_spine)), key=per_spine.__getitem__)
                    out.setdefault(job, {})[(self.host_ids[int(a[1:])],
                                             self.host_ids[int(b[1:])])] = self.spine_ids[spine]
        return out

    def planned_paths(self, jobs: dict[str, Any]) -> dict[str, dict[tuple[str, str], str]]:
        """The same from the leader's plan (its jobs as `cruxctl status --json` gives
        them): the spine each route between leaves was planned through. A spine answers
        probes from one of its addresses, 10.3.(MAX_SPINES leaf + spine).2, whichever
        the leaf; the address names the spine. Routes it cannot read (within a leaf,
        unprobed, hops that are not rig addresses) are left out."""
        out: dict[str, dict[tuple[str, str], str]] = {}
        for job, doc in jobs.items():
            for r in doc.get("routes", []):
                hops = r.get("hops", [])
                try:
                    spine = self.spine_ids[int(str(hops[1]).split(".")[2]) % MAX_SPINES]
                    pair = (self.host_ids[int(str(r["src_host"])[1:])],
                            self.host_ids[int(str(r["peer_host"])[1:])])
                except (IndexError, KeyError, ValueError):
                    continue
                if len(hops) == 3:
                    out.setdefault(job, {})[pair] = spine
        return out

    def fabric(self, dscp_by_level: tuple[int, ...] = (0,)) -> Fabric:
        return Fabric(hosts_per_leaf=self.hosts_per_leaf, leaves=self.leaves,
                      spines=self.spines, host_mbit=self.host_mbit,
                      uplink_mbit=self.uplink_mbit, dscp_by_level=dscp_by_level,
                      queue_packets=32, goodput=True)


def _tiers(topo: Topology) -> tuple[list[str], list[str], list[str]]:
    tier = {n.id: n.tier for n in topo.nodes.values() if n.kind is NodeKind.SWITCH}
    if set(tier.values()) != {1, 2}:
        raise UsageError(f"{topo.name}: the rig builds two switch tiers (ToR, spine); this "
                         f"fabric has tiers {sorted(set(tier.values()))}")
    return ([s for s, t in tier.items() if t == 1], [s for s, t in tier.items() if t == 2],
            topo.hosts)


def _tor_of(topo: Topology, host: str) -> str:
    tors = {topo.links[i].dst for i in topo.uplinks(host)}
    if len(tors) != 1:
        raise UsageError(f"{topo.name}: {host} links to {sorted(tors)}; the rig hangs each "
                         f"host off one leaf")
    return tors.pop()
