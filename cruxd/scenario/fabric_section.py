"""The `topology` section of a scenario: a builder, nodes/links, a file, or Lingjun CSV.

    {"builder": "clos2", "tors": 4, "aggs": 2, "hosts_per_tor": 4}
    {"builder": "lingjun", "csv": "topo.csv", "nic_gbps": 400}      (csv optional)
    {"nodes": [{"id": "h0", "kind": "host", "gpus": 8}, ...],
     "links": [{"a": "h0", "b": "tor0", "gbps": 100, "count": 4}, ...]}
    {"file": "fabric.yaml"}       (a file holding any of the forms above)
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from cruxd.errors import ScenarioError, TopologyError
from cruxd.model.topology import Topology, TopologyBuilder
from cruxd.scenario.cursor import Cursor, load_document
from cruxd.topo.builders import BUILDERS
from cruxd.topo.lingjun import lingjun, read_rows


def parse_topology(cur: Cursor, base: Path, *, nested: bool = False) -> Topology:
    if not isinstance(cur.value, dict):
        raise cur.fail("expected an object: {\"builder\": ...}, {\"nodes\": ..., \"links\": ...} "
                       "or {\"file\": ...}")
    if cur.has("file"):
        if nested:
            raise cur["file"].fail("a topology file cannot point to another file")
        cur.fields({"file"})
        path = base / cur["file"].string()
        doc = load_document(path)
        try:
            return parse_topology(Cursor(doc), path.parent, nested=True)
        except ScenarioError as exc:
            raise exc.located(str(path)) from None
    if cur.has("builder"):
        return _builder(cur, base)
    if cur.has("nodes") or cur.has("links"):
        return _explicit(cur)
    raise cur.fail("expected one of the fields 'builder', 'nodes'/'links' or 'file'")


def _builder(cur: Cursor, base: Path) -> Topology:
    name = cur["builder"].string()
    if name == "lingjun":
        fn: Any = lingjun
    elif name in BUILDERS:
        fn = BUILDERS[name]
    else:
        raise cur["builder"].fail(f"unknown builder {name!r} (known: "
                                  f"{', '.join(sorted([*BUILDERS, 'lingjun']))})")
    params = {p.name: p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "rows"}
    if name == "trace_clos":  # takes overrides of clos2's parameters
        params = {p.name: p for p in inspect.signature(BUILDERS["clos2"]).parameters.values()
                  if p.name != "name"}
        required: set[str] = set()
    else:
        params.pop("name", None)
        required = {k for k, p in params.items() if p.default is inspect.Parameter.empty}
    extra = {"csv"} if name == "lingjun" else set()
    cur.fields({"builder", *required}, set(params) | extra)
    kwargs: dict[str, Any] = {}
    for key, p in params.items():
        if not cur.has(key):
            continue
        sub = cur[key]
        integer = isinstance(p.default, int) or key in _INT_PARAMS
        kwargs[key] = sub.integer(lo=1) if integer else sub.number(positive=True)
    try:
        if name == "lingjun":
            csv = cur.get("csv")
            rows = read_rows(base / csv.string()) if csv is not None else None
            return lingjun(rows, **kwargs)
        return fn(**kwargs)  # type: ignore[no-any-return]
    except TopologyError as exc:
        raise cur.fail(str(exc)) from None


_INT_PARAMS = {"tors", "aggs", "hosts_per_tor", "pods", "tors_per_pod", "aggs_per_pod",
               "cores", "hosts_per_pod", "links_per_host", "gpus_per_host", "nics_per_host",
               "links_per_agg", "agg_links_per_tor", "tor_uplinks", "psw_uplinks",
               "tor_agg_links", "agg_core_links"}


def _explicit(cur: Cursor) -> Topology:
    cur.fields({"nodes", "links"}, {"name"})
    b = TopologyBuilder(cur["name"].string() if cur.get("name") else "topology")
    ids: set[str] = set()
    for node in cur["nodes"].items():
        node.fields({"id", "kind"}, {"tier", "gpus"})
        kind = node["kind"].string()
        try:
            if kind == "host":
                if node.has("tier"):
                    raise node["tier"].fail("hosts are tier 0; 'tier' is for switches")
                b.host(node["id"].string(), node["gpus"].integer(lo=0) if node.get("gpus") else 8)
            elif kind == "switch":
                if node.has("gpus"):
                    raise node["gpus"].fail("switches have no GPUs")
                b.switch(node["id"].string(), node["tier"].integer(lo=1) if node.get("tier") else 1)
            else:
                raise node["kind"].fail(f"expected 'host' or 'switch', got {kind!r}")
        except TopologyError as exc:
            raise node["id"].fail(str(exc)) from None
        ids.add(node["id"].string())
    for link in cur["links"].items():
        link.fields({"a", "b", "gbps"}, {"latency_us", "count", "bidirectional"})
        a, b_ = link["a"].string(), link["b"].string()
        for end, node_id in (("a", a), ("b", b_)):
            if node_id not in ids:
                raise link[end].fail(f"unknown node {node_id!r}")
        if a == b_:
            raise link["b"].fail("a link cannot loop on one node")
        gbps = link["gbps"].number(positive=True)
        latency = link["latency_us"].number(lo=0) if link.get("latency_us") else 1.0
        count = link["count"].integer(lo=1) if link.get("count") else 1
        both = link["bidirectional"].boolean() if link.get("bidirectional") is not None else True
        try:
            b.link(a, b_, gbps, latency, both=both, count=count)
        except TopologyError as exc:
            raise link.fail(str(exc)) from None
    try:
        return b.build()
    except TopologyError as exc:
        raise cur.fail(str(exc)) from None
