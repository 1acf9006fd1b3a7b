"""Trace placement policies (cruxd/sim/placement.py): what every policy must keep, what
each one does, and that `none` fragments more than the topology-aware ones."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cruxd.sim.placement import PLACEMENTS, place
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
    with pytest.raises(ValueError, match="placements: packed, none, hived"):
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
