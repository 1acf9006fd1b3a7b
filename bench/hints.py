"""Placement-hint export time (cruxd/hints): every format from one view of a large fabric.

Protocol
  * Fabric: clos2 with 250 hosts of 8 GPUs (2,000 GPUs: 125 ToRs x 2 hosts, 16 aggregation
    switches, 4 x 100 Gbit/s NIC links per host), and the seed's trace topology (2,768 GPUs,
    173 ToRs). Half of the hosts have 4 GPUs in use, every link some planned load at 2 of
    4 levels, 64 measured bandwidth samples.
  * For each format: build_view + render, --reps runs, median and best wall time
    (time.perf_counter); "all" renders every format from one view, as the leader's periodic
    export does. Target: < 1 s for all formats on the 2,000-GPU fabric.

    .venv/bin/python bench/hints.py [--reps R]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

from tables import preamble  # bench/ is on sys.path when run as a script

from cruxd.hints.bandwidth import BandwidthSample
from cruxd.hints.fabric_view import build_view
from cruxd.hints.formats import FORMATS, render
from cruxd.model.topology import Topology
from cruxd.topo.builders import clos2, trace_clos


def inputs(topo: Topology) -> tuple[dict[str, object], list[BandwidthSample]]:
    hosts = topo.hosts
    used = {h: 4 for h in hosts[::2]}
    load = {(lk.src, lk.dst): (1.0, 0.0, 2.0, 0.0) for lk in topo.links}
    samples = [BandwidthSample(hosts[i], hosts[-1 - i], (), 80.0 + i, f"j{i}", 0, True)
               for i in range(64)]
    return {"used": used, "load": load, "levels": 4}, samples


def timed(topo: Topology, fmt: str, reps: int) -> list[float]:
    kw, samples = inputs(topo)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        view = build_view(topo, **kw)  # type: ignore[arg-type]
        for f in (FORMATS if fmt == "all" else (fmt,)):
            render(f, view, samples)
        out.append(time.perf_counter() - t0)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    preamble()
    print()
    fabrics = [("clos2 2,000 GPUs", clos2(125, 16, 2, name="clos2-2000")),
               ("trace-clos 2,768 GPUs", trace_clos())]
    rows = []
    for name, topo in fabrics:
        for fmt in (*FORMATS, "all"):
            t = timed(topo, fmt, args.reps)
            rows.append((name, fmt, statistics.median(t) * 1e3, min(t) * 1e3))
    print(f"{'fabric':<22}  {'format':<10}  {'median ms':>9}  {'best ms':>8}")
    print(f"{'-' * 22}  {'-' * 10}  {'-' * 9}  {'-' * 8}")
    for name, fmt, med, best in rows:
        print(f"{name:<22}  {fmt:<10}  {med:9.1f}  {best:8.1f}")
    print("\n# wall time of build_view + render per format; 'all' = every format from one view")


if __name__ == "__main__":
    main()
