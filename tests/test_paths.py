"""ECMP candidate enumeration: exactness on small fabrics, the cap rule, ports."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from cruxd.model.paths import PathFinder
from cruxd.model.topology import Topology, node_sequence
from cruxd.topo import clos2, double_sided, testbed96


def _brute_force(topo: Topology, src: str, dst: str) -> set[tuple[int, ...]]:
    """All shortest host-to-host link paths, hosts never transit (DFS, small fabrics)."""
    best: list[int] = []
    found: set[tuple[int, ...]] = set()

    def walk(node: str, path: list[int], seen: set[str]) -> None:
        if best and len(path) > best[0]:
            return
        if node == dst:
            if not best or len(path) < best[0]:
                best[:] = [len(path)]
                found.clear()
            found.add(tuple(path))
            return
        if path and topo.is_host(node):
            return
        for i in topo.out_links[node]:
            nxt = topo.links[i].dst
            if nxt not in seen:
                walk(nxt, [*path, i], seen | {nxt})

    walk(src, [], {src})
    return found


@given(tors=st.integers(1, 3), aggs=st.integers(1, 3), nics=st.integers(1, 2),
       lpa=st.integers(1, 2))
def test_enumeration_equals_brute_force(tors: int, aggs: int, nics: int, lpa: int) -> None:
    topo = clos2(tors, aggs, 2, nics_per_host=nics, links_per_agg=lpa)
    finder = PathFinder(topo, max_paths=10_000)
    for src, dst in itertools.permutations(topo.hosts, 2):
        got = {tuple(int(x) for x in row) for row in finder.candidates(src, dst)}
        assert got == _brute_force(topo, src, dst)
        assert finder.count(src, dst) == len(got)


def test_clos_paths_are_up_down() -> None:
    topo = double_sided(hosts_per_pod=2)
    finder = PathFinder(topo)
    a, b = topo.hosts[0], topo.hosts[-1]  # different pods
    for row in finder.candidates(a, b):
        tiers = [topo.nodes[n].tier for n in node_sequence(topo, list(row))]
        peak = tiers.index(max(tiers))
        assert tiers[: peak + 1] == sorted(tiers[: peak + 1])
        assert tiers[peak:] == sorted(tiers[peak:], reverse=True)


def test_cap_keeps_spread_and_is_deterministic() -> None:
    topo = testbed96()  # 4 NICs x 8 aggs x 4 NICs = 128 paths between ToRs
    finder = PathFinder(topo, max_paths=32)
    assert finder.count("h0", "h11") == 128
    cands = finder.candidates("h0", "h11")
    assert cands.shape == (32, 4)
    assert len({tuple(r) for r in cands.tolist()}) == 32
    assert {topo.links[r[0]].port for r in cands} == {0, 1, 2, 3}  # every first hop
    assert {topo.links[r[1]].dst for r in cands} == {f"agg{i}" for i in range(8)}  # every spine
    again = PathFinder(topo, max_paths=32).candidates("h0", "h11")
    assert np.array_equal(cands, again)


def test_ports_pin_the_nic() -> None:
    topo = testbed96()
    cands = PathFinder(topo).candidates("h0", "h11", 2, 3)
    assert len(cands) == 8  # one per spine
    assert all(topo.links[r[0]].port == 2 and topo.links[r[-1]].port == 3 for r in cands)


def test_same_tor_is_one_hop_and_same_host_is_none() -> None:
    topo = testbed96()
    finder = PathFinder(topo)
    assert finder.candidates("h0", "h1", 0, 0).shape == (1, 2)
    assert finder.candidates("h0", "h0").shape == (0, 0)


def test_a_topology_and_its_shared_finder_die_together() -> None:
    """The leader builds a topology per plan: its cached finder must not keep it alive
    (a side table keyed by the topology leaked every plan's fabric, about 600 B per host
    and round in test_trust_leader's purge test)."""
    import gc
    import weakref

    from cruxd.model.paths import finder_for

    topo = clos2(2, 2, 2)
    finder = finder_for(topo)
    assert finder_for(topo) is finder and finder_for(topo, 4) is not finder
    finder.candidates(topo.hosts[0], topo.hosts[-1])
    gone = weakref.ref(topo)
    del topo, finder
    gc.collect()
    assert gone() is None
