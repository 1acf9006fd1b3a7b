"""examples/grafana/crux-dashboard.json: a Grafana dashboard (JSON model, schema 39) whose
every query is PromQL that promtool parses, over metrics the exporter renders. No Grafana
runs here: the model is checked as Grafana reads it (ids, grid, datasource, variables),
and bench/dashboard.py renders its panels from a live daemon through a real Prometheus."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.test_metrics_promtool import PROMTOOL, _rendered, needs_promtool

DASHBOARD = Path(__file__).resolve().parent.parent / "examples" / "grafana" / "crux-dashboard.json"
PANEL_TYPES = {"row", "stat", "timeseries", "table", "bargauge", "state-timeline", "text"}


def _dashboard() -> dict[str, Any]:
    doc = json.loads(DASHBOARD.read_text())
    assert isinstance(doc, dict)
    return doc


def _queries(doc: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in doc["panels"] for t in p.get("targets", ())]


def promql(expr: str) -> str:
    """A panel's query with Grafana's variables as Prometheus would receive them."""
    return expr.replace("$__rate_interval", "5m").replace("$job", ".*")


def test_the_json_model_is_one_grafana_imports() -> None:
    doc = _dashboard()
    assert {"title", "uid", "schemaVersion", "panels", "templating", "time"} <= doc.keys()
    assert isinstance(doc["schemaVersion"], int) and doc["schemaVersion"] >= 36
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", doc["uid"])
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    cells: set[tuple[int, int]] = set()
    for p in doc["panels"]:
        assert p["type"] in PANEL_TYPES, p["title"]
        g = p["gridPos"]
        assert all(isinstance(g[k], int) and g[k] >= 0 for k in "xywh"), p["title"]
        assert g["w"] >= 1 and g["h"] >= 1 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and p.get("description"), p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
    names = {v["name"] for v in doc["templating"]["list"]}
    assert {"datasource", "job"} <= names
    used = set(re.findall(r"\$(\w+)", json.dumps(_queries(doc)))) - {"__rate_interval"}
    assert used <= names, used - names


@needs_promtool
def test_every_query_is_promql_over_rendered_metrics(tmp_path: Path) -> None:
    """promtool parses each query (as a recording rule), and every crux metric a query
    reads is one the exporter renders."""
    assert PROMTOOL is not None
    queries = [promql(q) for q in _queries(_dashboard())]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": q} for i, q in enumerate(queries)]}]}
    path = tmp_path / "queries.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    run = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    used = {m for q in queries for m in re.findall(r"\b(crux_[a-z_]+)\b", q)} - {"crux_job"}
    rendered = set(re.findall(r"^(crux_[a-z_]+)", _rendered(), re.M))
    assert used <= rendered, used - rendered


def test_a_broken_query_is_caught(tmp_path: Path) -> None:
    """The check above fails on what it should: a query promtool cannot parse."""
    if PROMTOOL is None:
        pytest.skip("promtool not installed (Debian package `prometheus`)")
    path = tmp_path / "bad.yml"
    path.write_text(json.dumps({"groups": [{"name": "d", "rules": [
        {"record": "dashboard:bad", "expr": promql("sum by (crux_job (crux_job_level)")}]}]}))
    run = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode != 0
