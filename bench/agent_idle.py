"""What an idle agent costs its host: RSS and CPU of a real `cruxd` agent process.

Protocol
  * One leader (`roles = ["leader"]`) and one agent (`roles = ["agent"]`, the rest of its
    configuration the defaults: static measurement, static probing with no path table,
    8 GPUs declared, one RoCE address that no netdev holds), separate processes on loopback;
    the agent connects and applies the leader's first plan.
  * "idle": after --settle-s, the agent's VmRSS (/proc/PID/status) every second and its
    utime + stime (/proc/PID/stat) over --seconds; CPU is the share of one core.
  * "1 job": `crux-run --job-id j1 -- sleep 600` registers a job, which the leader plans;
    after --settle-s the same sampling again.
  * Also whether the agent has numpy, scipy or cryptography (which scapy pulls in) mapped:
    their shared objects in /proc/PID/maps. The target (issue 19): < 60 MB, < 1 % of a core.
  --measurement live adds [measurement] gpu = "none", interfaces = ["lo"]: the NIC sampler
  thread runs at the default 100 Hz; --metrics serves the agent's metrics on loopback.

    .venv/bin/python bench/agent_idle.py [--seconds 20] [--settle-s 3] [--measurement live]
        [--metrics] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# bench/ is on sys.path when run as a script
from tables import preamble, table

from cruxd.testing import Daemon, crux_run, free_port

HEAVY = {"numpy": "/numpy/", "scipy": "/scipy/", "cryptography": "/cryptography/"}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def mapped(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        maps = f.read()
    return ",".join(name for name, where in HEAVY.items() if where in maps) or "-"


def sample(pid: int, seconds: float) -> dict[str, object]:
    rss: list[int] = []
    c0, t0 = cpu_s(pid), time.monotonic()
    while time.monotonic() - t0 < seconds:
        rss.append(status_kb(pid, "VmRSS"))
        time.sleep(min(1.0, max(0.0, seconds - (time.monotonic() - t0))))
    c1, t1 = cpu_s(pid), time.monotonic()
    return {"rss_mb": round(rss[-1] / 1024, 1), "rss_max_mb": round(max(rss) / 1024, 1),
            "cpu_pct": round(100 * (c1 - c0) / (t1 - t0), 2),
            "threads": status_kb(pid, "Threads"), "heavy_libs": mapped(pid)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0, help="sampling time per row (20)")
    p.add_argument("--settle-s", type=float, default=3.0, help="wait before sampling (3)")
    p.add_argument("--measurement", choices=("static", "live"), default="static")
    p.add_argument("--metrics", action="store_true", help="agent serves metrics on loopback")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = p.parse_args()
    if not args.json:
        preamble()
    port = free_port()
    agent_cfg: dict[str, object] = {"leader": f"127.0.0.1:{port}", "addresses": ["10.1.0.1"],
                                    "gpus": 8, "measurement": args.measurement}
    rows: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        leader = Daemon(root, "leader", {"daemon": {"roles": ["leader"], "log_level": "info"},
                                         "leader": {"listen": f"127.0.0.1:{port}",
                                                    "profiling_s": 0}}, die_with_parent=True)
        agent_cfg["leader_token"] = str(leader.root / "state" / "leader.token")
        sections: dict[str, dict[str, object]] = {
            "daemon": {"roles": ["agent"], "log_level": "info"}, "agent": agent_cfg}
        if args.measurement == "live":
            sections["measurement"] = {"gpu": "none", "interfaces": ["lo"]}
        if args.metrics:
            sections["metrics"] = {"listen": "127.0.0.1:0"}
        agent = Daemon(root, "h0", sections, die_with_parent=True)
        job = None
        try:
            leader.start().wait_log("leader listening")
            agent.start().wait_log(" applied: ")
            assert agent.proc is not None
            pid = agent.proc.pid
            time.sleep(args.settle_s)
            rows["idle"] = sample(pid, args.seconds)
            job = crux_run(agent.socket, "j1", die_with_parent=True)
            agent.wait_log("job j1 registered")
            time.sleep(args.settle_s)
            rows["1 job (sleep 600)"] = sample(pid, args.seconds)
            rows["leader, 1 job"] = sample(leader.proc.pid, 2.0) if leader.proc else {}
        finally:
            if job is not None:
                job.kill()
                job.wait()
            agent.stop()
            leader.stop()
    if args.json:
        print(json.dumps({"rows": rows, "measurement": args.measurement,
                          "metrics": args.metrics, "seconds": args.seconds}))
        return 0
    cols = ["rss_mb", "rss_max_mb", "cpu_pct", "threads", "heavy_libs"]
    print(table(["process", *cols], [[k, *(v.get(c, "") for c in cols)]
                                     for k, v in rows.items()]))
    print("cpu_pct: share of one core over the row's sampling time (the leader's: 2 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
