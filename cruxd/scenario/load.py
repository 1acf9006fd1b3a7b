"""Scenario files -> (ClusterView, PlanConfig). The format is in docs/scenario.md."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cruxd.errors import ScenarioError, UsageError
from cruxd.model.jobs import FlowSpec, Job, ring_allreduce
from cruxd.model.topology import Topology
from cruxd.model.view import ClusterView, DiscoveredPath
from cruxd.scenario.cursor import Cursor, load_document
from cruxd.scenario.fabric_section import parse_topology
from cruxd.scenario.shipped import bundled, bundled_names
from cruxd.scenario.simulation import JOB_FIELDS, SimulationSpec, parse_simulation
from cruxd.scheduler.planner import PlanConfig
from transport.roce import ROCE_SPORT_MAX, ROCE_SPORT_MIN

__all__ = ["Scenario", "bundled", "bundled_names", "load_scenario", "parse_scenario"]

DEFAULT_GPU_TFLOPS = 100.0  # W_j default: GPUs x compute_s x this (A100-class, ~1/3 of peak)

_TOP = {"version", "name", "description", "topology", "jobs", "levels", "dscp", "samples",
        "seed", "max_paths", "reference_job", "gpu_tflops", "path_table", "simulate"}
_JOB = {"id", "hosts", "gpus_per_host", "compute_s", "flops", "overlap", "comm_s", "pattern",
        "bytes", "flows", *JOB_FIELDS}


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    view: ClusterView
    config: PlanConfig
    source: str
    simulation: SimulationSpec = field(default_factory=SimulationSpec)  # cruxctl simulate


def load_scenario(path: str | Path, *, levels: int | None = None) -> Scenario:
    """Read and validate a scenario file; `levels` overrides the file's."""
    path = Path(path)
    doc = load_document(path)
    try:
        return parse_scenario(doc, path.parent, str(path), levels=levels)
    except ScenarioError as exc:
        raise exc.located(str(path)) from None


def parse_scenario(doc: Any, base: Path, source: str = "<scenario>", *,
                   levels: int | None = None) -> Scenario:
    if isinstance(doc, dict) and "jobs" not in doc and {"nodes", "links"} & doc.keys():
        raise ScenarioError("this is a topology file, not a scenario: a scenario names it in "
                            "topology.file, cruxd in leader.topology (docs/scenario.md)")
    cur = Cursor(doc).fields({"topology", "jobs"}, _TOP - {"topology", "jobs"})
    if cur.get("version") is not None and cur["version"].integer() != 1:
        raise cur["version"].fail("this crux reads scenario version 1")
    topo = parse_topology(cur["topology"], base)
    tflops = (cur["gpu_tflops"].number(positive=True) if cur.get("gpu_tflops")
              else DEFAULT_GPU_TFLOPS)
    jobs = _jobs(cur["jobs"], topo, tflops)
    ids = {j.id for j in jobs}
    config = _config(cur, ids, levels)
    table = _path_table(cur["path_table"], topo) if cur.get("path_table") else {}
    simulation = parse_simulation(cur, jobs)
    return Scenario(
        name=cur["name"].string() if cur.get("name") else Path(source).stem,
        description=cur["description"].string() if cur.get("description") else "",
        view=ClusterView(topo, tuple(jobs), table), config=config, source=source,
        simulation=simulation)


def _config(cur: Cursor, ids: set[str], levels: int | None) -> PlanConfig:
    kw: dict[str, Any] = {}
    if levels is not None:
        kw["levels"] = levels
    elif cur.get("levels"):
        kw["levels"] = cur["levels"].integer(lo=1, hi=64)
    for key, lo in (("samples", 1), ("seed", 0), ("max_paths", 1)):
        if cur.get(key) is not None:
            kw[key] = cur[key].integer(lo=lo)
    if cur.get("reference_job"):
        ref = cur["reference_job"].string()
        if ref not in ids:
            raise cur["reference_job"].fail(f"no job has id {ref!r}")
        kw["reference_job"] = ref
    if cur.get("dscp"):
        kw["dscp"] = tuple(d.integer(lo=0, hi=63) for d in cur["dscp"].items())
    config = PlanConfig(**kw)
    try:
        config.dscp_values()
    except ValueError as exc:
        if levels is not None:
            raise UsageError(f"--levels {levels}: {exc}") from None
        where = cur["dscp"] if cur.get("dscp") else cur["levels"] if cur.get("levels") else cur
        raise where.fail(str(exc)) from None
    return config


def _jobs(cur: Cursor, topo: Topology, tflops: float) -> list[Job]:
    jobs: list[Job] = []
    used: dict[str, list[tuple[str, int]]] = {}
    for jc in cur.items():
        job = _job(jc, topo, tflops)
        if any(j.id == job.id for j in jobs):
            raise jc["id"].fail(f"duplicate job id {job.id!r}")
        for host, gpus in job.hosts:
            used.setdefault(host, []).append((job.id, gpus))
            total = sum(g for _, g in used[host])
            if total > topo.nodes[host].gpus:
                who = ", ".join(f"{j} ({g})" for j, g in used[host])
                raise _host_entry(jc["hosts"], host).fail(
                    f"host {host!r} has {topo.nodes[host].gpus} GPUs; jobs ask for {total}: {who}")
        jobs.append(job)
    return jobs


def _job(jc: Cursor, topo: Topology, tflops: float) -> Job:
    jc.fields({"id", "hosts", "compute_s"}, _JOB - {"id", "hosts", "compute_s"})
    job_id = jc["id"].string()
    hosts = _hosts(jc, topo)
    compute = jc["compute_s"].number(positive=True)
    overlap = jc["overlap"].number(lo=0.0, hi=1.0) if jc.get("overlap") is not None else 0.0
    gpus = sum(g for _, g in hosts)
    flops = (jc["flops"].number(positive=True) if jc.get("flops")
             else gpus * compute * tflops * 1e12)
    comm = jc["comm_s"].number(positive=True) if jc.get("comm_s") else None
    pattern = jc["pattern"].string() if jc.get("pattern") else "ring_allreduce"
    if pattern == "ring_allreduce":
        if jc.has("flows"):
            raise jc["flows"].fail("'flows' belongs to pattern 'flows'")
        if not jc.has("bytes"):
            raise jc.fail("missing field 'bytes' (model size for ring_allreduce)")
        size = jc["bytes"].number(positive=True)
        if len(hosts) < 2:
            raise jc["hosts"].fail("a ring all-reduce over one host never leaves it (NVLink); "
                                   "give at least two hosts")
        flows = ring_allreduce(hosts, size, {h: topo.nic_ports(h) for h, _ in hosts})
    elif pattern == "flows":
        if jc.has("bytes"):
            raise jc["bytes"].fail("'bytes' belongs to pattern 'ring_allreduce'")
        if not jc.has("flows"):
            raise jc.fail("missing field 'flows' for pattern 'flows'")
        flows = tuple(_flow(fc, topo, {h for h, _ in hosts}) for fc in jc["flows"].items())
    else:
        raise jc["pattern"].fail(f"unknown pattern {pattern!r} (known: ring_allreduce, flows)")
    return Job(job_id, hosts, compute, flops, overlap, flows, pattern, comm)


def _host_entry(hc: Cursor, host: str) -> Cursor:
    """The cursor of one host inside a job's `hosts` (list or object form)."""
    if isinstance(hc.value, dict):
        return hc[host]
    return Cursor(host, f"{hc.path}[{hc.value.index(host)}]")


def _hosts(jc: Cursor, topo: Topology) -> tuple[tuple[str, int], ...]:
    hc = jc["hosts"]
    pairs: list[tuple[str, int, Cursor]] = []
    if isinstance(hc.value, dict):
        if jc.has("gpus_per_host"):
            raise jc["gpus_per_host"].fail("give GPUs either per host in 'hosts' or here")
        pairs = [(k, c.integer(lo=1), c) for k, c in hc.entries()]
    elif isinstance(hc.value, list):
        per = jc["gpus_per_host"].integer(lo=1) if jc.get("gpus_per_host") else None
        for c in hc.items():
            h = c.string()
            node = topo.nodes.get(h)
            pairs.append((h, per if per is not None else (node.gpus if node else 0), c))
    else:
        raise hc.fail("expected a list of host ids or an object {host: GPUs}")
    if not pairs:
        raise hc.fail("a job needs at least one host")
    seen: set[str] = set()
    for h, g, c in pairs:
        if not topo.is_host(h):
            what = "a switch" if h in topo.nodes else "an unknown host"
            raise c.fail(f"{h!r} is {what}")
        if h in seen:
            raise c.fail(f"host {h!r} listed twice")
        seen.add(h)
        if g > topo.nodes[h].gpus:
            raise c.fail(f"host {h!r} has {topo.nodes[h].gpus} GPUs, job asks for {g}")
        if g < 1:
            raise c.fail(f"host {h!r}: a job needs at least one GPU per host")
    return tuple((h, g) for h, g, _ in pairs)


def _flow(fc: Cursor, topo: Topology, job_hosts: set[str]) -> FlowSpec:
    fc.fields({"src", "dst", "bytes"}, {"src_port", "dst_port"})
    src, dst = fc["src"].string(), fc["dst"].string()
    for key, h in (("src", src), ("dst", dst)):
        if h not in job_hosts:
            raise fc[key].fail(f"{h!r} is not one of the job's hosts")
    if src == dst:
        raise fc["dst"].fail("a flow must leave its host (intra-host traffic is not modelled)")
    ports = []
    for key, h in (("src_port", src), ("dst_port", dst)):
        ports.append(fc[key].integer(lo=0, hi=topo.nic_ports(h) - 1) if fc.get(key) is not None
                     else None)
    return FlowSpec(src, dst, fc["bytes"].number(positive=True), ports[0], ports[1])


def _path_table(cur: Cursor, topo: Topology) -> dict[tuple[str, str], tuple[DiscoveredPath, ...]]:
    table: dict[tuple[str, str], tuple[DiscoveredPath, ...]] = {}
    for ec in cur.items():
        ec.fields({"src", "dst", "paths"})
        src, dst = ec["src"].string(), ec["dst"].string()
        for key, h in (("src", src), ("dst", dst)):
            if not topo.is_host(h):
                raise ec[key].fail(f"{h!r} is not a host of the topology")
        paths = []
        for pc in ec["paths"].items():
            pc.fields({"hops", "sports"})
            hops = tuple(h.string() for h in pc["hops"].items())
            nodes = [src, *hops, dst]
            for i, (a, b) in enumerate(itertools.pairwise(nodes)):
                if not any(topo.links[x].dst == b for x in topo.out_links.get(a, ())):
                    at = f"{pc.path}.hops[{min(i, len(hops) - 1)}]"
                    where = Cursor(None, at) if hops else pc["hops"]
                    raise where.fail(f"no link {a} -> {b} in the topology")
            sports = tuple(s.integer(lo=ROCE_SPORT_MIN, hi=ROCE_SPORT_MAX)
                           for s in pc["sports"].items())
            if not sports:
                raise pc["sports"].fail("a probed path needs at least one source port")
            paths.append(DiscoveredPath(hops, sports))
        if (src, dst) in table:
            raise ec.fail(f"pair {src} -> {dst} listed twice")
        table[(src, dst)] = tuple(paths)
    return table
