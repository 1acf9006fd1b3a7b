"""What crux-run's wait for a job's first decision costs a job's start.

A job is `sh -c 'date +%s.%N'`: the time it prints, less the time crux-run was started, is
how long the job took to start. Three ways, each --runs times, every job with a new id:

  none     the job alone (no crux-run): the floor
  nowait   crux-run --wait-s 0: registration and exec, the job's decision may come later
  wait     crux-run as it is: registration, the wait for the decision, exec

on two setups:

  embedded   one cruxd with both roles on loopback (the embedded default's shape)
  remote     (root) a namespace fabric of two leaves: the job's agent on h1, its leader on
             h0, three switch hops away; single-host jobs, and two-host jobs whose other
             rank already runs on h0 (the later of a job's ranks to start)

The leader's defaults stand (debounce 50 ms, profiling on): the wait covers the profiling
slot. "decision" is what crux-run --verbose says the wait took.

    .venv/bin/python bench/job_start.py [--runs 20] [--setups embedded,remote] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tables import preamble, table  # bench/ is on sys.path when run as a script

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.rig

from cruxd.testing import BIN, Daemon, crux_run, free_port, running

MODES = ("none", "nowait", "wait")
JOB = ("sh", "-c", "date +%s.%N")


def start_once(prefix: list[str], mode: str, socket: Path, job: str,
               extra: tuple[str, ...]) -> tuple[float, float | None]:
    """(ms from starting the command to the job's first line, ms the wait took or None)."""
    cmd = [*prefix, *JOB]
    if mode != "none":
        cmd = [*prefix, str(BIN / "crux-run"), "--socket", str(socket), "--job-id", job,
               "--verbose", *extra, *(["--wait-s", "0"] if mode == "nowait" else []),
               "--", *JOB]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
    began = float(r.stdout.split()[0])
    m = re.search(r"after ([0-9.]+) ms", r.stderr)
    if mode == "wait" and (m is None or "warning" in r.stderr):
        raise SystemExit(f"crux-run did not get job {job}'s decision: {r.stderr.strip()}")
    return (began - t0) * 1e3, float(m[1]) if m else None


def measure(name: str, prefix: list[str], socket: Path, runs: int,
            extra: tuple[str, ...] = (), job_prefix: str = "j") -> list[dict[str, object]]:
    rows = []
    for mode in MODES:
        starts, waits = [], []
        for i in range(runs):
            start, waited = start_once(prefix, mode, socket, f"{job_prefix}-{mode}-{i}", extra)
            starts.append(start)
            if waited is not None:
                waits.append(waited)
        print(f"  {name} {mode}: {runs} starts", file=sys.stderr, flush=True)
        rows.append({"setup": name, "mode": mode, "runs": runs,
                     "start_median_ms": statistics.median(starts),
                     "start_max_ms": max(starts),
                     "decision_median_ms": statistics.median(waits) if waits else None,
                     "decision_max_ms": max(waits) if waits else None})
    return rows


@contextmanager
def embedded(root: Path) -> Iterator[tuple[list[str], Path]]:
    port = free_port()
    d = Daemon(root, "h0", {"daemon": {"roles": ["agent", "leader"]},
                            "agent": {"leader": f"127.0.0.1:{port}", "gpus": 8},
                            "leader": {"listen": f"127.0.0.1:{port}"}})
    with running([d], "agent h0"):
        yield [], d.socket


def remote(root: Path, runs: int) -> list[dict[str, object]]:
    from tests.rig.fabric import Fabric
    from tests.test_probing_agents import agent_config

    with Fabric(hosts_per_leaf=1, leaves=2, spines=2) as f:
        daemons = []
        for h in ("h0", "h1"):
            cfg = agent_config(f, h, root)
            cfg["probing"]["rate_pps"] = 200
            if h == "h0":  # the bench's leader keeps its defaults, as a cluster's would
                cfg["leader"].pop("profiling_s")
            daemons.append(Daemon(root, h, cfg, netns=f.ns(h)))
        with running(daemons, "agent h") as anchors:
            prefix = ["ip", "netns", "exec", f.ns("h1")]
            rows = measure("remote, 1 host", prefix, daemons[1].socket, runs, ("--gpus", "8"),
                           "single")
            two = ("--gpus", "8", "--nnodes", "2", "--node-rank", "1", "--flops-per-iter",
                   "1e12", "--allreduce-bytes", "1e9", "--compute-s", "1")
            for mode in ("nowait", "wait"):
                anchors += [crux_run(daemons[0].socket, f"pair-{mode}-{i}", "--gpus", "8",
                                     "--nnodes", "2", "--node-rank", "0")
                            for i in range(runs)]
            time.sleep(2)  # the h0 ranks reported; the h1 ranks then complete each job
            rows += measure("remote, 2nd of 2 hosts", prefix, daemons[1].socket, runs, two,
                            "pair")
            return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--setups", default="embedded,remote")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    setups = args.setups.split(",")
    preamble(f"kernel {os.uname().release}")
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="crux-start-") as d:
        root = Path(d)
        if "embedded" in setups:
            with embedded(root / "embedded") as (prefix, sock):
                rows += measure("embedded", prefix, sock, args.runs)
        if "remote" in setups:
            if os.geteuid() != 0:
                print("# remote: skipped, needs root (network namespaces)")
            else:
                rows += remote(root / "remote", args.runs)
    if args.json:
        print(json.dumps(rows, indent=2))
        return

    def ms(v: object) -> str:
        return "-" if v is None else f"{float(str(v)):.1f}"

    print(table(("setup", "mode", "runs", "start median ms", "start max ms",
                 "decision median ms", "decision max ms"),
                [(r["setup"], r["mode"], r["runs"], ms(r["start_median_ms"]),
                  ms(r["start_max_ms"]), ms(r["decision_median_ms"]),
                  ms(r["decision_max_ms"])) for r in rows]))


if __name__ == "__main__":
    main()
