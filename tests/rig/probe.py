"""Run the prober from inside a rig host (it needs the host's network namespace)."""

from __future__ import annotations

import json
import sys
from typing import Any

from tests.rig.fabric import MAX_SPINES, Fabric

_SCRIPT = """
import json, sys
from probing.sweep import ROCE_SPORTS, sweep
from probing.ttl import TtlProber
peer, expected, per_path, budget, port = sys.argv[1:6]
with TtlProber(peer) as p:
    if port:
        print(json.dumps({"hops": p.trace(int(port))}))
    else:
        doc = sweep(p, peer, ROCE_SPORTS, expected=int(expected) if expected else None,
                    ports_per_path=int(per_path), max_probes=int(budget)).to_json()
        doc["ignored"] = p.counters.ignored
        print(json.dumps(doc))
"""


def _run(f: Fabric, src: str, dst: str, *args: str) -> Any:
    run = f.exec(src, sys.executable, "-c", _SCRIPT, f.address(dst), *args, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def sweep_from(f: Fabric, src: str, dst: str, *, expected: int | None = None,
               ports_per_path: int = 1, max_probes: int = 400) -> dict[str, Any]:
    """One sweep from `src` toward `dst`: SweepResult.to_json() plus `ignored` replies."""
    doc: dict[str, Any] = _run(f, src, dst, str(expected or ""), str(ports_per_path),
                               str(max_probes), "")
    return doc


def trace_from(f: Fabric, src: str, dst: str, sport: int) -> list[str] | None:
    """The hops one probe from `sport` crosses (None: a hop did not answer)."""
    hops: list[str] | None = _run(f, src, dst, "", "1", "1", str(sport))["hops"]
    return hops


def spine_of(hop: str) -> int:
    """The spine a hop names: spines answer from their leaf links, 10.3.(leaf*32+s).2."""
    return int(hop.split(".")[2]) % MAX_SPINES
