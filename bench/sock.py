"""TCP interposer benchmark: what libcrux_sock.so adds to a job's connect().

Protocol (shim/bench/bench_sock.c). Each run alternates the two variants it compares, iteration by
iteration, in one process (on a VM the drift between runs is larger than the difference), and
prints both medians over ITERS; a figure here is the median of --repeat runs. The table holds
ENTRIES live entries with the measured job's two last, so an uncached lookup scans it all.
  (a) The decision path alone: socket() + crux_sock_steer(127.0.0.1:PORT) + close() against
      socket() + close(). crux_sock_steer is everything the wrapped connect() does before the
      real call: SO_PROTOCOL and getsockname on the socket, the lookup (cached per peer until
      the table's generation moves), IP_TOS, the bind of a probed port, the outcome counter.
      Rows: `applied` (TOS + bind), `tos-only` (the destination port was not probed),
      `no-entry` (another job id). `applied` includes the bind and the unbind at close; in a
      real connect the bind replaces the kernel's own port search, so (b) is the honest total.
  (b) The real call: socket() + connect() to a listener on loopback + close (SO_LINGER 0),
      libc's connect against the interposer's, under LD_PRELOAD with a 64-entry table; rows
      by what the interposer does (CRUX_SOCK=0: the wrapper alone).
  (c) A send: libc's send() against the interposer's on a TCP connection over loopback that a
      thread drains, per call (batches of 32, alternated), BYTES payload. Rows: `counted` (the
      connection is counted: CRUX_SOCK_LOOPBACK=1, as a job's connection to a peer host is;
      the bit test and two atomic adds to the record), `not counted` (the loopback connection
      left out: the bit test alone), CRUX_SOCK=0, and write() to /dev/null (a descriptor that
      is no connection: what every other write of the job pays).

    .venv/bin/python bench/sock.py [--iters N] [--repeat R] [--send-bytes B]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from _make import BUILD, ensure_built

# bench/ is on sys.path when run as a script
from tables import preamble, table

from transport import native
from transport.decision_table import Decision, TableWriter

SIZES = (2, 64, 1024)
JOB = "bench"
SPORTS = tuple(range(46001, 46009))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_table(path: Path, entries: int, dport: int) -> None:
    """`entries` live entries: other jobs first, then this job's per-peer and job-wide."""
    others = [Decision(f"other-{i}", None, 1, 26, 104, 0, 1) for i in range(entries - 2)]
    with TableWriter.open(path, capacity=max(entries, 2)) as w:
        w.apply([*others, Decision(JOB, "127.0.0.1", 2, 46, 184, 0, 1, dport, SPORTS),
                 Decision(JOB, None, 2, 46, 184, 0, 1)], 1)


def run(args: list[str], env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([str(BUILD / "bench_sock"), *args], capture_output=True, text=True,
                         check=True, env=env).stdout
    return {k: float(v) for k, v in (kv.split("=") for kv in out.split())}


def added(args: list[str], env: dict[str, str], repeat: int, outcome: int | None = None
          ) -> tuple[float, float]:
    """(median base ns, median added ns) over `repeat` runs."""
    runs = [run(args, env) for _ in range(repeat)]
    if outcome is not None:  # the path we meant to time is the one that ran
        assert all(r["outcome"] == outcome for r in runs), runs
    return (statistics.median(r["base_ns"] for r in runs),
            statistics.median(r["with_ns"] - r["base_ns"] for r in runs))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20_000, help="iterations per variant and run")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--send-bytes", type=int, default=64, help="payload per send in (c)")
    ap.add_argument("--only-send", action="store_true", help="(c) alone")
    args = ap.parse_args(argv)
    preamble()
    ensure_built(BUILD / "bench_sock", "sock")
    lib = str(native.library(native.SOCK))
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith("CRUX_") and k != "LD_PRELOAD"}
    n, r = str(args.iters), args.repeat
    if args.only_send:
        sends(lib, base_env, n, r, args.send_bytes)
        return
    with tempfile.TemporaryDirectory() as d:
        dport, rows = free_port(), []
        env = {**base_env, "CRUX_JOB_ID": JOB, "CRUX_QP_DIR": d}
        other = {**env, "CRUX_JOB_ID": "nobody"}
        for entries in SIZES:
            path = Path(d) / f"t{entries}"
            make_table(path, entries, dport)
            env["CRUX_DECISION_TABLE"] = other["CRUX_DECISION_TABLE"] = str(path)
            steer = ["steer", n, str(dport), lib]
            base, applied = added(steer, env, r, 0)
            tos = added(["steer", n, str(dport + 1), lib], env, r, 1)[1]
            miss = added(steer, other, r, 5)[1]
            rows.append([entries, f"{base:,.0f}", f"{applied:,.0f}", f"{tos:,.0f}",
                         f"{miss:,.0f}"])
        print("\n(a) the decision path alone: ns added to socket()+close() (base)")
        print(table(["entries", "base ns", "applied", "tos-only", "no-entry"], rows))

        env["CRUX_DECISION_TABLE"] = other["CRUX_DECISION_TABLE"] = str(Path(d) / "t64")
        pre = {"LD_PRELOAD": lib}
        rows = []
        for name, e, port in (("CRUX_SOCK=0", {**env, **pre, "CRUX_SOCK": "0"}, dport),
                              ("no-entry", {**other, **pre}, dport),
                              ("tos-only", {**env, **pre}, dport + 1),
                              ("applied", {**env, **pre}, dport)):
            base, add = added(["connect", n, str(port)], e, r)
            rows.append([name, f"{base:,.0f}", f"{add:,.0f}"])
    print(f"\n(b) the real call: socket()+connect()+close() on loopback, 64 entries, {n} per "
          "variant and run")
    print(table(["interposer", "libc connect ns", "added ns"], rows))
    sends(lib, base_env, n, r, args.send_bytes)


def sends(lib: str, base_env: dict[str, str], n: str, r: int, size: int) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        env = {**base_env, "LD_PRELOAD": lib, "CRUX_JOB_ID": JOB, "CRUX_QP_DIR": d,
               "CRUX_DECISION_TABLE": str(Path(d) / "none")}
        for name, mode, e in (
                ("counted", "send", {**env, "CRUX_SOCK_LOOPBACK": "1"}),
                ("not counted", "send", env),
                ("CRUX_SOCK=0", "send", {**env, "CRUX_SOCK": "0"}),
                ("write /dev/null", "write", env)):
            base, add = added([mode, n, str(size)], e, r)
            rows.append([name, f"{base:,.0f}", f"{add:,.0f}"])
    print(f"\n(c) a send of {size} bytes: ns per call added to libc's, {n} calls per variant "
          "and run")
    print(table(["connection", "libc ns", "added ns"], rows))


if __name__ == "__main__":
    main()
