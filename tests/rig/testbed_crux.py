"""The testbed's crux modes: a cruxd agent in every host namespace (h0 also leads), TCP
probing toward the ring port, and the jobs under `crux-run`.

`crux-hints`: each job declares W_j, compute time and model size when it registers
(static measurement, `accept_job_hints`). Jobs register first with an anchor process per
rank; once the leader has scheduled every job with probed TCP ports on every route, the
ranks start under `crux-run` with the same job id, so their ring connections leave from
decided ports with their level's DSCP (the socket interposer), as a TCP job's do when it
connects after the plan. The switch ports' queues use the leader's DSCP per level.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from cruxd.scheduler.dscp import level_dscp
from cruxd.testing import BIN, Daemon, crux_run, running, status, wait_for
from tests.rig.fabric import Fabric
from tests.rig.testbed import (
    RING_PORT,
    EmuJob,
    Layout,
    Logs,
    SpineBytes,
    read_logs,
    spine_bytes,
    start_job,
    wait_jobs,
)

LEADER_PORT = 7470


def agent_config(f: Fabric, host: str, root: Path, levels: int) -> dict[str, dict[str, Any]]:
    leader = f"{f.address('h0')}:{LEADER_PORT}"
    cfg: dict[str, dict[str, Any]] = {
        "daemon": {"roles": ["agent", "leader"] if host == "h0" else ["agent"],
                   "log_level": "info"},
        "agent": {"leader": leader, "leader_token": str(root / "h0" / "state" / "leader.token"),
                  "probing": "sweep", "addresses": [f.address(host)], "gpus": 8,
                  "report_interval_s": 1.0, "measurement": "static",
                  "accept_job_hints": True},
        "probing": {"fabric_prefixes": ["10.2.0.0/15"], "rate_pps": 1000, "timeout_s": 0.3,
                    "tcp_dport": RING_PORT},
    }
    if host == "h0":
        cfg["leader"] = {"listen": leader, "profiling_s": 0, "levels": levels,
                         "agent_timeout_s": 15,
                         "insecure_remote": True}  # a lab: plaintext on the rig's fabric
    return cfg


def _hints(job: EmuJob, rank: int) -> list[str]:
    return ["--gpus", str(job.host_gpus[rank]), "--node-rank", str(rank),
            "--nnodes", str(len(job.hosts)), "--flops-per-iter", f"{job.flops:g}",
            "--compute-s", f"{job.compute_s:g}", "--allreduce-bytes", f"{job.model_bytes:g}"]


def planned(doc: dict[str, Any], jobs: tuple[EmuJob, ...]) -> dict[str, Any] | None:
    """The leader's jobs once each is scheduled with TCP ports toward the ring port on
    every route (the TCP sweep follows the UDP one, so the leader plans twice)."""
    have = {j["job_id"]: j for j in (doc.get("cluster") or {}).get("jobs", [])}
    for job in jobs:
        j = have.get(job.id)
        if j is None or j.get("state") != "JOB_STATE_SCHEDULED":
            return None
        routes = j.get("routes", [])
        if len(routes) < len(job.hosts) or not all(
                r.get("tcp_dport") == RING_PORT and r.get("tcp_sports") for r in routes):
            return None
    return have


def run_crux_hints(layout: Layout, workdir: Path, duration_s: float, levels: int,
                   progress: bool = True) -> tuple[Logs, SpineBytes, dict[str, Any]]:
    """Iteration logs per job, the bytes each job's hops put on each spine, and the
    leader's view of each job (levels, routes) when the ranks started."""
    logdir = workdir / "crux-hints"
    logdir.mkdir(parents=True, exist_ok=True)
    dscp = level_dscp(levels)
    with layout.fabric(dscp_by_level=dscp) as f:
        root = workdir / "daemons"
        daemons = [Daemon(root, h, agent_config(f, h, root, levels), netns=f.ns(h))
                   for h in f.host_names]
        sock = {d.name: d.socket for d in daemons}
        with running(daemons, "agent h") as anchors:
            for job in layout.jobs:
                for rank, host in enumerate(job.hosts):
                    anchors.append(crux_run(sock[host], job.id, *_hints(job, rank),
                                            command=("sleep", "100000")))
            if progress:
                print("[testbed] crux-hints: waiting for the plan (probing, then planning)",
                      file=sys.stderr, flush=True)
            t0 = time.monotonic()
            plan = wait_for("every job scheduled with TCP ports",
                            lambda: planned(status(sock["h0"]), layout.jobs), timeout=180)
            if progress:
                print(f"[testbed] crux-hints: planned after {time.monotonic() - t0:.1f} s; "
                      f"jobs for {duration_s:g} s", file=sys.stderr, flush=True)
            with spine_bytes(f, layout.jobs) as read:
                procs = []
                for job in layout.jobs:
                    wrap = {host: [str(BIN / "crux-run"), "--socket", str(sock[host]),
                                   "--job-id", job.id, *_hints(job, rank), "--"]
                            for rank, host in enumerate(job.hosts)}
                    procs += start_job(f, job, logdir, duration_s, wrap)
                wait_jobs(procs, duration_s + 90)
                carried = read()
            logs = {job.id: read_logs(logdir, job) for job in layout.jobs}
    return logs, carried, plan
