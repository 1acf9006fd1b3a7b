"""Volcano HyperNodes, node labels and Slurm topology.conf against the fabric they describe."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cruxd.hints import slurm, volcano
from cruxd.hints.fabric_view import FabricView, build_view
from cruxd.model.topology import TopologyBuilder
from cruxd.topo.builders import clos2, double_sided, testbed96

DOCS = Path(__file__).resolve().parent.parent / "docs" / "hints"
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

VIEWS = {
    "double_sided": lambda: build_view(double_sided(hosts_per_pod=4),
                                       generated_unix_ms=1_700_000_000_123),
    "clos2": lambda: build_view(clos2(tors=3, aggs=2, hosts_per_tor=2)),
    "testbed96": lambda: build_view(testbed96()),
}


@pytest.fixture(params=sorted(VIEWS))
def view(request: pytest.FixtureRequest) -> FabricView:
    return VIEWS[request.param]()


def _schema(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((DOCS / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def parse_topology_conf(text: str) -> dict[str, dict[str, list[str]]]:
    """A strict reading of the tree plugin's grammar: one `SwitchName=` line per switch
    with `Switches=`, `Nodes=` and `LinkSpeed=`; checks the result is one tree."""
    switches: dict[str, dict[str, list[str]]] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        pairs = [tok.split("=", 1) for tok in line.split()]
        assert all(len(p) == 2 and p[1] for p in pairs), raw
        keys = [k for k, _ in pairs]
        assert keys[0] == "SwitchName" and len(set(keys)) == len(keys), raw
        assert set(keys) <= {"SwitchName", "Switches", "Nodes", "LinkSpeed"}, raw
        fields = dict(pairs)
        name = fields["SwitchName"]
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name), raw
        assert name not in switches, f"switch {name} defined twice"
        assert ("Nodes" in fields) != ("Switches" in fields), raw  # leaf xor inner switch
        if "LinkSpeed" in fields:
            assert fields["LinkSpeed"].isdigit(), raw
        switches[name] = {"nodes": slurm.expand(fields.get("Nodes", "")) if "Nodes" in fields
                          else [],
                          "switches": slurm.expand(fields["Switches"]) if "Switches" in fields
                          else []}
    parent: dict[str, str] = {}
    for name, sw in switches.items():
        for child in sw["switches"]:
            assert child in switches, f"{name} references undefined switch {child}"
            assert child not in parent, f"switch {child} has two parents"
            parent[child] = name
    roots = [s for s in switches if s not in parent]
    assert len(roots) == 1, f"roots: {roots}"
    seen: dict[str, str] = {}
    for name, sw in switches.items():
        for node in sw["nodes"]:
            assert node not in seen, f"node {node} under {seen.get(node)} and {name}"
            seen[node] = name
    return switches


def _hosted_leaves(view: FabricView) -> dict[str, tuple[str, ...]]:
    return {leaf: hosts for leaf, hosts in view.leaf_hosts().items() if hosts}


def _member_names(doc: dict[str, Any]) -> list[str]:
    return [m["selector"]["exactMatch"]["name"] for m in doc["spec"]["members"]]


def test_hypernodes_validate_and_reproduce_tiers(view: FabricView) -> None:
    docs = volcano.hypernodes(view)
    validator = _schema("volcano-hypernode.schema.json")
    for doc in docs:
        validator.validate(doc)
    names = [d["metadata"]["name"] for d in docs]
    assert len(set(names)) == len(names)
    by_tier: dict[int, list[dict[str, Any]]] = {}
    for d in docs:
        by_tier.setdefault(d["spec"]["tier"], []).append(d)
    tier1 = {d["metadata"]["name"]: _member_names(d) for d in by_tier[1]}
    assert all(m["type"] == "Node" for d in by_tier[1] for m in d["spec"]["members"])
    assert tier1 == {leaf: list(hosts) for leaf, hosts in _hosted_leaves(view).items()}
    tier2 = {d["metadata"]["name"]: _member_names(d) for d in by_tier[2]}
    assert tier2 == {pod: [lf for lf in leaves if lf in tier1]
                     for pod, leaves in view.pods().items()}
    assert all(m["type"] == "HyperNode" for d in by_tier[2] for m in d["spec"]["members"])
    if view.cores or len(view.pods()) > 1:
        assert len(by_tier[3]) == 1
        assert _member_names(by_tier[3][0]) == list(tier2)
    else:
        assert 3 not in by_tier
    # every host is a member of exactly one leaf HyperNode
    members = [h for hosts in tier1.values() for h in hosts]
    assert sorted(members) == sorted(view.hosts)
    assert list(yaml.safe_load_all(volcano.to_yaml(docs))) == docs
    assert json.loads(volcano.to_json(docs))["items"] == docs


def test_node_labels(view: FabricView) -> None:
    labels = volcano.node_labels(view)
    _schema("node-labels.schema.json").validate(labels)
    hn = {d["metadata"]["name"] for d in volcano.hypernodes(view)}
    assert set(labels) == set(view.hosts)
    for host, lab in labels.items():
        assert all(len(v) <= 63 and LABEL_VALUE.match(v) for v in lab.values())
        assert lab["crux.io/leaf"] == view.hosts[host].leaf and lab["crux.io/leaf"] in hn
        assert lab["crux.io/pod"] == view.hosts[host].pod and lab["crux.io/pod"] in hn
        assert lab["crux.io/leaf-count"] == str(len(view.hosts[host].leaves))


def test_topology_conf_grammar_and_tree(view: FabricView) -> None:
    text = slurm.topology_conf(view)
    assert text.startswith("# Slurm topology.conf") and "schema version 1" in text
    sw = parse_topology_conf(text)
    leaves = _hosted_leaves(view)
    assert {s: sorted(v["nodes"]) for s, v in sw.items() if v["nodes"]} == \
        {leaf: sorted(hosts) for leaf, hosts in leaves.items()}
    for pod, pod_leaves in view.pods().items():
        assert sw[pod]["switches"] == [lf for lf in pod_leaves if lf in leaves]
    top = [s for s, v in sw.items() if set(v["switches"]) == set(view.pods())]
    assert len(top) == (1 if view.cores or len(view.pods()) > 1 else 0)


def test_dual_homed_comment_and_first_leaf() -> None:
    view = VIEWS["double_sided"]()
    text = slurm.topology_conf(view)
    assert "12 dual-homed hosts are listed under their first leaf only" in text
    assert "left out: tor[1,3,5]" in text
    assert "generated: 2023-11-14T22:13:20.123000Z" in text
    assert "SwitchName=tor0 Nodes=h[0-3]" in text
    assert "SwitchName=double-sided Switches=pod[0-2]" in text


def test_names_are_sanitized_unique_and_deterministic() -> None:
    b = TopologyBuilder("My Fabric!")
    agg = b.switch("Agg_0", tier=2)
    for i, raw in enumerate(["ToR.A", "tor-a", "tor[a]", "x" * 80]):
        tor = b.switch(raw, tier=1)
        b.link(tor, agg, 100.0)
        b.link(b.host(f"node-{i}", 8), tor, 100.0)
    view = build_view(b.build())
    docs = volcano.hypernodes(view)
    _ = [_schema("volcano-hypernode.schema.json").validate(d) for d in docs]
    names = [d["metadata"]["name"] for d in docs]
    assert len(set(names)) == len(names)
    assert "tor-a" in names  # already valid: keeps its name
    assert names == [d["metadata"]["name"] for d in volcano.hypernodes(view)]
    _schema("node-labels.schema.json").validate(volcano.node_labels(view))
    parse_topology_conf(slurm.topology_conf(view))
    assert volcano.dns_label("!!!") == "" and volcano.is_dns_label(volcano.dns_label("A_b.C"))


@pytest.mark.parametrize(("hosts", "expr"), [
    (["h0", "h1", "h2", "h3"], "h[0-3]"),
    (["h0", "h1", "h2", "h5", "h7", "h8"], "h[0-2,5,7-8]"),
    (["h9", "h10", "h11"], "h[9-11]"),
    (["n01", "n02", "n10"], "n10,n[01-02]"),
    (["n08", "n09", "n10"], "n10,n[08-09]"),
    (["n1", "n01"], "n1,n01"),
    (["login", "h3"], "login,h3"),
    (["a1b2", "a1b3", "c"], "c,a1b[2-3]"),
])
def test_compress_examples(hosts: list[str], expr: str) -> None:
    assert slurm.compress(hosts) == expr
    assert sorted(slurm.expand(expr)) == sorted(hosts)


names = st.builds(lambda p, n, pad: f"{p}{n:0{pad}d}" if pad else f"{p}{n}",
                  st.sampled_from(["h", "gpu-", "r1n", "node"]),
                  st.integers(0, 200), st.sampled_from([0, 0, 2, 3])) | \
    st.sampled_from(["login", "head", "a-b"])


@given(st.lists(names, max_size=40))
def test_compress_round_trips(hosts: list[str]) -> None:
    expr = slurm.compress(hosts)
    assert sorted(slurm.expand(expr)) == sorted(set(hosts))


def test_expand_rejects_garbage() -> None:
    for bad in ["h[1-", "h[3-1]", "h[a-b]", "h]", "a,,b"]:
        with pytest.raises(ValueError):
            slurm.expand(bad)
