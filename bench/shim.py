"""Verbs shim benchmark: the cost the shim adds to a job's ibv_modify_qp, and its lookup.

Protocol
  (a) Decision lookup, in C without a NIC (shim/build/bench_shim ENTRIES ITERS): a table of
      ENTRIES live entries, the measured job's two entries last (every lookup scans the whole
      table). ns per crux_decide call hitting a per-peer entry, falling back to the job-wide
      entry (two scans), and finding nothing; ns per QP record add+remove; and `fixed`, the
      wrapper's other per-connect work (two uncontended mutex pairs, two clock_gettime, getpid).
      Added cost per intercepted call ~= job-wide lookup + record + fixed. Median of --repeat.
  (b) With --vm (hosts without RDMA) or --device (hosts with it): the real call. bench_modify
      cycles one RC QP RESET -> INIT -> RTR and times the RTR ibv_modify_qp, plain and with
      LD_PRELOAD=libcrux_ibverbs.so and a 64-entry table holding its decision; the difference
      is the added cost. In the VM this runs under qemu TCG (emulated CPU, ~10x slower than
      native), so both columns and their difference are inflated: read (a) for native cost.
  PCIe semaphore acquire/release: bench/pcie.py.

    .venv/bin/python bench/shim.py [--iters N] [--repeat R] [--vm | --device rxe0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from _make import BUILD, ensure_built

# bench/ is on sys.path when run as a script
from tables import preamble, table

from transport import native

REPO = Path(__file__).resolve().parent.parent
SIZES = (2, 16, 64, 256, 1024)


def run_kv(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return {k: float(v) for k, v in (kv.split("=") for kv in out.split())}


def lookup_rows(iters: int, repeat: int) -> list[list[object]]:
    rows = []
    for n in SIZES:
        runs = [run_kv([str(BUILD / "bench_shim"), str(n), str(iters)]) for _ in range(repeat)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        added = med["decide_jobwide_ns"] + med["record_ns"] + med["fixed_ns"]
        rows.append([n, f"{med['decide_peer_ns']:.0f}", f"{med['decide_jobwide_ns']:.0f}",
                     f"{med['decide_miss_ns']:.0f}", f"{med['record_ns']:.0f}",
                     f"{med['fixed_ns']:.0f}", f"{added:.0f}"])
    return rows


def modify_rows(device: str, iters: int) -> list[list[object]]:
    """Plain vs through the shim, on this host's RDMA device."""
    from transport.decision_table import Decision, TableWriter

    lib = native.library(native.IBVERBS)
    cmd = [str(BUILD / "bench_modify"), device, "1", str(iters)]
    with tempfile.TemporaryDirectory() as d:
        table = Path(d) / "decisions"
        with TableWriter.open(table, capacity=64) as w:  # 63 other jobs, then ours
            w.apply([Decision(f"other-{i}", None, 1, 26, 104, 0xC000 + i, 1) for i in range(63)]
                    + [Decision("bench", None, 2, 46, 184, 0xE000, 1)], 1)
        env = {**os.environ, "CRUX_JOB_ID": "bench", "CRUX_DECISION_TABLE": str(table),
               "CRUX_QP_DIR": d}
        plain = run_kv(cmd)
        shim = run_kv(cmd, {**env, "LD_PRELOAD": str(lib)})
    return [["plain", f"{plain['rtr_ns_median']:,.0f}", f"{plain['rtr_ns_mean']:,.0f}", "-"],
            ["through the shim", f"{shim['rtr_ns_median']:,.0f}",
             f"{shim['rtr_ns_mean']:,.0f}",
             f"{shim['rtr_ns_median'] - plain['rtr_ns_median']:,.0f}"]]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=200_000, help="lookups per measurement")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--vm", action="store_true", help="also time the real call in the rxe VM")
    ap.add_argument("--device", help="also time the real call on this RDMA device")
    ap.add_argument("--modify-iters", type=int, default=2000)
    args = ap.parse_args(argv)
    preamble()
    ensure_built(BUILD / "bench_shim", "verbs")
    print("\n(a) decision lookup and the wrapper's own work, native, no NIC (ns per call)")
    print(table(["entries", "per-peer hit", "job-wide", "miss", "record", "fixed",
                 "added/call"], lookup_rows(args.iters, args.repeat)))
    head = ["ibv_modify_qp RTR", "median ns", "mean ns", "added (median)"]
    if args.device:
        print(f"\n(b) the real call on {args.device}, {args.modify_iters} RTR transitions")
        print(table(head, modify_rows(args.device, args.modify_iters)))
    elif args.vm:
        sys.path.insert(0, str(REPO))
        from tests.rig.rxe_vm import run_in_vm

        res = run_in_vm(f"exec {sys.executable} bench/shim.py --iters 1000 --repeat 1 "
                        f"--device rxe0 --modify-iters {args.modify_iters}", repo=REPO)
        if res.rc != 0:
            sys.exit(f"bench in the VM failed:\n{res.output[-3000:]}")
        part = res.output[res.output.index("(b)"):].replace("(b)", "(b) [qemu TCG VM]", 1)
        print("\n" + part.strip())


if __name__ == "__main__":
    main()
