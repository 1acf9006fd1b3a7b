"""SpiderFlow export (cruxd/hints/spiderflow.py) and the SpinSearch reference consumer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cruxd.hints.fabric_view import build_view
from cruxd.hints.spiderflow import bandwidth_scores, export, widest_paths
from cruxd.model.topology import Topology, TopologyBuilder
from cruxd.topo.builders import double_sided, testbed96
from tests.consumers.spinsearch import spin_search

SCHEMA = json.loads((Path(__file__).parents[1] / "docs/hints/spiderflow.schema.json").read_text())


def fig2_document() -> dict[str, Any]:
    """Seed Fig. 2 / Table 1 as a crux.spiderflow document.

    From the text: a, b, c, d have 4 free GPUs, e and g 12; a-b-c-d sums to
    latency 3, a-e is 7, a-g is 1. Our reading of what the text leaves out:
    each chain edge has latency 1, f (4 GPUs) hangs off e with latency 2, and
    bandwidth = 100 / latency ("smaller numbers imply ... higher bandwidth").
    """
    gpus = {"a": 4, "b": 4, "c": 4, "d": 4, "e": 12, "f": 4, "g": 12}
    latency = {("a", "b"): 1, ("b", "c"): 1, ("c", "d"): 1, ("a", "e"): 7,
               ("e", "f"): 2, ("a", "g"): 1}
    ids = list(gpus)
    bw = np.zeros((len(ids), len(ids)))
    for (u, v), lat in latency.items():
        bw[ids.index(u), ids.index(v)] = bw[ids.index(v), ids.index(u)] = 100.0 / lat
    beta = widest_paths(bw)
    return {
        "format": "crux.spiderflow", "version": 1, "name": "seed-fig2", "generated_unix_ms": 0,
        "vertices": [{"id": c, "gpus": g, "gpus_free": g} for c, g in gpus.items()],
        "edges": [{"u": ids.index(u), "v": ids.index(v), "gbps": 100.0 / lat, "hops": 1,
                   "latency": lat} for (u, v), lat in latency.items()],
        "widest_gbps": [[None if np.isinf(x) else float(x) for x in row] for row in beta],
        "score": "incident",
        "score_gbps": [float(s) for s in bandwidth_scores(bw)],
    }


@pytest.mark.parametrize("source", ["a", None])
def test_fig2_picks_trajectory_3(source: str | None) -> None:
    doc = fig2_document()
    jsonschema.validate(doc, SCHEMA)
    # e would fit the 12 GPUs left after a as well (trajectory 2); bandwidth-first
    # ordering is what prefers g, the latency-1 neighbour
    assert spin_search(doc, 16, source=source) == {"a": 4, "g": 12}


def test_fig2_small_task_stays_local_and_hop_expansion_fills_big_ones() -> None:
    doc = fig2_document()
    assert spin_search(doc, 4, source="a") == {"a": 4}
    assert spin_search(doc, 12) == {"g": 12}  # first fit in B_i order: g (100) beats e (64)
    big = spin_search(doc, 40)
    assert big is not None and sum(big.values()) == 40
    assert spin_search(doc, 45) is None  # 44 GPUs in all


def _check(doc: dict[str, Any], placement: dict[str, int] | None, demand: int) -> None:
    assert placement is not None and sum(placement.values()) == demand
    free = {v["id"]: v["gpus_free"] for v in doc["vertices"]}
    assert all(0 < n <= free[c] for c, n in placement.items())


def test_double_sided_export_validates_and_places() -> None:
    doc = export(build_view(double_sided(hosts_per_pod=4)))
    jsonschema.validate(doc, SCHEMA)
    assert [v["id"] for v in doc["vertices"]] == ["tor0+tor1", "tor2+tor3", "tor4+tor5"]
    assert all(e["hops"] == 4 for e in doc["edges"])
    one = spin_search(doc, 24)
    _check(doc, one, 24)
    assert one is not None and len(one) == 1  # a pod holds 32: one leaf group
    two = spin_search(doc, 40)
    _check(doc, two, 40)
    assert two is not None and sorted(two.values()) == [8, 32]  # a pod is filled first


def test_testbed96_export_validates_and_prefers_one_leaf() -> None:
    used = {"h0": 8, "h1": 4, "h2": 8}
    doc = export(build_view(testbed96(), used=used))
    jsonschema.validate(doc, SCHEMA)
    assert [v["gpus_free"] for v in doc["vertices"]] == [4, 8, 16, 16, 16, 16]
    assert spin_search(doc, 16) == {"tor2": 16}  # the first group that alone fits
    assert spin_search(doc, 8) is not None and len(spin_search(doc, 8) or {}) == 1
    _check(doc, spin_search(doc, 76), 76)  # 96 - 20 used
    assert spin_search(doc, 77) is None


def two_pods() -> Topology:
    """Two pods of two single-homed ToRs (2 hosts x 8 GPUs each), one core."""
    b = TopologyBuilder("two-pods")
    core = b.switch("core0", tier=3)
    for p in range(2):
        agg = b.switch(f"agg{p}", tier=2)
        b.link(agg, core, 400.0)
        for t in range(2):
            tor = b.switch(f"tor{2 * p + t}", tier=1)
            b.link(tor, agg, 400.0)
            for i in range(2):
                b.link(b.host(f"h{4 * p + 2 * t + i}", 8), tor, 100.0, count=2)
    return b.build()


def test_spreads_within_a_pod_before_across_pods() -> None:
    doc = export(build_view(two_pods()))
    jsonschema.validate(doc, SCHEMA)
    hops = {(e["u"], e["v"]): e["hops"] for e in doc["edges"]}
    assert hops[(0, 1)] == 2 and hops[(0, 2)] == 4
    placement = spin_search(doc, 40)
    _check(doc, placement, 40)
    assert placement is not None and list(placement)[:2] == ["tor0", "tor1"]
    assert placement["tor0"] == placement["tor1"] == 16


def test_load_reduces_residual_bandwidth() -> None:
    topo = testbed96()
    idle = export(build_view(topo))
    loaded = export(build_view(topo, load={("tor0", "agg0"): (60.0, 20.0)},
                               measured={("agg1", "tor0"): 50.0}))
    gbps = {(e["u"], e["v"]): e["gbps"] for e in idle["edges"]}
    after = {(e["u"], e["v"]): e["gbps"] for e in loaded["edges"]}
    # b_ij is the narrower direction: up 800 - 80 planned, down 800 - 50 measured
    assert gbps[(0, 1)] == 800.0 and after[(0, 1)] == min(800.0 - 80.0, 800.0 - 50.0)
    assert after[(1, 2)] == gbps[(1, 2)]  # links not touching tor0 are untouched
    assert loaded["score_gbps"][0] < idle["score_gbps"][0]


_matrices = st.integers(1, 7).flatmap(lambda n: hnp.arrays(
    np.float64, (n, n), elements=st.sampled_from([0.0, 1.0, 10.0, 25.0, 40.0, 100.0])))


@given(_matrices)
def test_widest_path_invariants(m: np.ndarray) -> None:
    sym = np.minimum(m, m.T)
    beta = widest_paths(sym)
    assert np.array_equal(beta, beta.T)
    n = len(m)
    assert np.all(np.diag(beta) == np.inf)
    off = ~np.eye(n, dtype=bool)
    assert np.all(beta[off] >= sym[off])
    for w in range(n):  # beta(u,v) >= min(beta(u,w), beta(w,v))
        assert np.all(beta >= np.minimum(beta[:, w, None], beta[None, w, :]))
    directed = widest_paths(m)
    assert np.all(directed[off] >= m[off])
    assert np.array_equal(bandwidth_scores(sym, source=0), beta[0])
