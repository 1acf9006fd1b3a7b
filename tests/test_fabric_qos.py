"""The rig's emulated switch ports: (1) through a congested, rate-limited port, traffic
marked with the higher level's DSCP keeps its rate while the lower level is squeezed
-- the mechanism the leader's levels rely on; probes marked CS7 go above every level, so a
saturated port does not starve re-verification; (2) two flows whose source ports collide
on one rate-limited spine get twice the throughput once moved to distinct spines by
ports a sweep found -- the mechanism path selection relies on."""

from __future__ import annotations

import threading

import pytest

from tests.rig.fabric import Fabric, can_build
from tests.rig.probe import spine_of, sweep_from, trace_from
from tests.rig.traffic import Flow, run_flows

pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(can_build() is not None, reason=str(can_build()))]


def test_higher_dscp_keeps_its_rate_through_a_congested_port() -> None:
    rate = 8.0  # Mbit/s at leaf 1's port toward h1; each sender offers 6
    with Fabric(hosts_per_leaf=1, leaves=2, spines=1) as f:
        f.priority_queues("l1", "h1", rate, dscp_by_level=[8, 40])
        low, high = run_flows(f, [Flow("h0", "h1", 6.0, dscp=8),
                                  Flow("h0", "h1", 6.0, dscp=40)])
    print(f"through {rate} Mbit/s: high level {high:.2f}, low level {low:.2f} Mbit/s")
    # the high level gets (nearly) all it offers; the low level gets what is left
    assert high > 0.8 * 6, (high, low)
    assert low < 0.5 * 6 and high > 2 * low, (high, low)
    assert high + low <= rate * 1.15, (high, low)


def test_probes_in_the_probing_class_cross_a_port_the_top_level_saturates() -> None:
    with Fabric(hosts_per_leaf=1, leaves=2, spines=1) as f:
        for node, port in (("l0", f.uplink(0, 0)), ("s0", "l1")):  # both ways toward h1
            f.priority_queues(node, port, 4.0, dscp_by_level=[8, 40])
        before = f.class_bytes("l0", f.uplink(0, 0))
        load = threading.Thread(target=run_flows, args=(
            f, [Flow("h0", "h1", 8.0, dscp=40, dport=5001)], 4.0))  # twice the port, top level
        load.start()
        try:
            traces = [trace_from(f, "h0", "h1", 50000 + i, dscp=56) for i in range(5)]
        finally:
            load.join()
        after = f.class_bytes("l0", f.uplink(0, 0))
    assert all(t is not None and len(t) == 3 for t in traces), traces  # leaf, spine, leaf
    # every probe went in the probing class (15 datagrams of at least 50 bytes: 5 traces,
    # 3 hops each), under a saturating load in the top job level
    assert after["1:9"] - before.get("1:9", 0) >= 15 * 50, (before, after)
    assert after["1:11"] - before.get("1:11", 0) > 1_000_000, (before, after)


def _ports_by_spine(f: Fabric, src: str, dst: str) -> dict[int, list[int]]:
    doc = sweep_from(f, src, dst, expected=2, ports_per_path=2)
    return {spine_of(p["hops"][1]): p["sports"] for p in doc["paths"]}


def test_ports_on_distinct_spines_double_the_throughput_of_colliding_ones() -> None:
    rate = 6.0  # every leaf-0 uplink (toward each spine) is limited; each flow offers 6
    with Fabric(hosts_per_leaf=2, leaves=2, spines=2) as f:
        for s in range(f.spines):
            f.priority_queues("l0", f.uplink(0, s), rate, dscp_by_level=[0])
        a = _ports_by_spine(f, "h0", "h2")
        b = _ports_by_spine(f, "h1", "h3")
        # both on spine 0 (a collision, as ECMP may hash them), then on spines 0 and 1
        same = run_flows(f, [Flow("h0", "h2", rate, sport=a[0][0]),
                             Flow("h1", "h3", rate, sport=b[0][0])])
        apart = run_flows(f, [Flow("h0", "h2", rate, sport=a[0][1]),
                              Flow("h1", "h3", rate, sport=b[1][0])])
    together, spread = sum(same), sum(apart)
    print(f"colliding on one spine: {together:.2f} Mbit/s; on two spines: {spread:.2f} Mbit/s")
    assert together <= rate * 1.15, same
    assert spread > 1.7 * together and spread > 0.85 * 2 * rate, (same, apart)


def test_one_class_puts_every_level_in_the_lowest_levels_queue() -> None:
    """The testbed's paths-only mode: after one_class the top level's DSCP lands in the
    lowest level's class, on a port built with both."""
    with Fabric(hosts_per_leaf=1, leaves=2, spines=1, link_mbit=8.0,
                dscp_by_level=(8, 40)) as f:
        port = f.uplink(0, 0)
        run_flows(f, [Flow("h0", "h1", 2.0, dscp=40)], 1.0)
        split = f.class_bytes("l0", port)
        f.one_class()
        run_flows(f, [Flow("h0", "h1", 2.0, dscp=40)], 1.0)
        merged = f.class_bytes("l0", port)
    # before: the top level's class; after: the lowest level's, and the top one no more
    assert split["1:11"] > 100_000 and split.get("1:10", 0) < 10_000, split
    assert merged["1:10"] - split.get("1:10", 0) > 100_000, (split, merged)
    assert merged["1:11"] - split["1:11"] < 10_000, (split, merged)
