"""Topology builders and the Lingjun reader."""

from __future__ import annotations

import pytest

from cruxd.errors import TopologyError
from cruxd.model.paths import PathFinder
from cruxd.model.topology import NodeKind, Topology, TopologyBuilder
from cruxd.topo import clos2, double_sided, lingjun, testbed96, trace_clos
from cruxd.topo.lingjun import read_rows
from tests.paths import FIXTURES


def test_testbed96_matches_the_seed() -> None:
    t = testbed96()
    assert len(t.hosts) == 12 and t.total_gpus() == 96
    tors = [n for n in t.switches if t.nodes[n].tier == 1]
    aggs = [n for n in t.switches if t.nodes[n].tier == 2]
    assert (len(tors), len(aggs)) == (6, 8)
    for h in t.hosts:
        assert t.nic_ports(h) == 4
        assert {t.links[i].capacity_gbps for i in t.uplinks(h)} == {100.0}
        assert len({t.links[i].dst for i in t.uplinks(h)}) == 1  # one ToR
    # every ToR has 8 x 100G down and 8 x 100G up: non-blocking
    for tor in tors:
        down = [i for i in t.out_links[tor] if t.is_host(t.links[i].dst)]
        up = [i for i in t.out_links[tor] if not t.is_host(t.links[i].dst)]
        assert len(down) == 8 and len(up) == 8


def test_trace_clos_shape() -> None:
    t = trace_clos()
    assert sum(1 for s in t.switches if t.nodes[s].tier == 1) == 173
    assert sum(1 for s in t.switches if t.nodes[s].tier == 2) == 16
    assert t.total_gpus() >= 2000
    up = t.links[t.out_links["tor0"][0]]
    host_bw = sum(t.links[i].capacity_gbps for i in t.in_links["tor0"] if t.is_host(t.links[i].src))
    assert up.capacity_gbps * 16 == pytest.approx(host_bw)  # 1:1


def test_double_sided_shape() -> None:
    t = double_sided()
    tiers = [t.nodes[s].tier for s in t.switches]
    assert (tiers.count(1), tiers.count(2), tiers.count(3)) == (6, 12, 32)
    h = t.hosts[0]
    assert t.nic_ports(h) == 8
    assert len({t.links[i].dst for i in t.uplinks(h)}) == 2  # dual-homed


def _between(t: Topology, a: str, b: str) -> list[int]:
    return [i for i, ln in enumerate(t.links) if (ln.src, ln.dst) == (a, b)]


@pytest.mark.parametrize(("tor_agg", "agg_core"), [(2, 1), (3, 2), (1, 1)])
def test_double_sided_parallel_cables_are_separate_links(tor_agg: int, agg_core: int) -> None:
    t = double_sided(hosts_per_pod=2, tor_agg_links=tor_agg, agg_core_links=agg_core)
    fat = double_sided(hosts_per_pod=2, tor_agg_links=1, agg_core_links=1)
    for (a, b), n in ((("tor0", "agg0"), tor_agg), (("agg0", "tor0"), tor_agg),
                      (("agg0", "core0"), agg_core), (("core0", "agg0"), agg_core)):
        cables = _between(t, a, b)
        assert len(cables) == n
        # together as fast as the one aggregated link of a single-cable build
        total = sum(t.links[i].capacity_gbps for i in cables)
        assert total == pytest.approx(fat.links[_between(fat, a, b)[0]].capacity_gbps)
    # ECMP and spraying see every cable: candidates within a pod (ToR 0 -> ToR 1) ...
    finder = PathFinder(t)
    within = {int(x) for x in finder.candidates("h0", "h1", 0, t.nic_ports("h1") - 1).ravel()}
    for agg in ("agg0", "agg1", "agg2", "agg3"):
        assert set(_between(t, "tor0", agg)) <= within
        assert set(_between(t, agg, "tor1")) <= within
    # ... and between pods, with a cap above the pair's path count
    src, dst = "h0", t.hosts[-1]
    n = PathFinder(t).count(src, dst, 0, 0)
    across = {int(x) for x in PathFinder(t, max_paths=n).candidates(src, dst, 0, 0).ravel()}
    assert set(_between(t, "tor0", "agg0")) | set(_between(t, "agg0", "core0")) <= across
    dst_tor = t.links[t.downlinks(dst)[0]].src
    assert set(_between(t, "agg8", dst_tor)) <= across


def test_double_sided_refuses_zero_cables() -> None:
    with pytest.raises(TopologyError, match="tor_agg_links must be > 0"):
        double_sided(hosts_per_pod=2, tor_agg_links=0)


def test_ports_are_numbered_per_host() -> None:
    t = clos2(2, 2, 1, nics_per_host=3)
    assert [t.links[i].port for i in t.uplinks("h0")] == [0, 1, 2]
    assert [t.links[i].port for i in t.downlinks("h0")] == [0, 1, 2]


@pytest.mark.parametrize("gbps", [0, -1, float("nan"), float("inf")])
def test_bad_capacity_is_refused(gbps: float) -> None:
    b = TopologyBuilder()
    b.switch("s", 1)
    b.host("h")
    with pytest.raises(TopologyError, match="capacity"):
        b.link("h", "s", gbps)


def test_builder_refuses_nonsense() -> None:
    b = TopologyBuilder()
    b.host("a")
    b.host("b")
    with pytest.raises(TopologyError, match="through switches"):
        b.link("a", "b", 10)
    with pytest.raises(TopologyError, match="duplicate"):
        b.host("a")
    with pytest.raises(TopologyError, match="unknown node"):
        b.link("a", "nowhere", 10)


def test_lingjun_bundled_copy() -> None:
    t = lingjun()
    assert len(t.hosts) == 847
    tiers = [t.nodes[s].tier for s in t.switches]
    assert (tiers.count(1), tiers.count(2), tiers.count(3)) == (119, 3, 1)
    assert all(t.nodes[h].kind is NodeKind.HOST for h in t.hosts)


def test_lingjun_bundled_copy_equals_shared_data() -> None:
    shared = read_rows(FIXTURES / "lingjun-2023-topo.csv")  # the dataset file, verbatim
    assert shared == read_rows()


def test_lingjun_rejects_bad_rows(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "t.csv"
    bad.write_text("ip,DSW,PSW\nx,G,P\n")
    with pytest.raises(TopologyError, match="expected columns"):
        read_rows(bad)
    bad.write_text("ip,DSW,PSW,ASW\nx,G,P,\n")
    with pytest.raises(TopologyError, match="line 2: empty field"):
        read_rows(bad)
    rows = [{"ip": "a", "DSW": "G1", "PSW": "P", "ASW": "S"},
            {"ip": "b", "DSW": "G2", "PSW": "P", "ASW": "S"}]
    with pytest.raises(TopologyError, match="two DSWs"):
        lingjun(rows)
