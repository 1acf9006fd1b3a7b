"""Job registrations against a real agent (with its leader in the same cruxd): N jobs
registering at once, the way a launcher starts every rank of a host together, and N
registering one after another.

Each registration is the exchange `crux-run` makes (`cruxd.rpc.local.LocalClient`, its
3 s timeout), from threads of this process. It prints the latency percentiles, how many
were refused or timed out (crux-run then runs the job without crux), and whether the
host stayed admitted at the leader.

    .venv/bin/python bench/registration.py [--jobs 1000] [--json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import tempfile
import time
from pathlib import Path

# bench/ is on sys.path when run as a script
from tables import preamble, table

from cruxd.testing import Daemon, status

TIMEOUT_S = 3.0  # crux-run's
ERRORS: set[str] = set()


def _register(socket_path: Path, job: str) -> tuple[float, str]:
    from cruxd.errors import CruxError
    from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
    from cruxd.rpc.local import LocalClient

    t0 = time.perf_counter()
    try:
        reply = LocalClient(socket_path, timeout=TIMEOUT_S).call(apb.LocalRequest(
            register=apb.RegisterJob(job_id=job, gpus=1, nnodes=1)))
    except CruxError as exc:
        if "did not answer" in str(exc):
            return time.perf_counter() - t0, "timeout"
        ERRORS.add(str(exc))
        return time.perf_counter() - t0, "error"
    outcome = "refused" if reply.WhichOneof("body") == "error" else "ok"
    return time.perf_counter() - t0, outcome


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")


def _round(d: Daemon, jobs: list[str], workers: int) -> dict[str, object]:
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda j: _register(d.socket, j), jobs))
    wall = time.perf_counter() - t0
    lat = [t for t, _ in results]
    counts = {k: sum(1 for _, o in results if o == k) for k in ("ok", "refused", "timeout",
                                                                 "error")}
    return {"jobs": len(jobs), "wall_s": round(wall, 2), "per_s": round(len(jobs) / wall),
            "p50_ms": round(_pct(lat, 0.5), 1), "p99_ms": round(_pct(lat, 0.99), 1),
            "max_ms": round(max(lat) * 1e3, 1), **counts}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1000, help="registrations per run (1000)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = p.parse_args()
    if not args.json:
        preamble()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(Path(tmp), "h1", {
            "daemon": {"roles": ["agent", "leader"], "log_level": "info"},
            "agent": {"max_jobs": 4096}, "leader": {"max_jobs_per_host": 4096}}).start()
        try:
            d.wait_log(" applied: ", timeout=30)
            rows["concurrent"] = _round(d, [f"c{i}" for i in range(args.jobs)], args.jobs)
            rows["sequential"] = _round(d, [f"s{i}" for i in range(args.jobs)], 1)
            time.sleep(2.0)  # one report interval: the host must still be admitted
            doc = status(d.socket)
            admitted = d.name in {a.get("host_id") for a in doc["cluster"].get("agents", [])}
            jobs_seen = len(doc["cluster"].get("jobs", []))
        finally:
            d.stop()
    if args.json:
        print(json.dumps({"runs": rows, "host_admitted": admitted, "leader_jobs": jobs_seen}))
        return 0
    cols = ["jobs", "wall_s", "per_s", "p50_ms", "p99_ms", "max_ms", "ok", "refused",
            "timeout", "error"]
    print(table(["run", *cols], [[k, *(v[c] for c in cols)] for k, v in rows.items()]))
    for e in sorted(ERRORS):
        print(f"error: {e}")
    print(f"host still admitted at the leader: {admitted}; jobs the leader holds: {jobs_seen}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
