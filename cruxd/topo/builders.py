"""Builders for the seed's fabrics. Our readings of the seed are in docs/topologies.md.

Naming: hosts `h<N>`, ToRs `tor<N>`, aggregation switches `agg<N>`, cores `core<N>`.
Host links are numbered NIC ports 0..n-1; a ring channel c uses port c at both ends.
"""

from __future__ import annotations

from collections.abc import Callable

from cruxd.errors import TopologyError
from cruxd.model.topology import Topology, TopologyBuilder


def _positive(**kwargs: float) -> None:
    for name, value in kwargs.items():
        if not value > 0:
            raise TopologyError(f"{name} must be > 0, got {value!r}")


def clos2(tors: int, aggs: int, hosts_per_tor: int, *, gpus_per_host: int = 8,
          nics_per_host: int = 4, nic_gbps: float = 100.0, uplink_gbps: float | None = None,
          oversubscription: float = 1.0, links_per_agg: int = 1,
          name: str = "clos2") -> Topology:
    """Two-layer Clos: every ToR connects to every aggregation switch.

    Each host has `nics_per_host` links of `nic_gbps` to its ToR. A ToR-agg link
    defaults to the ToR's host bandwidth / (aggs * links_per_agg * oversubscription),
    i.e. a 1:1 fabric unless oversubscription says otherwise.
    """
    _positive(tors=tors, aggs=aggs, hosts_per_tor=hosts_per_tor, nics_per_host=nics_per_host,
              nic_gbps=nic_gbps, oversubscription=oversubscription, links_per_agg=links_per_agg)
    if uplink_gbps is None:
        uplink_gbps = hosts_per_tor * nics_per_host * nic_gbps / (
            aggs * links_per_agg * oversubscription)
    b = TopologyBuilder(name)
    agg_ids = [b.switch(f"agg{a}", tier=2) for a in range(aggs)]
    h = 0
    for t in range(tors):
        tor = b.switch(f"tor{t}", tier=1)
        for agg in agg_ids:
            b.link(tor, agg, uplink_gbps, count=links_per_agg)
        for _ in range(hosts_per_tor):
            host = b.host(f"h{h}", gpus_per_host)
            b.link(host, tor, nic_gbps, count=nics_per_host)
            h += 1
    return b.build()


def trace_clos(**overrides: float) -> Topology:
    """The seed's trace topology: 173 ToR + 16 aggregation switches, 2 hosts of 8 GPUs
    per ToR (346 hosts, 2,768 GPUs), 4 x 100 Gbps NIC links per host, 1:1."""
    params: dict[str, float] = {"tors": 173, "aggs": 16, "hosts_per_tor": 2}
    params.update(overrides)
    return clos2(name="trace-clos", **params)  # type: ignore[arg-type]


def double_sided(*, pods: int = 3, tors_per_pod: int = 2, aggs_per_pod: int = 4,
                 cores: int = 32, hosts_per_pod: int = 86, gpus_per_host: int = 8,
                 links_per_host: int = 8, nic_gbps: float = 100.0,
                 oversubscription: float = 1.0, tor_agg_links: int = 2,
                 agg_core_links: int = 1, name: str = "double-sided") -> Topology:
    """Three-layer double-sided fabric (defaults: 6 ToR, 12 aggregation, 32 core).

    A pod is `tors_per_pod` ToRs and `aggs_per_pod` aggregation switches; every host
    of a pod is homed to all of its ToRs, its `links_per_host` NIC links split evenly
    (ports 0-3 to the first ToR, 4-7 to the second). Every ToR links to every
    aggregation switch of its pod; aggregation switch i of each pod links to the
    cores of plane i (cores / aggs_per_pod cores per plane). Switch-to-switch
    capacities keep the fabric 1:1 unless `oversubscription` says otherwise.

    A ToR-agg pair is `tor_agg_links` parallel cables and an agg-core pair
    `agg_core_links`, each cable an equal share of the pair's capacity: separate
    links that ECMP hashes over, as a real bundle is, so two flows can collide on
    one cable while its sibling idles. The defaults keep a rail-pinned flow between
    pods at 4 aggs x 2 cores x 2 x 2 cables = 32 candidates, under the path finder's
    cap of 64: past it the cap's stride would skip the same cable for every flow.
    """
    _positive(pods=pods, tors_per_pod=tors_per_pod, aggs_per_pod=aggs_per_pod, cores=cores,
              hosts_per_pod=hosts_per_pod, links_per_host=links_per_host, nic_gbps=nic_gbps,
              oversubscription=oversubscription, tor_agg_links=tor_agg_links,
              agg_core_links=agg_core_links)
    if links_per_host % tors_per_pod:
        raise TopologyError("links_per_host must split evenly over the pod's ToRs")
    if cores % aggs_per_pod:
        raise TopologyError("cores must split evenly into one plane per aggregation switch")
    per_plane = cores // aggs_per_pod
    tor_down = hosts_per_pod * (links_per_host // tors_per_pod) * nic_gbps
    tor_agg = tor_down / aggs_per_pod / oversubscription
    agg_core = tor_agg * tors_per_pod / per_plane / oversubscription
    b = TopologyBuilder(name)
    core_ids = [b.switch(f"core{c}", tier=3) for c in range(cores)]
    h = 0
    for p in range(pods):
        aggs = [b.switch(f"agg{p * aggs_per_pod + a}", tier=2) for a in range(aggs_per_pod)]
        for a, agg in enumerate(aggs):
            for core in core_ids[a * per_plane:(a + 1) * per_plane]:
                b.link(agg, core, agg_core / agg_core_links, count=agg_core_links)
        tors = [b.switch(f"tor{p * tors_per_pod + t}", tier=1) for t in range(tors_per_pod)]
        for tor in tors:
            for agg in aggs:
                b.link(tor, agg, tor_agg / tor_agg_links, count=tor_agg_links)
        for _ in range(hosts_per_pod):
            host = b.host(f"h{h}", gpus_per_host)
            for tor in tors:
                b.link(host, tor, nic_gbps, count=links_per_host // tors_per_pod)
            h += 1
    return b.build()


def testbed96(*, agg_links_per_tor: int = 1, nic_gbps: float = 100.0,
              fabric_gbps: float = 100.0) -> Topology:
    """The seed's 96-GPU testbed (§6.1): 12 hosts x 8 A100, 4 NIC links per host.

    Reading: 6 ToRs with 8 x 100 Gbps host ports each hold 2 hosts x 4 links; each
    ToR links to each of the 8 aggregation switches with `agg_links_per_tor` x 100 Gbps
    (default 1: 8 up = 8 down, non-blocking). GPUs 2i and 2i+1 share NIC port i.
    """
    b = TopologyBuilder("testbed96")
    aggs = [b.switch(f"agg{a}", tier=2) for a in range(8)]
    for t in range(6):
        tor = b.switch(f"tor{t}", tier=1)
        for agg in aggs:
            b.link(tor, agg, fabric_gbps, count=agg_links_per_tor)
        for i in range(2):
            host = b.host(f"h{2 * t + i}", 8)
            b.link(host, tor, nic_gbps, count=4)
    return b.build()


BUILDERS: dict[str, Callable[..., Topology]] = {
    "clos2": clos2,
    "trace_clos": trace_clos,
    "double_sided": double_sided,
    "testbed96": testbed96,
}
