"""PCIe semaphore benchmark (shim/crux_pcie.c): uncontended and contended acquire+release.

Protocol
  * `make -C shim pcie`, then shim/build/bench_pcie on a fresh file in a temp dir, link 0:
  (a) Uncontended, in C: one process, ITERS acquire+release pairs (level 3) after ITERS/10
      warm-up pairs; ns per pair = elapsed / ITERS (CLOCK_MONOTONIC around the loop).
  (b) Contended, in C: P forked processes (2, 4) hammer link 0, ITERS pairs each, levels
      rank % 2, a shared non-atomic counter incremented inside (checked exact: count_ok);
      throughput = P*ITERS / (start barrier -> last exit); acquire latency = CLOCK_MONOTONIC
      around each crux_pcie_acquire call, percentiles over all P*ITERS calls.
  (c) For reference, uncontended from Python (transport/pcie.py, ctypes): ns per pair.
  Each C row is the median (by ns/op) of --repeat runs. With more processes than cores the
  contended rows measure the scheduler as much as the lock: the core count is printed.
  (d) The wrapper's gate on the data path (shim/crux_gate.c), in C without a NIC
      (shim/build/bench_gate DIR ITERS): fake device contexts whose ops tables accept every WR
      and return queued completions, one context gated (its ops swapped for the trampolines,
      real semaphore and map files), one not (the baseline). ns per ibv_post_send (or per
      post + poll pair) through the trampoline minus the same call through the ungated
      context; median of --repeat runs of --gate-iters calls each. Target: < 100 ns added per
      post on the uncontended path. The gated QPs also count their traffic into QP records, as
      every connected QP of a job with an id does; the "counted" rows are a context that is
      counted but not gated (crux_gate.h "Counting"): what per-QP attribution costs alone.

    .venv/bin/python bench/pcie.py [--iters N] [--repeat R] [--procs 2,4] [--gate-iters N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from _make import BUILD, ensure_built

# bench/ is on sys.path when run as a script
from tables import preamble, table

from transport.pcie import PcieLocks

BENCH = BUILD / "bench_pcie"
GATE = BUILD / "bench_gate"
# (row, gated key, baseline key): what the gate adds to each kind of call
GATE_ROWS = [
    ("post, counted, not gated (per-QP traffic counters)", "counted_post", "base_post"),
    ("post + poll, counted, not gated", "counted_pair", "base_pair"),
    ("poll, empty CQ, counted, not gated", "counted_poll_empty", "base_poll_empty"),
    ("post, link held, nobody waiting (the fast path)", "gated_post", "base_post"),
    ("post, unsignaled WR", "unsignaled_post", "base_post"),
    ("post, link held, a lower level waiting", "waiter_post", "base_post"),
    ("post + poll, link kept held by another QP", "held_pair", "base_pair"),
    ("post + poll, link taken and given back each time", "pingpong_pair", "base_pair"),
    ("poll, empty CQ", "gated_poll_empty", "base_poll_empty"),
]


def run_c(path: Path, procs: int, iters: int) -> dict[str, float]:
    out = subprocess.run([str(BENCH), str(path), str(procs), str(iters)], capture_output=True,
                         text=True, check=True).stdout
    return {k: float(v) for k, v in (kv.split("=") for kv in out.split())}


def median_run(path: Path, procs: int, iters: int, repeat: int) -> dict[str, float]:
    runs = sorted((run_c(path, procs, iters) for _ in range(repeat)),
                  key=lambda r: r["ns_per_op"])
    return runs[len(runs) // 2]


def python_ns(path: Path, iters: int) -> float:
    with PcieLocks.create(path, 1) as lk:
        acq, rel = lk.acquire, lk.release
        for _ in range(iters // 10):
            acq(0, 3)
            rel(0)
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            acq(0, 3)
            rel(0)
        return (time.perf_counter_ns() - t0) / iters


def gate_rows(iters: int, repeat: int) -> list[list[object]]:
    runs = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as d:
            out = subprocess.run([str(GATE), d, str(iters)], capture_output=True, text=True,
                                 check=True).stdout
        runs.append({k: float(v) for k, v in (kv.split("=") for kv in out.split())})
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return [[name, f"{med[base]:.1f}", f"{med[gated]:.1f}", f"{med[gated] - med[base]:.1f}"]
            for name, gated, base in GATE_ROWS]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=200_000, help="pairs per process")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--procs", default="2,4", help="contended process counts")
    ap.add_argument("--gate-iters", type=int, default=2_000_000, help="calls per gate case")
    args = ap.parse_args(argv)
    preamble()
    ensure_built(BENCH, "pcie")
    ensure_built(GATE, "gate")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "pcie"
        r = median_run(path, 1, args.iters, args.repeat)
        rows.append(["uncontended (C)", 1, f"{r['ns_per_op']:.1f}", f"{1e9 / r['ns_per_op']:,.0f}",
                     "-", "-", "-", "-"])
        for p in (int(x) for x in args.procs.split(",") if x):
            r = median_run(path, p, args.iters, args.repeat)
            rows.append([f"contended (C), {p} procs", p, f"{r['ns_per_op']:.1f}",
                         f"{r['ops_per_s']:,.0f}", f"{r['p50_acquire_ns']:,.0f}",
                         f"{r['p99_acquire_ns']:,.0f}", f"{r['max_acquire_ns']:,.0f}",
                         "yes" if r["count_ok"] else "NO"])
        py = python_ns(path, min(args.iters, 100_000))
        rows.append(["uncontended (Python ctypes)", 1, f"{py:.1f}", f"{1e9 / py:,.0f}",
                     "-", "-", "-", "-"])
    print()
    print(table(["case", "procs", "ns/pair", "pairs/s", "acq p50 ns", "acq p99 ns",
                 "acq max ns", "count exact"], rows))
    print(f"\n# {args.iters:,} pairs per process, median of {args.repeat} runs; "
          "ns/pair contended = wall time / all pairs (the link is serial)")
    print("\n(d) the wrapper's PCIe gate on ibv_post_send/ibv_poll_cq, native, no NIC (ns per "
          "call)")
    print(table(["call", "ungated", "gated", "added"], gate_rows(args.gate_iters, args.repeat)))
    print(f"\n# {args.gate_iters:,} calls per case, median of {args.repeat} runs")


if __name__ == "__main__":
    main()
