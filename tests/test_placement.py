"""Trace placement policies (cruxd/sim/placement.py): what every policy must keep, what
each one does, and that `none` fragments more than the topology-aware ones."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cruxd.model.jobs import ring_allreduce
from cruxd.sim.hint_placement import Advisor, FabricLoad
from cruxd.sim.placement import PLACEMENTS, Extra, place
from cruxd.sim.trace import host_groups, trace_jobs, trace_stats
from cruxd.topo.builders import clos2, double_sided

TOPO = double_sided()  # pods of ToRs: every level of HiveD's cells exists
HOSTS = [h for h in TOPO.hosts if TOPO.nodes[h].gpus > 0]
CAP = np.array([TOPO.nodes[h].gpus for h in HOSTS], dtype=np.int64)
GROUP, POD = host_groups(TOPO, HOSTS)


@settings(max_examples=150, deadline=None)
@given(policy=st.sampled_from(PLACEMENTS),
       ops=st.lists(st.tuples(st.booleans(), st.integers(1, 64), st.booleans()),
                    min_size=1, max_size=60))
def test_no_gpu_twice_capacity_kept_and_departures_free(
        policy: str, ops: list[tuple[bool, int, bool]]) -> None:
    free = CAP.copy()
    running: list[list[tuple[int, int]]] = []
    for arrive, need, split in ops:
        if arrive or not running:
            got = place(policy, free, CAP, GROUP, POD, need, split)
            if got is None:  # a job waits only when the free GPUs cannot hold it
                assert need > int(free.sum())
                continue
            assert sum(g for _, g in got) == need
            assert len({h for h, _ in got}) == len(got)  # a host once per job
            for h, g in got:
                assert 0 < g <= free[h]  # nothing taken twice, nothing over capacity
                free[h] -= g
            running.append(got)
        else:
            for h, g in running.pop(need % len(running)):
                free[h] += g
        assert (free >= 0).all() and (free <= CAP).all()
    for got in running:  # everything leaves: every GPU is free again
        for h, g in got:
            free[h] += g
    assert (free == CAP).all()


def test_unknown_placement_is_named() -> None:
    with pytest.raises(ValueError, match="placements: packed, none, hived, muri, crux-hints"):
        trace_jobs(TOPO, jobs=1, days=1, placement="random")


def test_packing_same_host_and_same_tor_first() -> None:
    topo = clos2(4, 2, 4)  # 16 hosts of 8 GPUs, 4 under each ToR
    hosts = topo.hosts
    cap = np.array([topo.nodes[h].gpus for h in hosts], dtype=np.int64)
    group, pod = host_groups(topo, hosts)
    free = cap.copy()
    free[[0, 1, 2, 5]] = [3, 0, 0, 0]  # ToR 0 has one whole host left, ToR 1 three
    placed = place("packed", free, cap, group, pod, 24, split=False)
    assert placed is not None and {group[h] for h, _ in placed} == {1}
    assert [g for _, g in placed] == [8, 8, 8]
    assert place("packed", free, cap, group, pod, 3, split=False) == [(0, 3)]  # best fit
    pair = place("packed", free, cap, group, pod, 8, split=True)  # 4 + 4 under one ToR
    assert pair is not None and len(pair) == 2 and group[pair[0][0]] == group[pair[1][0]]
    assert place("packed", free, cap, group, pod, int(free.sum()) + 1, split=False) is None


def test_first_fit_takes_gpus_in_host_order_and_hived_the_fullest_cell() -> None:
    topo = clos2(4, 2, 4)
    hosts = topo.hosts
    cap = np.array([topo.nodes[h].gpus for h in hosts], dtype=np.int64)
    group, pod = host_groups(topo, hosts)
    free = cap.copy()
    free[[0, 5, 6]] = [2, 4, 0]  # ToR 0: 2 GPUs gone from host 0; ToR 1: 12 gone
    assert place("none", free, cap, group, pod, 12, False) == [(0, 2), (1, 8), (2, 2)]
    # 12 GPUs fit no host: the smallest cell that can hold them is a ToR group; ToR 1
    # has the fewest free GPUs that still hold them (buddy: keep whole ToRs whole)
    got = place("hived", free, cap, group, pod, 12, False)
    assert got is not None and {int(group[h]) for h, _ in got} == {1}
    assert place("hived", free, cap, group, pod, 2, False) == [(0, 2)]  # the fullest host


def test_none_fragments_more_than_hived_on_the_same_arrivals() -> None:
    stats = {p: trace_stats(trace_jobs(TOPO, jobs=800, days=2, seed=2, placement=p), TOPO)
             for p in ("none", "hived")}
    assert stats["none"]["span_pods"] > stats["hived"]["span_pods"] + 0.05
    assert stats["none"]["span_tors"] > stats["hived"]["span_tors"] + 0.05


@pytest.mark.parametrize("policy", PLACEMENTS)
def test_placement_is_deterministic_per_seed(policy: str) -> None:
    def key(seed: int) -> list[tuple[str, tuple[tuple[str, int], ...], float]]:
        return [(s.job.id, s.job.hosts, s.arrival_s)
                for s in trace_jobs(TOPO, jobs=200, days=1, seed=seed, placement=policy)]
    assert key(3) == key(3) and key(3) != key(4)


SMALL = double_sided(hosts_per_pod=6)  # 3 pods x 6 hosts: cheap hint exports
S_HOSTS = [h for h in SMALL.hosts if SMALL.nodes[h].gpus > 0]
S_CAP = np.array([SMALL.nodes[h].gpus for h in S_HOSTS], dtype=np.int64)
S_GROUP, S_POD = host_groups(SMALL, S_HOSTS)


@settings(max_examples=40, deadline=None)
@given(policy=st.sampled_from(("muri", "crux-hints")),
       ops=st.lists(st.tuples(st.booleans(), st.sampled_from([2, 4, 8, 12, 16, 24, 32, 48]),
                              st.sampled_from([1, 2, 4, 8]), st.booleans()),
                    min_size=1, max_size=25))
def test_load_aware_placements_keep_the_invariants_with_live_loads(
        policy: str, ops: list[tuple[bool, int, int, bool]]) -> None:
    """muri and crux-hints with the running jobs' link loads and the real hint exports:
    no GPU twice, capacity kept, departures free, TP groups never split over hosts."""
    fabric = FabricLoad(SMALL, S_GROUP, S_HOSTS)
    advisor = Advisor(SMALL, S_HOSTS, S_CAP, fabric)
    ports = {h: SMALL.nic_ports(h) for h in S_HOSTS}
    free = S_CAP.copy()
    running: list[tuple[int, list[tuple[int, int]]]] = []
    for key, (arrive, need, unit, gpt) in enumerate(ops):
        unit = min(unit, need) if need % min(unit, need) == 0 else 1
        if arrive or not running:
            layout = (need // unit, unit, 1) if gpt and need % 8 == 0 and need >= 16 else None

            def advise(f: np.ndarray, n: int, u: int, layout: tuple[int, int, int] | None = layout
                       ) -> list[tuple[int, int]] | None:
                return advisor.advise(f, n, u, layout)
            extra = Extra(uplink_load=fabric.uplink_load(), heavy=fabric.heavy(float(need)),
                          advise=advise)
            got = place(policy, free, S_CAP, S_GROUP, S_POD, need, False, unit=unit, extra=extra)
            if got is None:
                assert need > int((free // unit * unit).sum())
                continue
            assert sum(g for _, g in got) == need and len({h for h, _ in got}) == len(got)
            for h, g in got:
                assert 0 < g <= free[h] and g % unit == 0
                free[h] -= g
            members = tuple((S_HOSTS[h], g) for h, g in got)
            fabric.add(key, ring_allreduce(members, 1e9, ports), 1.0, float(need))
            running.append((key, got))
        else:
            gone_key, gone = running.pop(need % len(running))
            fabric.remove(gone_key)
            for h, g in gone:
                free[h] += g
    for gone_key, gone in running:
        fabric.remove(gone_key)
        for h, g in gone:
            free[h] += g
    assert (free == S_CAP).all() and np.allclose(fabric.gbps, 0.0)


def test_crux_hints_steers_away_from_loaded_tors_and_muri_interleaves() -> None:
    topo = clos2(4, 2, 4)  # 4 ToRs of 4 hosts
    hosts = topo.hosts
    cap = np.array([topo.nodes[h].gpus for h in hosts], dtype=np.int64)
    group, pod = host_groups(topo, hosts)
    fabric = FabricLoad(topo, group, hosts)
    free = cap.copy()
    free[[0, 1, 4, 5]] = 0  # a running job on two hosts under ToR 0 and two under ToR 1
    busy = (("h0", 8), ("h1", 8), ("h4", 8), ("h5", 8))
    fabric.add(0, ring_allreduce(busy, 50e9, {h: topo.nic_ports(h) for h, _ in busy}), 1.0,
               1e12)
    load = fabric.uplink_load()
    assert load[0] > 0 and load[1] > 0 and load[2] == load[3] == 0
    # ToRs 0 and 1 have the fewest free GPUs: HiveD packs there, crux's hints do not
    assert {int(group[h]) for h, _ in place("hived", free, cap, group, pod, 16, False)
            or []} <= {0, 1}
    advisor = Advisor(topo, hosts, cap, fabric)
    got = advisor.advise(free, 16, 1, None)
    assert got is not None and {int(group[h]) for h, _ in got} <= {2, 3}
    assert len({int(group[h]) for h, _ in got}) == 1  # one ToR holds it whole
    arnold = advisor.advise(free, 16, 8, (2, 8, 1))  # a GPT layout: Arnold's MIP
    assert arnold is not None and all(g == 8 for _, g in arnold)
    assert advisor.advise(free, 8, 1, None) is None  # one host: left to the cells
    heavy = Extra(uplink_load=load, heavy=True)
    light = Extra(uplink_load=load, heavy=False)
    got_h = place("muri", free, cap, group, pod, 16, False, extra=heavy)
    got_l = place("muri", free, cap, group, pod, 16, False, extra=light)
    assert got_h is not None and {int(group[h]) for h, _ in got_h} <= {2, 3}
    assert got_l is not None and {int(group[h]) for h, _ in got_l} <= {0, 1}


def test_muri_takes_a_pods_hosts_by_their_tors_uplink_load() -> None:
    """On the trace's Clos a ToR group is 16 GPUs, so a larger job is placed in the pod;
    there muri orders the hosts by their ToR group's uplink load (HiveD: most free
    first), which is what sets it apart from hived there."""
    topo = clos2(4, 2, 2)  # 4 ToRs of 2 hosts of 8 GPUs
    hosts = topo.hosts
    cap = np.array([topo.nodes[h].gpus for h in hosts], dtype=np.int64)
    group, pod = host_groups(topo, hosts)
    fabric = FabricLoad(topo, group, hosts)
    free = cap.copy()
    free[[0, 2]] = 0  # a running job across ToRs 0 and 1
    busy = (("h0", 8), ("h2", 8))
    fabric.add(0, ring_allreduce(busy, 50e9, {h: topo.nic_ports(h) for h, _ in busy}), 1.0,
               1e12)
    load = fabric.uplink_load()
    assert load[0] > 0 and load[1] > 0 and load[2] == load[3] == 0

    def tors(policy: str, extra: Extra | None = None) -> list[int]:
        got = place(policy, free, cap, group, pod, 24, False, extra=extra)
        assert got is not None and sum(g for _, g in got) == 24
        return sorted(int(group[h]) for h, _ in got)
    assert tors("hived") == [0, 1, 2]  # whole free hosts in host order: h1, h3, h4
    assert tors("muri", Extra(uplink_load=load, heavy=True)) == [2, 2, 3]  # quiet ToRs
    assert tors("muri", Extra(uplink_load=load, heavy=False)) == [0, 1, 2]  # busy first
