"""A scenario file run for real on the namespace Clos: the emulated testbed.

`Layout.of(scenario, scale)` maps the scenario's fabric onto `Fabric`: each tier-1
switch becomes a leaf, each tier-2 switch a spine, hosts keep their order, and every
link's rate is multiplied by `scale` (Gbit/s x 1e-3 = Mbit/s at the default). Each job's
bytes are multiplied by the same factor, so its transfer times, and with them its
compute-to-communication ratio, stay those of the profile; compute times are not scaled.

`run_mode` starts the jobs (`tests/rig/ringjob.py`, one process per host of a job) in one
mode and returns their iteration logs:
    standalone  one job at a time, alone on the fabric: the ideal;
    ecmp        all jobs together, no cruxd: the kernel's ECMP picks paths, DSCP 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cruxd.errors import UsageError
from cruxd.model.topology import NodeKind, Topology
from cruxd.scenario import Scenario
from tests.rig.fabric import MAX_HOSTS, MAX_SPINES, Fabric

RING_PORT = 5301  # every rank listens here; one job per host (see Layout.of)
# The ring's TCP, scaled with the fabric (tests/rig/ringjob.py): socket buffers of about
# a scaled link's bandwidth-delay product plus its 32-packet queue (48 KB, 2 ms at 200
# Mbit/s), not the kernel's megabytes; and loss-based cubic, whose sharing of a queue
# comes nearest the simulator's max-min, where this kernel's default bbr overruns it.
RING_SOCKBUF = 64 << 10
RING_TCP_CC = "cubic"
RINGJOB = Path(__file__).with_name("ringjob.py")
Hop = tuple[str, str]  # (src host, dst host) of a ring hop
SpineBytes = dict[str, dict[Hop, list[int]]]  # per job and hop between leaves, per spine


@dataclass(frozen=True)
class EmuJob:
    id: str
    hosts: tuple[str, ...]  # rig host names, ring order
    gpus: int
    compute_s: float
    overlap: float
    hop_bytes: int  # per ring hop and iteration, scaled
    flops: float = 0.0  # W_j, what crux-hints declares
    model_bytes: float = 0.0  # unscaled, what crux-hints declares
    host_gpus: tuple[int, ...] = ()  # GPUs on each host of the ring

    @property
    def hops(self) -> list[tuple[str, str]]:
        """The ring's (src, dst) host pairs, in ring order."""
        return list(zip(self.hosts, self.hosts[1:] + self.hosts[:1], strict=True))


@dataclass(frozen=True)
class Layout:
    leaves: int
    hosts_per_leaf: int
    spines: int
    host_mbit: float
    uplink_mbit: float
    jobs: tuple[EmuJob, ...]
    host_ids: tuple[str, ...] = ()  # the scenario's host of each rig host h0, h1, ...
    spine_ids: tuple[str, ...] = ()  # the scenario's switch of each rig spine
    leaf_ids: tuple[str, ...] = ()  # the scenario's switch of each rig leaf

    @staticmethod
    def of(sc: Scenario, scale: float = 1e-3) -> Layout:
        """The rig that emulates `sc` (UsageError naming what the rig cannot build)."""
        topo = sc.view.topology
        tors, aggs, hosts = _tiers(topo)
        per_leaf = {t: [h for h in hosts if _tor_of(topo, h) == t] for t in tors}
        sizes = {len(v) for v in per_leaf.values()}
        if len(sizes) != 1:
            raise UsageError(f"{sc.name}: the rig needs the same number of hosts under every "
                             f"ToR, got {sorted(sizes)}")
        nics = {len(topo.uplinks(h)) for h in hosts}
        if nics != {1}:
            raise UsageError(f"{sc.name}: the rig gives each host one NIC link, the scenario "
                             f"has {sorted(nics)} (use clos2 with nics_per_host = 1)")
        host_gbps = {topo.links[topo.uplinks(h)[0]].capacity_gbps for h in hosts}
        up = {topo.links[i].capacity_gbps for t in tors for i in topo.out_links.get(t, ())
              if topo.nodes[topo.links[i].dst].kind is NodeKind.SWITCH}
        if len(host_gbps) != 1 or len(up) != 1:
            raise UsageError(f"{sc.name}: the rig needs one host link rate and one uplink "
                             f"rate, got {sorted(host_gbps)} and {sorted(up)}")
        ups = {sum(1 for i in topo.out_links.get(t, ()) if topo.links[i].dst in aggs)
               for t in tors}
        if ups != {len(aggs)}:
            raise UsageError(f"{sc.name}: the rig links every leaf once to every spine")
        if not 1 <= len(aggs) <= MAX_SPINES or len(hosts) > MAX_HOSTS:
            raise UsageError(f"{sc.name}: at most {MAX_SPINES} spines and {MAX_HOSTS} hosts")
        order = [h for t in tors for h in per_leaf[t]]
        host_map = {h: f"h{k}" for k, h in enumerate(order)}
        late = [j.id for j, t in zip(sc.view.jobs, sc.simulation.timing, strict=True)
                if t.arrival_s > 0]
        if late:
            raise UsageError(f"{sc.name}: {', '.join(late)} arrive after the start "
                             f"(arrival_s); the testbed starts every job at once for now")
        jobs = []
        used: dict[str, str] = {}
        for j in sc.view.jobs:
            ring = tuple(h for h, _ in j.hosts)
            for h in ring:
                if h in used:
                    raise UsageError(f"{sc.name}: {h} runs {used[h]} and {j.id}; the rig runs "
                                     f"one job per host (TCP probing covers one port)")
                used[h] = j.id
            hop = max((f.bytes for f in j.flows), default=0.0)
            jobs.append(EmuJob(j.id, tuple(host_map[h] for h in ring), j.gpus, j.compute_s,
                               j.overlap, int(hop * scale), j.flops,
                               # a ring hop carries 2(K-1)/K of the model over K GPUs
                               hop * j.gpus / (2 * max(1, j.gpus - 1)),
                               tuple(g for _, g in j.hosts)))
        return Layout(len(tors), sizes.pop(), len(aggs), host_gbps.pop() * 1e3 * scale,
                      up.pop() * 1e3 * scale, tuple(jobs), tuple(order), tuple(aggs),
                      tuple(tors))

    def leaf_of(self, host: str) -> int:
        """The leaf of a rig host (hosts are numbered leaf by leaf, as Fabric does)."""
        return int(host[1:]) // self.hosts_per_leaf

    def observed_paths(self, carried: SpineBytes) -> dict[str, dict[tuple[str, str], str]]:
        """Per job, the scenario's (src, dst) host pair of every hop between leaves and
        the spine that carried most of its bytes (for cruxd.sim.policies.pinned)."""
        out: dict[str, dict[tuple[str, str], str]] = {}
        for job, hops in carried.items():
            for (a, b), per_spine in hops.items():
                if sum(per_spine) > 0:
                    spine = max(range(len(per_spine)), key=per_spine.__getitem__)
                    out.setdefault(job, {})[(self.host_ids[int(a[1:])],
                                             self.host_ids[int(b[1:])])] = self.spine_ids[spine]
        return out

    def fabric(self, dscp_by_level: tuple[int, ...] = (0,)) -> Fabric:
        return Fabric(hosts_per_leaf=self.hosts_per_leaf, leaves=self.leaves,
                      spines=self.spines, host_mbit=self.host_mbit,
                      uplink_mbit=self.uplink_mbit, dscp_by_level=dscp_by_level,
                      queue_packets=32, goodput=True)


def _tiers(topo: Topology) -> tuple[list[str], list[str], list[str]]:
    tier = {n.id: n.tier for n in topo.nodes.values() if n.kind is NodeKind.SWITCH}
    if set(tier.values()) != {1, 2}:
        raise UsageError(f"{topo.name}: the rig builds two switch tiers (ToR, spine); this "
                         f"fabric has tiers {sorted(set(tier.values()))}")
    return ([s for s, t in tier.items() if t == 1], [s for s, t in tier.items() if t == 2],
            topo.hosts)


def _tor_of(topo: Topology, host: str) -> str:
    tors = {topo.links[i].dst for i in topo.uplinks(host)}
    if len(tors) != 1:
        raise UsageError(f"{topo.name}: {host} links to {sorted(tors)}; the rig hangs each "
                         f"host off one leaf")
    return tors.pop()


# --- running jobs -------------------------------------------------------------------------

def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return env


def start_job(f: Fabric, job: EmuJob, logdir: Path, duration_s: float,
              wrap: dict[str, list[str]] | None = None) -> list[subprocess.Popen[bytes]]:
    """The job's ranks, one per host; `wrap[host]` prefixes a rank's command (crux-run)."""
    peers = ",".join(f"{f.address(h)}:{RING_PORT}" for h in job.hosts)
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
    (nft counters on the sending leaf's uplinks, by addresses and the ring port)."""
    with contextlib.ExitStack() as stack:
        readers: dict[str, dict[Hop, Callable[[], list[int]]]] = {}
        for job in jobs:
            for a, b in job.hops:
                if f.leaf_of(a) != f.leaf_of(b):
                    readers.setdefault(job.id, {})[(a, b)] = stack.enter_context(
                        f.uplink_counts(a, b, None, "tcp", RING_PORT, what="bytes"))
        yield lambda: {j: {hop: read() for hop, read in hops.items()}
                       for j, hops in readers.items()}


Logs = dict[str, list[list[dict[str, float]]]]


def run_mode(layout: Layout, mode: str, workdir: Path, duration_s: float,
             progress: bool = True) -> tuple[Logs, SpineBytes]:
    """Iteration logs per job for `mode` ("standalone" or "ecmp"), times in epoch seconds,
    and the bytes each job's hops put on each spine (ecmp; empty for standalone)."""
    logdir = workdir / mode
    logdir.mkdir(parents=True, exist_ok=True)
    logs: Logs = {}
    carried: SpineBytes = {}
    with layout.fabric() as f:
        if mode == "standalone":
            for job in layout.jobs:
                if progress:
                    print(f"[testbed] standalone: {job.id} alone for {duration_s:g} s",
                          file=sys.stderr, flush=True)
                wait_jobs(start_job(f, job, logdir, duration_s), duration_s + 90)
                logs[job.id] = read_logs(logdir, job)
        elif mode == "ecmp":
            if progress:
                print(f"[testbed] ecmp: {len(layout.jobs)} jobs for {duration_s:g} s",
                      file=sys.stderr, flush=True)
            with spine_bytes(f, layout.jobs) as read:
                procs = [p for job in layout.jobs
                         for p in start_job(f, job, logdir, duration_s)]
                wait_jobs(procs, duration_s + 90)
                carried = read()
            logs = {job.id: read_logs(logdir, job) for job in layout.jobs}
        else:
            raise UsageError(f"unknown mode {mode!r}")
    return logs, carried
