"""Run the prober from inside a rig host (it needs the host's network namespace)."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from probing.hashmodel import HashModel
from tests.rig.fabric import MAX_SPINES, Fabric

_SCRIPT = """
import json, sys
from probing.guided import guided_sweep
from probing.hashmodel import HashModel
from probing.sweep import sweep
from probing.ttl import TtlProber
from transport.roce import ROCE_SPORTS
peer, args = sys.argv[1], json.loads(sys.argv[2])
sports = range(args.get("start", ROCE_SPORTS.start), ROCE_SPORTS.stop)
with TtlProber(peer, dscp=args.get("dscp", 0)) as p:
    if args.get("port"):
        print(json.dumps({"hops": p.trace(args["port"])}))
        sys.exit()
    if args.get("model"):
        model = HashModel(**{**args["model"], "fields": tuple(args["model"]["fields"])})
        doc = guided_sweep(p, model, peer, args["src"], args["n_paths"], sports=sports,
                           expected=args.get("expected"),
                           max_probes=args["max_probes"]).to_json()
    else:
        doc = sweep(p, peer, sports, expected=args.get("expected"),
                    ports_per_path=args["per_path"], max_probes=args["max_probes"]).to_json()
    doc["ignored"] = p.counters.ignored
    doc["datagrams"] = p.counters.sent
    print(json.dumps(doc))
"""


def _run(f: Fabric, node: str, peer: str, args: dict[str, Any]) -> Any:
    run = f.exec(node, sys.executable, "-c", _SCRIPT, f.address(peer), json.dumps(args),
                 timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def sweep_from(f: Fabric, src: str, dst: str, *, expected: int | None = None,
               ports_per_path: int = 1, max_probes: int = 400,
               start: int | None = None) -> dict[str, Any]:
    """One sweep from `src` toward `dst` (ports from `start`, default 0xC000, upward):
    SweepResult.to_json() plus `ignored` replies and `datagrams` sent."""
    args = {"expected": expected, "per_path": ports_per_path, "max_probes": max_probes}
    if start is not None:
        args["start"] = start
    doc: dict[str, Any] = _run(f, src, dst, args)
    return doc


def guided_from(f: Fabric, src: str, dst: str, model: HashModel, n_paths: int, *,
                expected: int | None = None, max_probes: int = 400) -> dict[str, Any]:
    """probing.guided.guided_sweep from `src` toward `dst`: as sweep_from."""
    doc: dict[str, Any] = _run(f, src, dst, {
        "model": dataclasses.asdict(model), "src": f.address(src), "n_paths": n_paths,
        "expected": expected, "max_probes": max_probes})
    return doc


def trace_from(f: Fabric, src: str, dst: str, sport: int, dscp: int = 0) -> list[str] | None:
    """The hops one probe from `sport` crosses (None: a hop did not answer)."""
    hops: list[str] | None = _run(f, src, dst, {"port": sport, "dscp": dscp})["hops"]
    return hops


def spine_of(hop: str) -> int:
    """The spine a hop names: a spine answers from its link to the leaf the probe came
    from, 10.3.(leaf*32+s).2, and the next leaf from its link to that spine, .1."""
    return int(hop.split(".")[2]) % MAX_SPINES
