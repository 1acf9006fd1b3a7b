"""Scenario validation: every bad field is one ScenarioError naming the file and its JSON path."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from cruxd.errors import ScenarioError
from cruxd.scenario import load_scenario
from cruxd.scheduler import plan

Doc = dict[str, Any]
Mutation = Callable[[Doc], None]

JOBS = [
    {"id": "j0", "hosts": ["h0", "h2"], "gpus_per_host": 4, "compute_s": 0.5, "bytes": 1e9},
    {"id": "j1", "hosts": ["h1", "h3"], "gpus_per_host": 4, "compute_s": 0.3, "bytes": 5e8},
]
CLOS: Doc = {"version": 1, "levels": 2, "jobs": JOBS,
             "topology": {"builder": "clos2", "tors": 2, "aggs": 2, "hosts_per_tor": 2}}
EXPLICIT: Doc = {"version": 1, "jobs": JOBS, "topology": {
    "nodes": [*({"id": f"h{i}", "kind": "host", "gpus": 8} for i in range(4)),
              {"id": "tor0", "kind": "switch", "tier": 1},
              {"id": "tor1", "kind": "switch", "tier": 1},
              {"id": "spine", "kind": "switch", "tier": 2}],
    "links": [{"a": "h0", "b": "tor0", "gbps": 100, "count": 2},
              {"a": "h1", "b": "tor0", "gbps": 100, "count": 2},
              {"a": "h2", "b": "tor1", "gbps": 100, "count": 2},
              {"a": "h3", "b": "tor1", "gbps": 100, "count": 2},
              {"a": "tor0", "b": "spine", "gbps": 200},
              {"a": "tor1", "b": "spine", "gbps": 200}]}}
BASES = {"clos": CLOS, "explicit": EXPLICIT}
# h0 -> h2 pinned to the path through agg1 (clos2 numbers hosts h0, h1 under tor0)
PROBED = {"src": "h0", "dst": "h2", "paths": [{"hops": ["tor0", "agg1", "tor1"],
                                                "sports": [0xC123, 0xC124]}]}


def put(*keys: str | int, value: Any) -> Mutation:
    def apply(doc: Doc) -> None:
        node: Any = doc
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return apply


def drop(*keys: str | int) -> Mutation:
    def apply(doc: Doc) -> None:
        node: Any = doc
        for k in keys[:-1]:
            node = node[k]
        del node[keys[-1]]
    return apply


def both(*mutations: Mutation) -> Mutation:
    def apply(doc: Doc) -> None:
        for m in mutations:
            m(doc)
    return apply


def flows(*specs: Doc) -> Mutation:
    """Turn job j0 into an explicit-flows job."""
    return both(put("jobs", 0, "pattern", value="flows"), drop("jobs", 0, "bytes"),
                put("jobs", 0, "flows", value=list(specs)))


def table(**changes: Any) -> Mutation:
    return put("path_table", value=[{**copy.deepcopy(PROBED), **changes}])


def build(base: str, mutation: Mutation | None = None) -> Doc:
    doc = copy.deepcopy(BASES[base])
    if mutation is not None:
        mutation(doc)
    return doc


def write(tmp_path: Path, doc: Any, name: str = "scenario.json") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc) if name.endswith(".yaml") else json.dumps(doc))
    return path


def expect_error(path: Path, json_path: str, phrase: str, *, where: Path | None = None) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    err, where = info.value, where or path
    assert (err.where, err.path) == (str(where), json_path)
    assert phrase in err.reason
    assert str(err) == f"{where}: {json_path}: {err.reason}" and "\n" not in str(err)



CASES = [
    ("clos", put("colour", value="red"), "$.colour", "unknown field 'colour'"),
    ("clos", put("jobs", 0, "prio", value=3), "$.jobs[0].prio", "unknown field 'prio'"),
    ("clos", drop("jobs"), "$", "missing field 'jobs'"),
    ("clos", drop("topology"), "$", "missing field 'topology'"),
    ("clos", drop("jobs", 0, "compute_s"), "$.jobs[0]", "missing field 'compute_s'"),
    ("clos", put("jobs", 0, "hosts", 1, value="h9"), "$.jobs[0].hosts[1]", "unknown host"),
    ("clos", both(drop("jobs", 0, "gpus_per_host"),
                  put("jobs", 0, "hosts", value={"h0": 4, "h9": 4})),
     "$.jobs[0].hosts.h9", "'h9' is an unknown host"),
    ("clos", put("jobs", 0, "hosts", 1, value="tor1"), "$.jobs[0].hosts[1]", "is a switch"),
    ("clos", put("jobs", 0, "hosts", value=["h0", "h0"]), "$.jobs[0].hosts[1]", "listed twice"),
    ("clos", put("jobs", 0, "hosts", value=["h0"]), "$.jobs[0].hosts", "one host"),
    ("clos", put("jobs", 0, "hosts", value=[]), "$.jobs[0].hosts", "at least one host"),
    ("clos", put("jobs", 0, "gpus_per_host", value=16), "$.jobs[0].hosts[0]",
     "has 8 GPUs, job asks for 16"),
    ("clos", both(put("jobs", 0, "hosts", value={"h0": 4, "h2": 4}),
                  put("jobs", 0, "gpus_per_host", value=4)),
     "$.jobs[0].gpus_per_host", "either per host"),
    pytest.param("clos", both(put("jobs", 1, "hosts", value=["h3", "h0"]),
                              put("jobs", 1, "gpus_per_host", value=8)),
                 "$.jobs[1].hosts[1]", "jobs ask for 12", id="gpus-oversubscribed-across-jobs"),
    ("clos", put("jobs", 0, "overlap", value=1.5), "$.jobs[0].overlap", "must be <= 1.0"),
    ("clos", put("jobs", 0, "compute_s", value=0), "$.jobs[0].compute_s", "must be > 0"),
    ("clos", put("jobs", 0, "compute_s", value=-1), "$.jobs[0].compute_s", "must be > 0"),
    ("clos", put("jobs", 0, "compute_s", value="1s"), "$.jobs[0].compute_s",
     "expected a number"),
    ("clos", drop("jobs", 0, "bytes"), "$.jobs[0]", "missing field 'bytes'"),
    ("clos", put("jobs", 0, "pattern", value="alltoall"), "$.jobs[0].pattern",
     "unknown pattern 'alltoall'"),
    ("clos", flows({"src": "h1", "dst": "h2", "bytes": 1e9}), "$.jobs[0].flows[0].src",
     "not one of the job's hosts"),
    ("clos", flows({"src": "h0", "dst": "h0", "bytes": 1e9}), "$.jobs[0].flows[0].dst",
     "must leave its host"),
    ("clos", flows({"src": "h0", "dst": "h2", "bytes": 1e9, "src_port": 4}),
     "$.jobs[0].flows[0].src_port", "must be <= 3"),
    ("clos", put("jobs", 1, "id", value="j0"), "$.jobs[1].id", "duplicate job id 'j0'"),
    ("clos", put("levels", value=0), "$.levels", "must be >= 1"),
    ("clos", put("levels", value=6), "$.levels", "6 levels do not fit"),
    ("clos", put("dscp", value=[8, 16, 24]), "$.dscp", "one DSCP value per level"),
    ("clos", put("dscp", value=[8, 64]), "$.dscp[1]", "must be <= 63"),
    ("clos", put("dscp", value=[8, 8]), "$.dscp", "distinct"),
    ("clos", put("reference_job", value="j7"), "$.reference_job", "no job has id 'j7'"),
    ("clos", put("version", value=2), "$.version", "version 1"),
    ("clos", put("topology", "builder", value="torus"), "$.topology.builder",
     "unknown builder 'torus'"),
    ("clos", put("topology", "spines", value=2), "$.topology.spines",
     "unknown field 'spines'"),
    ("clos", put("topology", "tors", value=0), "$.topology.tors", "must be >= 1"),
    ("clos", put("topology", "nic_gbps", value=-100), "$.topology.nic_gbps", "must be > 0"),
    pytest.param("clos", put("topology", "tors", value=None), "$.topology.tors",
                 "expected an integer", id="builder-required-parameter-null"),
    ("clos", table(paths=[{"hops": ["tor0", "agg1", "tor1"], "sports": [0xBFFF]}]),
     "$.path_table[0].paths[0].sports[0]", "must be >= 49152"),
    ("clos", table(paths=[{"hops": ["tor0", "tor1"], "sports": [0xC000]}]),
     "$.path_table[0].paths[0].hops[1]", "no link tor0 -> tor1"),
    ("clos", table(src="h9"), "$.path_table[0].src", "'h9' is not a host"),
    ("explicit", put("topology", "links", 0, "gbps", value=0), "$.topology.links[0].gbps",
     "must be > 0"),
    ("explicit", put("topology", "links", 4, "gbps", value=-200), "$.topology.links[4].gbps",
     "must be > 0"),
    ("explicit", put("topology", "links", 0, "gbps", value="100"), "$.topology.links[0].gbps",
     "expected a number, got the string '100'"),
    pytest.param("explicit", put("topology", "links", 4, "b", value="core9"),
                 "$.topology.links[4].b", "unknown node 'core9'", id="link-to-unknown-node"),
    ("explicit", put("topology", "nodes", 4, "kind", value="router"),
     "$.topology.nodes[4].kind", "expected 'host' or 'switch'"),
    ("explicit", put("topology", "nodes", 5, "id", value="tor0"), "$.topology.nodes[5].id",
     "duplicate node 'tor0'"),
    ("explicit", put("topology", "nodes", 6, "gpus", value=8), "$.topology.nodes[6].gpus",
     "switches have no GPUs"),
]


@pytest.mark.parametrize(("base", "mutation", "json_path", "phrase"), [
    c if type(c) is not tuple else pytest.param(*c, id=f"{c[0]}:{c[2]}:{c[3][:24]}")
    for c in CASES])
def test_bad_field_names_its_path(tmp_path: Path, base: str, mutation: Mutation,
                                  json_path: str, phrase: str) -> None:
    expect_error(write(tmp_path, build(base, mutation)), json_path, phrase)


def _with_gbps(literal: str) -> str:
    return json.dumps(build("explicit", put("topology", "links", 0, "gbps", value="@X@"))
                      ).replace('"@X@"', literal)


YAML_NAN = yaml.safe_dump(build("explicit")).replace("gbps: 100", "gbps: .nan", 1)
YAML_INF = yaml.safe_dump(build("clos", put("topology", "nic_gbps", value="@X@"))
                          ).replace("'@X@'", ".inf")


@pytest.mark.parametrize(("name", "text", "json_path", "phrase"), [
    pytest.param("s.json", _with_gbps("NaN"), "$", "NaN is not valid JSON", id="json-NaN"),
    pytest.param("s.json", _with_gbps("Infinity"), "$", "Infinity is not valid JSON",
                 id="json-Infinity"),
    pytest.param("s.json", _with_gbps("-Infinity"), "$", "Infinity is not valid JSON",
                 id="json-minus-Infinity"),
    pytest.param("s.json", _with_gbps("1e400"), "$.topology.links[0].gbps",
                 "expected a finite number", id="json-overflow-to-inf"),
    pytest.param("s.json", '{\n  "version": 1,\n  "jobs": [,\n}', "$",
                 "invalid JSON at line 3 column", id="json-syntax"),
    pytest.param("s.yaml", "jobs: [\n  - {id: j0\n", "$", "invalid YAML", id="yaml-syntax"),
    pytest.param("s.yaml", "jobs: [\n  - {id: j0\n", "$", "line 2", id="yaml-syntax-location"),
    pytest.param("s.yaml", YAML_NAN, "$.topology.links[0].gbps", "expected a finite number",
                 id="yaml-nan-capacity"),
    pytest.param("s.yaml", YAML_INF, "$.topology.nic_gbps", "expected a finite number",
                 id="yaml-inf-builder-capacity"),
    pytest.param("s.yaml", "", "$", "expected an object, got null", id="yaml-empty"),
    pytest.param("s.json", "[]", "$", "expected an object, got a list", id="json-list"),
])
def test_unparsable_file_names_the_file(tmp_path: Path, name: str, text: str, json_path: str,
                                        phrase: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    expect_error(path, json_path, phrase)


def test_missing_topology_file_is_named(tmp_path: Path) -> None:
    scenario = write(tmp_path, build("clos", put("topology", value={"file": "fabric.yaml"})))
    expect_error(scenario, "$", "cannot read", where=tmp_path / "fabric.yaml")


def test_bad_field_in_topology_file_names_that_file(tmp_path: Path) -> None:
    fabric = build("explicit", put("topology", "links", 1, "gbps", value=0))["topology"]
    topo = write(tmp_path, fabric, "fabric.yaml")
    scenario = write(tmp_path, build("clos", put("topology", value={"file": "fabric.yaml"})))
    expect_error(scenario, "$.links[1].gbps", "must be > 0", where=topo)


def test_topology_file_loads_relative_to_the_scenario(tmp_path: Path) -> None:
    (tmp_path / "fabrics").mkdir()
    write(tmp_path / "fabrics", build("explicit")["topology"], "f.yaml")
    sc = load_scenario(write(tmp_path, build("clos", put("topology",
                                                         value={"file": "fabrics/f.yaml"}))))
    assert set(sc.view.topology.switches) == {"tor0", "tor1", "spine"}


# --- valid input ----------------------------------------------------------------------------

@pytest.mark.parametrize("base", sorted(BASES))
def test_base_scenarios_are_valid(tmp_path: Path, base: str) -> None:
    sc = load_scenario(write(tmp_path, build(base)))
    result = plan(sc.view, sc.config)
    assert sc.name == "scenario"
    assert {d.job for d in result.jobs} == {"j0", "j1"}
    assert [d.rank for d in result.jobs] == [0, 1]
    assert sc.view.jobs[0].hosts == (("h0", 4), ("h2", 4))


def test_yaml_equals_json(tmp_path: Path) -> None:
    doc = build("clos", put("path_table", value=[PROBED]))
    from_json = load_scenario(write(tmp_path, doc, "a.json"))
    from_yaml = load_scenario(write(tmp_path, doc, "a.yaml"))
    topo_y, topo_j = from_yaml.view.topology, from_json.view.topology
    assert (topo_y.nodes, topo_y.links) == (topo_j.nodes, topo_j.links)
    assert from_yaml.view.jobs == from_json.view.jobs
    assert from_yaml.view.path_table == from_json.view.path_table
    assert from_yaml.config == from_json.config
    assert (plan(from_yaml.view, from_yaml.config).to_dict()
            == plan(from_json.view, from_json.config).to_dict())


def test_hosts_dict_form_equals_list_form(tmp_path: Path) -> None:
    listed = load_scenario(write(tmp_path, build("clos"), "list.json"))
    mapped = load_scenario(write(tmp_path, build("clos", both(
        drop("jobs", 0, "gpus_per_host"), put("jobs", 0, "hosts", value={"h0": 4, "h2": 4}))),
        "dict.json"))
    assert mapped.view.jobs == listed.view.jobs


def test_levels_argument_overrides_the_file(tmp_path: Path) -> None:
    sc = load_scenario(write(tmp_path, build("clos")), levels=3)
    assert sc.config.levels == 3 and plan(sc.view, sc.config).levels == 3


def test_path_table_restricts_candidates(tmp_path: Path) -> None:
    sc = load_scenario(write(tmp_path, build("clos", put("path_table", value=[PROBED]))))
    result = plan(sc.view, sc.config)
    pinned = [f for f in result.flows if (f.src, f.dst) == ("h0", "h2")]
    free = [f for f in result.flows if (f.src, f.dst) == ("h2", "h0")]
    assert pinned and free
    for f in pinned:
        assert (f.sport, f.hops, f.candidates) == (0xC123, ("tor0", "agg1", "tor1"), 1)
    for f in free:
        assert f.sport is None and f.candidates == 2  # one ECMP path per aggregation switch


def test_a_topology_file_given_as_a_scenario_says_what_it_is(examples: Path) -> None:
    with pytest.raises(ScenarioError) as e:
        load_scenario(examples / "one-link-fabric.yaml")
    assert str(e.value).endswith("one-link-fabric.yaml: $: this is a topology file, not a "
                                 "scenario: a scenario names it in topology.file, cruxd in "
                                 "leader.topology (docs/scenario.md)")
