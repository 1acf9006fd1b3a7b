"""The leader's hints: load by level from a plan, measured bandwidth from live reports, every
format rendered from one view, `cruxctl hints` what-if and against a running leader, and the
periodic export to a directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cruxd.cli.cruxctl import main
from cruxd.control.records import JobAssignment, JobState, LocalJob, Measurement, PeerRoute
from cruxd.hints.bandwidth import BandwidthLog, export, samples_from
from cruxd.hints.collect import level_loads
from cruxd.hints.fabric_view import build_view
from cruxd.hints.formats import FORMATS, render
from cruxd.model.plan import FlowDecision, JobDecision, Plan
from cruxd.testing import Daemon, crux_run, cruxctl, free_port, wait_for
from cruxd.topo.builders import clos2

SCHEMAS = Path(__file__).resolve().parent.parent / "docs" / "hints"


def decision(job: str, level: int, period: float) -> JobDecision:
    return JobDecision(job, 1e12, 0.1, period, 1.0, 1e12, 0, level, 0, True)


def test_level_loads_split_demand_by_level() -> None:
    flows = (FlowDecision("a", "h0", "h2", 1e9, 0, (), ("tor0", "agg1", "tor1"), None, 2),
             FlowDecision("b", "h1", "h3", 5e8, 0, (), ("tor0", "agg1", "tor1"), None, 2),
             FlowDecision("c", "h1", "h3", 5e8, 0, (), ("tor0", "agg0", "tor1"), None, 2))
    plan = Plan((decision("a", 2, 1.0), decision("b", 0, 0.5), decision("c", 0, 0.0)), flows,
                (), 3, "a", 0.0, 0.0)
    load = level_loads(plan, 3)
    assert load[("tor0", "agg1")] == pytest.approx((8.0, 0.0, 8.0))  # 0.5 GB/0.5 s, 1 GB/1 s
    assert load[("h0", "tor0")] == pytest.approx((0.0, 0.0, 8.0))
    assert ("tor0", "agg0") not in load  # a period of 0 (unknown) offers no known load
    view = build_view(clos2(2, 2, 2), load=load, levels=3)
    lk = view.link("tor0", "agg1")
    assert lk is not None and lk.load_total_gbps == pytest.approx(16.0)


def live_job(source: str, comm_s: float = 0.2, nbytes: float = 1e9) -> LocalJob:
    return LocalJob("a", 8, measurement=Measurement(1e14, comm_s, 1.0, 0.5, nbytes, source))


def test_bandwidth_samples_from_live_measurements_only() -> None:
    route = PeerRoute("h0", "h2", ("10.0.0.3",), 0xC001, ("tor0", "agg1", "tor1"))
    a = {"a": JobAssignment("a", JobState.PROFILING, routes=(route,))}
    got = samples_from("h0", [live_job("nvml+nic")], a, 5)
    assert [(s.src, s.dst, s.hops, s.profiled) for s in got] == [
        ("h0", "h2", ("tor0", "agg1", "tor1"), True)]
    assert got[0].gbps == pytest.approx(1e9 * 8 / 0.2 / 1e9)
    assert samples_from("h0", [live_job("hints")], a, 5) == []
    assert samples_from("h2", [live_job("nvml+nic")], a, 5) == []  # no route from h2
    assert not samples_from("h0", [live_job("nvml+nic (unprofiled)")], a, 5)[0].profiled
    log = BandwidthLog(keep=2)
    assert log.add(got) == 1 and log.add(got) == 0  # the same report twice
    log.add(samples_from("h0", [live_job("nvml+nic", comm_s=0.4)], a, 6))
    log.add(samples_from("h0", [live_job("nvml+nic", comm_s=0.8)], a, 7))
    assert [s.gbps for s in log.samples()] == pytest.approx([20.0, 10.0])  # newest two
    assert log.link_measured()[("agg1", "tor1")] == pytest.approx(20.0)
    doc = export(build_view(clos2(2, 2, 2)), log.samples())
    assert doc["paths"][0]["nominal_gbps"] == pytest.approx(100.0)
    assert len(doc["paths"][0]["samples"]) == 2


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_renders_and_parses(fmt: str) -> None:
    out = render(fmt, build_view(clos2(2, 2, 2)))
    assert out.format == fmt and out.text
    if out.media_type == "application/json":
        json.loads(out.text)
    elif out.media_type == "application/yaml":
        assert all(d["kind"] == "HyperNode" for d in yaml.safe_load_all(out.text))
    else:
        assert "SwitchName=" in out.text
    with pytest.raises(ValueError, match="unknown hints format"):
        render("nope", build_view(clos2(2, 2, 2)))


def test_cruxctl_hints_what_if_from_a_scenario(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    assert main(["hints", "--format", "slurm", "--scenario", "testbed96"]) == 0
    text = capsys.readouterr().out
    assert text.count("Nodes=") == 6  # one line per ToR of the testbed
    out = tmp_path / "sf.json"
    assert main(["hints", "--format", "spiderflow", "--scenario", "testbed96",
                 "--out", str(out)]) == 0
    assert json.loads(out.read_text())["format"] == "crux.spiderflow"
    assert main(["hints", "--format", "arnold", "--scenario", "testbed96",
                 "--leader", "127.0.0.1:1"]) == 2
    assert "takes no" in capsys.readouterr().err


def test_leader_serves_hints_and_exports_them(tmp_path: Path) -> None:
    hints_dir = tmp_path / "hints"
    leader = f"127.0.0.1:{free_port()}"
    d = Daemon(tmp_path, "h0", {
        "agent": {"addresses": ["10.9.0.1"], "gpus": 8, "report_interval_s": 0.2,
                  "probing": "none", "leader": leader},
        "leader": {"listen": leader, "profiling_s": 0, "hints_dir": str(hints_dir),
                   "hints_interval_s": 1}})
    job = None
    try:
        d.start()
        d.wait_log("agent h0")

        def placed() -> Any:
            run = cruxctl("place", "--dp", "1", "--tp", "8", "--pp", "1", "--json",
                          socket_path=d.socket)
            return json.loads(run.stdout) if run.returncode == 0 else None
        # `cruxctl place` on the live leader's hints: the idle host takes a whole-node job
        answer = wait_for("a placement on the idle host", placed, timeout=30)
        assert [n["host"] for n in answer["nodes"]] == ["h0"]
        job = crux_run(d.socket, "j", "--gpus", "3")

        def counted() -> Any:
            """h0 in the leader's hints once they count the job's 3 GPUs (an export written
            before the job's report reached the leader still shows 8 free)."""
            run = cruxctl("hints", "--format", "spiderflow", socket_path=d.socket)
            if run.returncode != 0:
                return None
            doc = json.loads(run.stdout)
            host = next(h for v in doc["vertices"] for h in v["hosts"] if h["host"] == "h0")
            return host if host["gpus_free"] != 8 else None
        host = wait_for("the leader's hints to count the job's GPUs", counted, timeout=30)
        assert (host["gpus"], host["gpus_free"]) == (8, 5)
        wait_for("the exports", lambda: (hints_dir / "node-labels.json").exists(), timeout=30)
        assert sorted(p.name for p in hints_dir.iterdir()) == sorted(
            ["spiderflow.json", "arnold.json", "volcano-hypernodes.yaml", "topology.conf",
             "node-labels.json", "bandwidth.json"])
        bad = cruxctl("hints", "--format", "nope", socket_path=d.socket)
        assert bad.returncode == 2 and "invalid choice" in bad.stderr
        # with 3 of its GPUs in use, h0 no longer holds a whole 8-GPU node
        full = cruxctl("place", "--dp", "1", "--tp", "8", "--pp", "1", socket_path=d.socket)
        assert full.returncode == 2 and "the fabric has 0" in full.stderr, full.stderr
    finally:
        if job is not None:
            job.kill()
            job.wait()
        d.stop()


@pytest.mark.parametrize(("fmt", "schema"), [
    ("spiderflow", "spiderflow"), ("arnold", "arnold"), ("labels", "node-labels"),
    ("bandwidth", "bandwidth")])
def test_live_style_exports_validate_against_their_schemas(fmt: str, schema: str) -> None:
    import jsonschema

    route = PeerRoute("h0", "h2", ("10.0.0.3",), 0xC001, ("tor0", "agg1", "tor1"))
    a = {"a": JobAssignment("a", JobState.PROFILING, routes=(route,))}
    log = BandwidthLog()
    log.add(samples_from("h0", [live_job("nvml+nic")], a, 5))
    view = build_view(clos2(2, 2, 2), used={"h0": 3}, measured=log.link_measured())
    doc = json.loads(render(fmt, view, log.samples()).text)
    jsonschema.validate(doc, json.loads((SCHEMAS / f"{schema}.schema.json").read_text()))


def test_cli_lists_the_same_formats_as_the_renderer() -> None:
    from cruxd.cli.hints_cmd import FORMATS as CLI_FORMATS  # kept apart: no numpy at parse time

    assert CLI_FORMATS == FORMATS
