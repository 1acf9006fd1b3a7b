"""crux's HyperNode export against Volcano's own CRD (vendored in docs/hints/vendor/).

What the API server would check on `kubectl apply`: the CRD's openAPIV3Schema (with strict
field validation, kubectl's default, so unknown fields are errors), its two CEL rules on
member selectors, and the ObjectMeta rules Kubernetes applies to every object (the name a
DNS-1123 subdomain, label and annotation keys qualified names, label values).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import warnings
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from cruxd.errors import UsageError
from cruxd.hints import volcano
from cruxd.hints.fabric_view import FabricView, build_view
from cruxd.hints.formats import render
from cruxd.model.topology import Topology, TopologyBuilder
from cruxd.testing import BIN
from cruxd.topo.builders import clos2, double_sided, testbed96

CRD = Path(__file__).resolve().parent.parent / "docs/hints/vendor/volcano-hypernodes-crd.yaml"
SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
SELECTORS = ("exactMatch", "regexMatch", "labelMatch")


def _crd() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CRD.read_text())
    return doc


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Kubernetes prunes or (strict field validation) refuses fields a structural schema
    does not name; JSON Schema allows them unless told. `metadata` is left open: it is
    ObjectMeta, checked by `_object_meta_errors`."""
    out = copy.deepcopy(schema)

    def walk(node: dict[str, Any], path: str) -> None:
        props = node.get("properties")
        if props is not None:
            node.setdefault("additionalProperties", False)
            for name, sub in props.items():
                if f"{path}.{name}" != ".metadata":
                    walk(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], path + "[]")
    walk(out, "")
    return out


def _validator() -> jsonschema.Draft202012Validator:
    (version,) = [v for v in _crd()["spec"]["versions"] if v["name"] == "v1alpha1"]
    assert version["served"]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _qualified_name_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and not (len(prefix) <= 253 and SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= 63 and bool(NAME_PART.match(name))


def _object_meta_errors(meta: dict[str, Any]) -> list[str]:
    name = meta.get("name", "")
    errors = [] if len(name) <= 253 and SUBDOMAIN.match(name) else [f"name {name!r}"]
    for key, value in meta.get("labels", {}).items():
        if not _qualified_name_ok(key) or len(value) > 63 or not LABEL_VALUE.match(value):
            errors.append(f"label {key}={value!r}")
    annotations = meta.get("annotations", {})
    errors += [f"annotation key {k!r}" for k in annotations if not _qualified_name_ok(k)]
    if sum(len(k) + len(v) for k, v in annotations.items()) > 256 * 1024:
        errors.append("annotations over 256 KiB")
    return errors


def _cel_errors(doc: dict[str, Any]) -> list[str]:
    """The CRD's x-kubernetes-validations on `selector`, which JSON Schema cannot run."""
    return [f"members[{i}] has {n} selector kinds"
            for i, m in enumerate(doc.get("spec", {}).get("members", []))
            if (n := sum(k in m.get("selector", {}) for k in SELECTORS)) != 1]


def crd_errors(doc: dict[str, Any]) -> list[str]:
    crd = _crd()["spec"]
    errors = [e.message for e in _validator().iter_errors(doc)]
    if doc.get("apiVersion") != f"{crd['group']}/v1alpha1":
        errors.append(f"apiVersion {doc.get('apiVersion')!r}")
    if doc.get("kind") != crd["names"]["kind"]:
        errors.append(f"kind {doc.get('kind')!r}")
    return errors + _object_meta_errors(doc.get("metadata", {})) + _cel_errors(doc)


def _fabric(hosts: list[str], tors: tuple[str, ...] = ("ToR_A", "ToR_B")) -> Topology:
    b = TopologyBuilder("GPU_Fabric")
    agg = b.switch("Agg_0", tier=2)
    switches = [b.switch(t, tier=1) for t in tors]
    for t in switches:
        b.link(t, agg, 100.0)
    for i, h in enumerate(hosts):
        b.link(b.host(h, 8), switches[i % len(switches)], 100.0)
    return b.build()


VIEWS = {
    "double_sided": lambda: build_view(double_sided(hosts_per_pod=4)),
    "clos2": lambda: build_view(clos2(tors=3, aggs=2, hosts_per_tor=2)),
    "testbed96": lambda: build_view(testbed96()),
    "odd_names": lambda: build_view(_fabric(["GPU_Node01", "GPU_Node02", "node-3.Rack1",
                                             "gpu-node04"])),
}


@pytest.fixture(params=sorted(VIEWS))
def view(request: pytest.FixtureRequest) -> FabricView:
    return VIEWS[request.param]()


def test_the_vendored_crd_is_volcanos_hypernode() -> None:
    crd = _crd()
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == "hypernodes.topology.volcano.sh"
    assert crd["spec"]["scope"] == "Cluster"
    rules = json.dumps(crd)
    assert "has(self.exactMatch) || has(self.regexMatch) || has(self.labelMatch)" in rules
    assert "Only one of ExactMatch, RegexMatch, or LabelMatch" in rules  # what _cel_errors runs


def test_the_check_refuses_what_the_api_server_would() -> None:
    good = {"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
            "metadata": {"name": "tor-a"},
            "spec": {"tier": 1, "members": [
                {"type": "Node", "selector": {"exactMatch": {"name": "gpu-node01"}}}]}}
    assert crd_errors(good) == []
    bad_member = copy.deepcopy(good)
    bad_member["spec"]["members"][0]["selector"]["exactMatch"]["name"] = "GPU_Node01"
    assert crd_errors(bad_member)
    bad_name = copy.deepcopy(good)
    bad_name["metadata"]["name"] = "ToR_A"
    assert crd_errors(bad_name) == ["name 'ToR_A'"]
    unknown = copy.deepcopy(good)
    unknown["spec"]["nodes"] = ["x"]
    assert crd_errors(unknown)
    two = copy.deepcopy(good)
    two["spec"]["members"][0]["selector"]["regexMatch"] = {"pattern": ".*"}
    assert crd_errors(two) == ["members[0] has 2 selector kinds"]
    assert crd_errors({**good, "spec": {"tier": 1, "members": []}})


def test_every_export_is_accepted_by_volcanos_crd(view: FabricView) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", volcano.NodeNameWarning)
        docs = volcano.hypernodes(view)
        labels = volcano.node_labels(view)
    assert docs
    for doc in docs:
        assert crd_errors(doc) == [], doc["metadata"]["name"]
    # the node labels address the same node names the HyperNodes select
    members = {m["selector"]["exactMatch"]["name"] for d in docs if d["spec"]["tier"] == 1
               for m in d["spec"]["members"]}
    assert members == set(labels)
    assert all(len(n) <= 253 and SUBDOMAIN.match(n) for n in labels)


def test_invalid_host_names_are_sanitized_with_a_warning() -> None:
    view = VIEWS["odd_names"]()
    with pytest.warns(volcano.NodeNameWarning, match="'GPU_Node01' -> 'gpu-node01'") as got:
        docs = volcano.hypernodes(view)
    assert "'node-3.Rack1' -> 'node-3.rack1'" in str(got[0].message)
    assert "gpu-node04'" not in str(got[0].message), "a valid name is not renamed"
    nodes = sorted(m["selector"]["exactMatch"]["name"] for d in docs if d["spec"]["tier"] == 1
                   for m in d["spec"]["members"])
    assert nodes == ["gpu-node01", "gpu-node02", "gpu-node04", "node-3.rack1"]
    assert {d["metadata"]["name"] for d in docs} == {"tor-a", "tor-b", "pod0"}
    with pytest.warns(volcano.NodeNameWarning):
        assert volcano.node_names(view)["GPU_Node01"] == "gpu-node01"


@pytest.mark.parametrize("hosts", [["GPU_Node01", "gpu-node01"], ["A..B", "a.b"], ["___"]])
def test_names_that_cannot_be_told_apart_are_refused(hosts: list[str]) -> None:
    view = build_view(_fabric(hosts))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", volcano.NodeNameWarning)
        for export in (volcano.hypernodes, volcano.node_labels):
            with pytest.raises(UsageError, match="Kubernetes node"):
                export(view)
        with pytest.raises(UsageError):
            render("volcano", view)
    assert "topology.conf" in render("slurm", view).text  # Slurm takes the names as they are


def _scenario(tmp_path: Path, hosts: list[str]) -> Path:
    nodes = [{"id": h, "kind": "host", "gpus": 8} for h in hosts]
    nodes.append({"id": "ToR_A", "kind": "switch", "tier": 1})
    doc = {"topology": {"name": "lab", "nodes": nodes,
                        "links": [{"a": h, "b": "ToR_A", "gbps": 100} for h in hosts]},
           "jobs": []}
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(doc))
    return path


def test_cruxctl_exports_sanitized_names_and_refuses_a_collision(tmp_path: Path) -> None:
    cmd = [str(BIN / "cruxctl"), "hints", "--format", "volcano", "--scenario"]
    ok = subprocess.run([*cmd, str(_scenario(tmp_path, ["GPU_Node01", "h2"]))],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "'GPU_Node01' -> 'gpu-node01'" in ok.stderr
    docs = list(yaml.safe_load_all(ok.stdout))
    assert docs and all(crd_errors(d) == [] for d in docs)
    clash = subprocess.run([*cmd, str(_scenario(tmp_path, ["GPU_Node01", "gpu-node01"]))],
                           capture_output=True, text=True, timeout=120)
    assert clash.returncode == 2, clash.stderr
    assert "'GPU_Node01' and 'gpu-node01'" in clash.stderr or \
        "'gpu-node01' and 'GPU_Node01'" in clash.stderr
