"""Arnold export (cruxd/hints/arnold.py) and its placement MIP (cruxd/hints/arnold_mip.py)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cruxd.errors import UsageError
from cruxd.hints.arnold import comm_matrix, export, hp_min_level, microbatches, volumes
from cruxd.hints.arnold_mip import ArnoldFitError, Placement, place, weighted_spread
from cruxd.hints.fabric_view import build_view
from cruxd.topo.builders import double_sided

SCHEMA = json.loads((Path(__file__).parents[1] / "docs/hints/arnold.schema.json").read_text())

# Table 1: (minipods, nodes in total), (DP, TP, PP); the scheduling unit is the PP group
TABLE1 = {"i": ((3, 18), (12, 4, 2)), "ii": ((5, 438), (24, 4, 8)),
          "iii": ((11, 1019), (46, 8, 8))}


def document(free: list[int], busy: list[int] | None = None,
             load: list[float] | None = None) -> dict[str, Any]:
    """A synthetic crux.arnold document: minipod k has free[k] free 8-GPU nodes
    and busy[k] nodes with GPUs in use."""
    busy = busy or [0] * len(free)
    load = load or [0.0] * len(free)
    minipods, nodes, h = [], {}, 0
    for k, (f, b) in enumerate(zip(free, busy, strict=True)):
        minipods.append({"id": f"pod{k}", "leaves": [f"tor{k}"], "aggs": [f"agg{k}"],
                         "nodes": f + b, "nodes_free": f, "gpus": 8 * (f + b),
                         "gpus_free": 8 * f + 4 * b, "c": f, "hp_load_gbps": 100 * load[k],
                         "hp_load": load[k]})
        for i in range(f + b):
            nodes[f"h{h}"] = {"minipod": f"pod{k}", "gpus": 8, "gpus_free": 8 if i < f else 4,
                              "free": i < f}
            h += 1
    doc = {"format": "crux.arnold", "version": 1, "name": "synthetic", "generated_unix_ms": 0,
           "levels": 1, "hp_min_level": 0, "minipods": minipods, "nodes": nodes}
    jsonschema.validate(doc, SCHEMA)
    return doc


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (k < total % parts) for k in range(parts)]


def check_valid(doc: dict[str, Any], p: Placement) -> None:
    """Every node of the job gets a distinct free host of the minipod the MIP chose,
    and no minipod gives more than its free nodes."""
    assert len(p.hosts) == p.matrix.nodes and len(set(p.hosts)) == p.matrix.nodes
    for host, mp in zip(p.hosts, p.minipod, strict=True):
        assert doc["nodes"][host]["free"] and doc["nodes"][host]["minipod"] == mp
    caps = {m["id"]: m["c"] for m in doc["minipods"]}
    assert all(n <= caps[mp] for mp, n in Counter(p.minipod).items())


# --- export -----------------------------------------------------------------------------

def test_export_double_sided_validates() -> None:
    topo = double_sided(hosts_per_pod=4)
    # pod0's first host half busy, one planned high-priority flow on tor0 -> agg0
    load = {("tor0", "agg0"): (50.0, 200.0)}
    view = build_view(topo, used={"h0": 4}, load=load, levels=2)
    doc = export(view)
    jsonschema.validate(doc, SCHEMA)
    assert [m["id"] for m in doc["minipods"]] == ["pod0", "pod1", "pod2"]
    pod0 = doc["minipods"][0]
    assert (pod0["nodes"], pod0["nodes_free"], pod0["c"]) == (4, 3, 3)
    assert pod0["gpus_free"] == 4 * 8 - 4
    assert pod0["hp_load_gbps"] == 200.0  # level 1 only: the top half of 2 levels
    assert 0 < pod0["hp_load"] < 1 and doc["minipods"][1]["hp_load"] == 0.0
    assert doc["nodes"]["h0"] == {"minipod": "pod0", "gpus": 8, "gpus_free": 4, "free": False}
    assert {n["minipod"] for n in doc["nodes"].values()} == {"pod0", "pod1", "pod2"}


def test_hp_levels() -> None:
    assert [hp_min_level(n) for n in (1, 2, 3, 4)] == [0, 1, 1, 2]


# --- communication matrix and volumes ---------------------------------------------------

def test_comm_matrix_fig12() -> None:
    """Fig. 12: 96 GPUs on 12 nodes, DP group size 6, PP group size 2 (so TP = 8)."""
    m = comm_matrix(6, 8, 2)
    assert (m.gpus, m.nodes, m.rows, m.cols) == (96, 12, 6, 2)
    assert m.dp_groups == ((0, 1, 2, 3, 4, 5), (6, 7, 8, 9, 10, 11))
    assert m.pp_groups[0] == (0, 6) and len(m.pp_groups) == 6


@pytest.mark.parametrize(("job", "rows", "cols"), [
    ((12, 4, 2), 6, 2), ((24, 4, 8), 12, 8), ((46, 8, 8), 46, 8)])
def test_comm_matrix_table1(job: tuple[int, int, int], rows: int, cols: int) -> None:
    m = comm_matrix(*job)
    assert (m.rows, m.cols) == (rows, cols)
    every = sorted(n for g in m.pp_groups for n in g)
    assert every == list(range(m.nodes)) == sorted(n for g in m.dp_groups for n in g)


def test_comm_matrix_rejects() -> None:
    for bad in ((6, 3, 2), (3, 4, 2), (0, 8, 1)):
        with pytest.raises(ValueError):
            comm_matrix(*bad)


def test_volumes_match_the_seed_7b_claim() -> None:
    """§4: a 7B GPT gives about 2 GB of DP and 30 MB of PP volume. The seed names no
    dimensions; ours: h 4096, 32 layers, s 2048, GPT-2's vocabulary, PP 8, mb 1, bf16."""
    v = volumes(h=4096, s=2048, vocab=50257, layers=32, pp=8, mb=1)
    assert 1.9e9 < v.dp_bytes < 2.1e9
    assert 25e6 < v.pp_bytes < 35e6
    assert v.pp_elems == 2 * 1 * 2048 * 4096
    assert microbatches(gb=1024, mb=1, dp=16) == 64


# --- MIP --------------------------------------------------------------------------------

@pytest.mark.parametrize("setting", sorted(TABLE1))
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 1.0])
def test_mip_table1(setting: str, alpha: float) -> None:
    (minipods, total), job = TABLE1[setting]
    doc = document(split(total, minipods))
    t0 = time.perf_counter()
    p = place(doc, *job, alpha=alpha, beta=1.0 - alpha)
    elapsed = time.perf_counter() - t0
    print(f"\nTable 1 ({setting}) alpha={alpha}: {p.matrix.nodes} nodes on {total}, "
          f"{len(p.minipods_used)} minipods, PP spread {p.max_pp_spread}, "
          f"DP spread {p.max_dp_spread}, optimal={p.optimal}, solve {elapsed * 1e3:.0f} ms")
    check_valid(doc, p)
    if alpha == 0.0:  # the seed: alpha = 0 puts each PP group into one minipod
        assert p.max_pp_spread == 1
    if alpha == 1.0:  # beta = 0: as few minipods as the free nodes allow
        fewest = next(k for k in range(1, minipods + 1)
                      if sum(sorted(split(total, minipods))[::-1][:k]) >= p.matrix.nodes)
        assert len(p.minipods_used) == fewest


def test_beta_zero_uses_fewer_minipods_than_alpha_zero() -> None:
    doc = document([7, 7, 7])  # a PP group of 2 fits a minipod 3 times, with 1 left
    by_pp = place(doc, 12, 4, 2, alpha=0.0, beta=1.0)
    by_count = place(doc, 12, 4, 2, alpha=1.0, beta=0.0)
    assert len(by_count.minipods_used) <= len(by_pp.minipods_used)
    assert len(by_count.minipods_used) == 2 and by_pp.max_pp_spread == 1


def test_ranks_are_continuous_per_minipod() -> None:
    doc = document([6, 6, 6])
    p = place(doc, 12, 4, 2, alpha=0.0, beta=1.0)
    for mp in set(p.minipod):  # hosts handed out in rank order: a minipod's ranks ascend
        hosts = [int(h[1:]) for h, m in zip(p.hosts, p.minipod, strict=True) if m == mp]
        assert hosts == sorted(hosts)
    # every DP group (a stage) of this job fits in one minipod when aligned
    assert p.max_dp_spread <= 2
    assert weighted_spread(p, 0.0, 1.0) == 0.0


def test_busy_nodes_and_loaded_minipods_avoided() -> None:
    doc = document([4, 12, 12], busy=[8, 0, 0], load=[0.0, 0.9, 0.1])
    p = place(doc, 12, 4, 2, alpha=0.5, beta=0.5)
    check_valid(doc, p)
    assert p.minipods_used == ("pod2",)  # fits whole; the loaded pod1 loses the tie


def test_cannot_fit() -> None:
    with pytest.raises(ArnoldFitError, match="needs 12 free"):
        place(document([3, 3, 3], busy=[3, 3, 3]), 12, 4, 2)
    with pytest.raises(UsageError, match=r"crux\.arnold"):
        place({"format": "other"}, 12, 4, 2)


def test_export_feeds_the_mip() -> None:
    view = build_view(double_sided(hosts_per_pod=4), used={"h0": 1})
    p = place(export(view), 4, 8, 2)  # 8 nodes: two minipods' worth
    assert "h0" not in p.hosts and p.max_pp_spread == 1


@settings(max_examples=40, deadline=None)
@given(free=st.lists(st.integers(0, 10), min_size=1, max_size=5),
       dp=st.sampled_from([2, 4, 6, 8]), pp=st.integers(1, 4),
       alpha=st.sampled_from([0.0, 0.3, 1.0]))
def test_never_exceeds_free_capacity(free: list[int], dp: int, pp: int, alpha: float) -> None:
    doc = document(free, busy=[1] * len(free))
    need = comm_matrix(dp, 4, pp).nodes
    if need > sum(free):
        with pytest.raises(ArnoldFitError):
            place(doc, dp, 4, pp, alpha=alpha, beta=1.0 - alpha)
        return
    check_valid(doc, place(doc, dp, 4, pp, alpha=alpha, beta=1.0 - alpha))
