"""Running the emulated testbed's jobs: each job's ranks (`tests/rig/ringjob.py`, one
process per host), their iteration logs, the bytes their hops put on each spine, and the
modes without cruxd:
    standalone  one job at a time, alone on the fabric: the ideal;
    ecmp        all jobs together, no cruxd: the kernel's ECMP picks paths, DSCP 0,
                with jobs arriving and leaving as their scenario entries say.
The crux modes are in tests/rig/testbed_crux.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cruxd.errors import UsageError
from tests.rig.fabric import Fabric
from tests.rig.testbed import EmuJob, Hop, Layout, SpineBytes
from tests.rig.testbed_churn import JobChurn, JobEvent

# The ring's TCP, scaled with the fabric (tests/rig/ringjob.py): socket buffers of about
# a scaled link's bandwidth-delay product plus its 32-packet queue (48 KB, 2 ms at 200
# Mbit/s), not the kernel's megabytes; and loss-based cubic, whose sharing of a queue
# comes nearest the simulator's max-min, where this kernel's default bbr overruns it.
RING_SOCKBUF = 64 << 10
RING_TCP_CC = "cubic"
RINGJOB = Path(__file__).with_name("ringjob.py")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return env


def start_job(f: Fabric, job: EmuJob, logdir: Path, duration_s: float,
              wrap: dict[str, list[str]] | None = None) -> list[subprocess.Popen[bytes]]:
    """The job's ranks, one per host; `wrap[host]` prefixes a rank's command (crux-run)."""
    peers = ",".join(f"{f.address(h)}:{job.port}" for h in job.hosts)
    logdir.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank, host in enumerate(job.hosts):
        log = logdir / f"{job.id}.{rank}.jsonl"
        cmd = [sys.executable, str(RINGJOB), "--rank", str(rank), "--peers", peers,
               "--hop-bytes", str(job.hop_bytes), "--compute-s", str(job.compute_s),
               "--overlap", str(job.overlap), "--duration-s", str(duration_s),
               "--log", str(log), "--sockbuf", str(RING_SOCKBUF), "--tcp-cc", RING_TCP_CC]
        out = (logdir / f"{job.id}.{rank}.out").open("wb")
        procs.append(subprocess.Popen(["ip", "netns", "exec", f.ns(host),
                                       *(wrap or {}).get(host, []), *cmd],
                                      stdout=out, stderr=subprocess.STDOUT, env=_env()))
        out.close()
    return procs


def wait_jobs(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def stop_jobs(procs: list[subprocess.Popen[bytes]], grace_s: float = 5.0) -> None:
    """SIGTERM (a rank ends after its current iteration), then SIGKILL after `grace_s`."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    wait_jobs(procs, grace_s)


def read_logs(logdir: Path, job: EmuJob) -> list[list[dict[str, float]]]:
    """Each rank's iterations, in order."""
    out = []
    for rank in range(len(job.hosts)):
        path = logdir / f"{job.id}.{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        out.append([json.loads(ln) for ln in lines if ln.strip()])
    return out


@contextlib.contextmanager
def spine_bytes(f: Fabric, jobs: tuple[EmuJob, ...]) -> Iterator[Callable[[], SpineBytes]]:
    """While open, count the bytes of every job's ring hops between leaves on each spine
    (nft counters on the sending leaf's uplinks, by addresses and the job's ring port)."""
    with contextlib.ExitStack() as stack:
        readers: dict[str, dict[Hop, Callable[[], list[int]]]] = {}
        for job in jobs:
            for a, b in job.hops:
                if f.leaf_of(a) != f.leaf_of(b):
                    readers.setdefault(job.id, {})[(a, b)] = stack.enter_context(
                        f.uplink_counts(a, b, None, "tcp", job.port, what="bytes"))
        yield lambda: {j: {hop: read() for hop, read in hops.items()}
                       for j, hops in readers.items()}


Logs = dict[str, list[list[dict[str, float]]]]


@dataclass
class ModeRun:
    """What one mode's run leaves: each job's iteration logs (epoch seconds), the bytes
    each job's hops put on each spine, the leader's view of each job when the window
    began (crux modes) and as it ended, the link-down timings, and the jobs' arrivals
    and departures."""

    logs: Logs
    carried: SpineBytes = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    plan_end: dict[str, Any] = field(default_factory=dict)
    link: dict[str, float | None] = field(default_factory=dict)
    events: list[JobEvent] = field(default_factory=list)
    # the leader's re-plan counts as the window began and as it ended (control_counts)
    control: tuple[dict[str, Any], dict[str, Any]] = ({}, {})


class JobProcs:
    """The ranks of the jobs of one run, started and stopped one job at a time, all
    ending at `end_at` (epoch seconds) unless stopped earlier."""

    def __init__(self, f: Fabric, logdir: Path, end_at: float,
                 wrap: Callable[[EmuJob], dict[str, list[str]]] | None = None,
                 owner: list[subprocess.Popen[bytes]] | None = None) -> None:
        self.f, self.logdir, self.end_at, self.wrap = f, logdir, end_at, wrap
        self.owner = owner  # also holds every rank started (killed on any way out)
        self.by_job: dict[str, list[subprocess.Popen[bytes]]] = {}

    def start(self, job: EmuJob) -> None:
        procs = start_job(self.f, job, self.logdir, max(1.0, self.end_at - time.time()),
                          self.wrap(job) if self.wrap else None)
        self.by_job[job.id] = procs
        if self.owner is not None:
            self.owner.extend(procs)

    def stop(self, job: EmuJob) -> None:
        for p in self.by_job.get(job.id, []):
            if p.poll() is None:
                p.terminate()  # the rank ends after its current iteration

    @property
    def all(self) -> list[subprocess.Popen[bytes]]:
        return [p for ps in self.by_job.values() for p in ps]


def run_mode(layout: Layout, mode: str, workdir: Path, duration_s: float,
             warmup_s: float = 0.0, progress: bool = True) -> ModeRun:
    """Iteration logs per job for `mode` ("standalone" or "ecmp") and, for ecmp, the
    bytes each job's hops put on each spine and the jobs' arrivals and departures
    (standalone runs every job alone for the whole duration, churn or not)."""
    logdir = workdir / mode
    logdir.mkdir(parents=True, exist_ok=True)
    with layout.fabric() as f:
        if mode == "standalone":
            logs: Logs = {}
            for job in layout.jobs:
                if progress:
                    print(f"[testbed] standalone: {job.id} alone for {duration_s:g} s",
                          file=sys.stderr, flush=True)
                wait_jobs(start_job(f, job, logdir, duration_s), duration_s + 90)
                logs[job.id] = read_logs(logdir, job)
            return ModeRun(logs)
        if mode != "ecmp":
            raise UsageError(f"unknown mode {mode!r}")
        if progress:
            print(f"[testbed] ecmp: {len(layout.jobs)} jobs for {duration_s:g} s",
                  file=sys.stderr, flush=True)
        launch = time.time()
        jobs = JobProcs(f, logdir, launch + duration_s)
        with spine_bytes(f, layout.jobs) as read:
            for job in layout.jobs:
                if job.arrival_s <= 0:
                    jobs.start(job)
            with JobChurn(layout.jobs, logdir, launch, warmup_s, jobs.start,
                          jobs.stop) as churn:
                time.sleep(max(0.0, jobs.end_at - time.time()))
            wait_jobs(jobs.all, 90)
            carried = read()
        return ModeRun({job.id: read_logs(logdir, job) for job in layout.jobs}, carried,
                       events=churn.events)
