"""Priority compression (seed §4.3): Fig. 13 and the invariants of Max-K-Cut."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cruxd.scenario import load_scenario
from cruxd.scheduler import plan
from cruxd.scheduler.compression import compress
from cruxd.scheduler.compression_mip import compress_exact, cut_weight
from tests.paths import EXAMPLES

Edges = dict[tuple[str, str], float]


@st.composite
def dags(draw: st.DrawFn, max_nodes: int = 8) -> Edges:
    """Random weighted DAGs: edges only go forward in a hidden random order."""
    n = draw(st.integers(2, max_nodes))
    names = draw(st.permutations([f"j{i}" for i in range(n)]))
    edges: Edges = {}
    for a, b in itertools.combinations(range(n), 2):
        if draw(st.booleans()):
            edges[(names[a], names[b])] = draw(st.integers(1, 20)) / 4
    if not edges:
        edges[(names[0], names[1])] = 1.0
    return edges


@st.composite
def hamiltonian_dags(draw: st.DrawFn) -> Edges:
    """DAGs with a Hamiltonian path, hence exactly one topological order."""
    edges = draw(dags())
    names = sorted({x for e in edges for x in e})
    order = draw(st.permutations(names))
    edges = {e: w for e, w in edges.items() if order.index(e[0]) < order.index(e[1])}
    for a, b in itertools.pairwise(order):
        edges.setdefault((a, b), draw(st.integers(1, 20)) / 4)
    return edges


@given(edges=dags(), levels=st.integers(1, 5), seed=st.integers(0, 3))
def test_compression_is_valid_and_complete(edges: Edges, levels: int, seed: int) -> None:
    got = compress(edges, levels, samples=4, seed=seed)
    assert set(got) == {x for e in edges for x in e}
    assert all(0 <= lv < levels for lv in got.values())
    assert all(got[h] >= got[lo] for h, lo in edges)  # never inverts an edge


@given(edges=dags(), levels=st.integers(1, 5))
def test_cut_weight_matches_the_output(edges: Edges, levels: int) -> None:
    got = compress(edges, levels)
    recomputed = sum(w for (h, lo), w in edges.items() if got[h] != got[lo])
    assert cut_weight(edges, got) == pytest.approx(recomputed)
    assert cut_weight(edges, got) <= cut_weight(edges, compress_exact(edges, levels)) + 1e-9


@given(n=st.integers(2, 12), levels=st.integers(1, 6), data=st.data())
def test_chains_are_solved_exactly(n: int, levels: int, data: st.DataObject) -> None:
    weights = data.draw(st.lists(st.integers(1, 50), min_size=n - 1, max_size=n - 1))
    edges = {(f"c{i}", f"c{i + 1}"): float(w) for i, w in enumerate(weights)}
    got = compress(edges, levels, samples=1)
    best = sum(sorted(weights, reverse=True)[: levels - 1])  # cut the K-1 heaviest links
    assert cut_weight(edges, got) == pytest.approx(best)
    assert cut_weight(edges, compress_exact(edges, levels)) == pytest.approx(best)


@given(edges=hamiltonian_dags(), levels=st.integers(1, 5))
def test_one_order_suffices_when_the_order_is_unique(edges: Edges, levels: int) -> None:
    got = compress(edges, levels, samples=1)
    assert cut_weight(edges, got) == pytest.approx(cut_weight(edges, compress_exact(edges, levels)))


def test_exact_agrees_with_brute_force() -> None:
    edges = {("a", "b"): 3.0, ("a", "c"): 1.0, ("b", "d"): 2.0, ("c", "d"): 5.0, ("a", "d"): 1.0}
    for levels in (1, 2, 3):
        names = sorted({x for e in edges for x in e})
        options = [dict(zip(names, lv, strict=True))
                   for lv in itertools.product(range(levels), repeat=len(names))]
        brute = max(cut_weight(edges, a) for a in options
                    if all(a[h] >= a[lo] for h, lo in edges))
        assert cut_weight(edges, compress_exact(edges, levels)) == pytest.approx(brute)


def test_fig13_knowing_the_contention_beats_both_naive_splits() -> None:
    sc = load_scenario(EXAMPLES / "fig13-compression.json")
    p = plan(sc.view, sc.config)
    assert [d.job for d in p.jobs] == ["job1", "job2", "job3", "job4"]  # decreasing priority
    levels = {d.job: d.level for d in p.jobs}
    assert levels == {"job1": 1, "job2": 0, "job3": 1, "job4": 0}
    edges = {("job1", "job2"): p.job("job1").intensity, ("job3", "job4"): p.job("job3").intensity}
    sincronia = {"job1": 1, "job2": 0, "job3": 0, "job4": 0}
    balanced = {"job1": 1, "job2": 1, "job3": 0, "job4": 0}
    assert cut_weight(edges, levels) > cut_weight(edges, sincronia) > cut_weight(edges, balanced)
    assert p.cut_weight == pytest.approx(p.contention_weight)


def test_bad_edges_are_refused() -> None:
    with pytest.raises(ValueError, match="cycle"):
        compress({("a", "b"): 1.0, ("b", "a"): 1.0}, 2)
    with pytest.raises(ValueError, match="finite"):
        compress({("a", "b"): float("nan")}, 2)
    with pytest.raises(ValueError, match="itself"):
        compress({("a", "a"): 1.0}, 2)
    with pytest.raises(ValueError, match="levels"):
        compress({("a", "b"): 1.0}, 0)


def test_large_components_stay_exact_on_chains() -> None:
    # above 2,048 jobs the DP runs on a float32 prefix matrix; a chain's optimum is
    # still known in closed form: cut the K-1 heaviest links
    n, levels = 2100, 6
    weights = [((i * 7919) % 1000) / 10 + 1 for i in range(n - 1)]
    edges = {(f"c{i:04d}", f"c{i + 1:04d}"): w for i, w in enumerate(weights)}
    got = compress(edges, levels, samples=2)
    assert all(got[h] >= got[lo] for h, lo in edges)
    assert cut_weight(edges, got) == pytest.approx(sum(sorted(weights)[-(levels - 1):]))
