"""NCCL profiler plugin benchmark: what libcrux_nccl_profiler.so adds per event, and what
reading its records costs the agent.

(a) shim/bench/bench_nccl_profiler.c opens the installed plugin and calls its ncclProfiler_v6
    as NCCL 2.29+ would, from one thread: per collective, a Coll start and stop, then OPS proxy
    ops of STEPS steps each (step start, SendWait with its size, step stop), then the ops'
    stops. The same loop through a plugin whose calls do nothing is subtracted. The record
    file's rewrites (at most every 200 ms) fall inside the loop, so they are in the figures.
    A figure is the median of --repeat runs. The budget (issue 35) is 100 ns per collective
    on the fast path: the collective's own two calls.
(b) The agent's side: transport/nccl_records.py parsing a full record (8 communicators x 512
    bursts) and cruxd/measure/collectives.py estimating a job of 8 such processes.

    .venv/bin/python bench/nccl_profiler.py [--colls N] [--repeat R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence

import numpy as np
from _make import BUILD, ensure_built

# bench/ is on sys.path when run as a script
from tables import preamble, table

from cruxd.measure.collectives import Bursts, estimate
from transport import native
from transport import nccl_records as nr


def plugin_costs(colls: int, repeat: int) -> None:
    prog = ensure_built(BUILD / "bench_nccl_profiler", "nccl")
    lib = str(native.library(native.NCCL_PROFILER))
    runs: dict[str, list[list[float]]] = {}
    with tempfile.TemporaryDirectory() as d:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRUX_")}
        env.update(CRUX_QP_DIR=d, CRUX_JOB_ID="bench")
        for _ in range(repeat):
            out = subprocess.run([str(prog), lib, str(colls)], capture_output=True, text=True,
                                 check=True, env=env).stdout.splitlines()
            for line in out[1:]:
                name, *nums = line.split(",")
                runs.setdefault(name, []).append([float(x) for x in nums])
    rows = []
    for name, rs in runs.items():
        med = [statistics.median(r[i] for r in rs) for i in range(5)]
        rows.append([name, f"{med[0]:.0f}", f"{med[1]:.1f}", f"{med[2]:.1f}", f"{med[3]:.1f}",
                     f"{med[4]:,.0f}"])
    print(f"\n(a) the plugin per call, ns (median of {repeat} runs of {colls:,} collectives' "
          "worth of calls)")
    print(table(["case", "calls/coll", "plugin", "no-op plugin", "added/call", "added/coll"],
                rows))


def record_costs(repeat: int) -> None:
    buf = full_record()
    t = []
    for _ in range(repeat * 20):
        t0 = time.perf_counter()
        rec = nr.parse(buf)
        t.append(time.perf_counter() - t0)
    bursts = [Bursts(c.bursts["start_ns"], c.bursts["end_ns"], c.bursts["busy_ns"],
                     c.bursts["sent_bytes"], c.since_ns) for c in rec.comms] * 8
    end = int(max(int(b.end_ns.max()) for b in bursts))
    e = []
    for _ in range(repeat * 4):
        t0 = time.perf_counter()
        est = estimate(bursts, 0, end)
        e.append(time.perf_counter() - t0)
    assert est is not None
    print("\n(b) the agent's side, ms (median)")
    print(table(["step", "ms"], [
        [f"parse one record ({nr.SIZE:,} bytes, {nr.COMMS} x {nr.BURSTS} bursts)",
         f"{statistics.median(t) * 1e3:.2f}"],
        [f"estimate a job of 8 such processes ({len(bursts) * nr.BURSTS:,} bursts, "
         f"{est.window_s:.0f} s window)", f"{statistics.median(e) * 1e3:.1f}"]]))


def full_record() -> bytes:
    """8 communicators, each 512 bursts of a 0.2 s iteration with two 20 ms bursts."""
    buf = bytearray(nr.SIZE)
    h = np.zeros(1, dtype=nr._HEADER)
    for k, v in dict(magic=nr.MAGIC, version=nr.VERSION, header_size=nr.HEADER_SIZE,
                     comm_size=nr.COMM_SIZE, burst_size=nr.BURST_SIZE, comms=nr.COMMS,
                     bursts=nr.BURSTS, pid=1).items():
        h[k] = v
    c = np.zeros(nr.COMMS, dtype=nr._COMM)
    c["state"], c["total"], c["created_ns"] = nr.SLOT_LIVE, nr.BURSTS, 1
    i = np.arange(nr.BURSTS)
    start = (1 + (i // 2) * 200_000_000 + (i % 2) * 100_000_000).astype(np.uint64)
    ring = c["ring"]
    ring["start_ns"], ring["end_ns"] = start, start + np.uint64(20_000_000)
    ring["busy_ns"], ring["sent_bytes"] = 20_000_000, 1 << 20
    buf[:nr.HEADER_SIZE] = h.tobytes()
    buf[nr.HEADER_SIZE:] = c.tobytes()
    h["checksum"] = nr.checksum(bytes(buf))
    buf[:nr.HEADER_SIZE] = h.tobytes()
    return bytes(buf)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--colls", type=int, default=200_000,
                    help="collectives' worth of calls per case and run")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    preamble()
    plugin_costs(args.colls, args.repeat)
    record_costs(args.repeat)


if __name__ == "__main__":
    main()
