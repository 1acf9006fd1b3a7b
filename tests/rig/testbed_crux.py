"""The testbed's crux modes: a cruxd agent in every host namespace (h0 also leads), the
jobs under `crux-run`, each declaring its ring port (`--tcp-port`), which the agents of its
other hosts probe toward and the leader's routes steer (two jobs on a host: two ports).

`crux`: nothing declared. Each agent measures its jobs live: t_j and the period from the
host's NIC counters, W_j from emulated GPUs (a replay file per host: each job's GPUs busy
compute_s of every standalone period). Every job goes through its
profiling window at the top level, then the leader plans with the profiled figures.

`crux-hints`: each job declares W_j, compute time and model size when it registers
(static measurement, `accept_job_hints`).

`paths-only` and `levels-only` are `crux` with one of its two mechanisms taken away, to
measure each one's share on the kernel's queues (bench/testbed.py says why these ways):
    paths-only   once the plan is in place, every switch port puts all the levels' DSCPs
                 in one class (`Fabric.one_class`): crux's paths, no priorities;
    levels-only  the agents probe toward a port no ring uses (OTHER_PORT) and toward no
                 job's port (`tcp_dports_per_peer = 0`), so the socket interposer gives
                 the ring's connections their level's DSCP and nothing else (a source
                 port selects a path toward the port it was probed with only): the
                 kernel's ports and ECMP, crux's levels.

In all of them, the ranks run under `crux-run` from the start. TCP decisions apply at
connect, so a rank whose decision toward its next rank changes (a profiling window's
level, the plan's ports) has the whole ring rebuilt after the current iteration
(tests/rig/ringjob.py): the way a job that re-creates its communicators would take a new
plan. Utilisation is measured from the moment every job is planned. The switch ports'
queues use the leader's DSCP per level.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from cruxd.scheduler.dscp import level_dscp
from cruxd.testing import BIN, Daemon, running, status, wait_for
from tests.rig.fabric import Fabric
from tests.rig.testbed import RING_PORT, EmuJob, Layout
from tests.rig.testbed_churn import JobChurn, JobEvent, LinkDown, fail_link
from tests.rig.testbed_run import JobProcs, ModeRun, read_logs, spine_bytes, stop_jobs

LEADER_PORT = 7470
PEAK_TFLOPS = 312.0  # the replayed GPUs: A100s
PROFILING_S = 15.0
# A ring rebuilds after its current iteration when its level changes, as its window opens:
# the first seconds of the window hold that gap, and a window that counted it measured
# GPT's bytes per iteration 24 % low (its period 1.24 s), which later read as the job having
# changed and profiled it again. Skip two of GPT's iterations and a rebuild.
SETTLE_S = 3.0
# levels-only: the port the agents probe toward, where nothing listens (a TCP trace ends
# at the peer's RST as well as at a listener's SYN-ACK, probing/tcp_ttl.py); below every
# job's ring port (RING_PORT + k)
OTHER_PORT = RING_PORT - 1
STEERS = {"both": "", "paths": "paths-only", "levels": "levels-only"}  # steer -> mode
REVERIFY_S = 5.0  # probing.interval_s in a link-down run (the default is 300 s)
# The live agents' NIC counter rate: a burst must span two samples to be measured (see
# cruxd/measure/estimate.py); the ResNets' 7 ms bursts do at 250 Hz, not at the default 100.
LIVE_RATE_HZ = 250
BURST_SAMPLES = 3  # the shortest burst of a run spans at least this many samples


def live_rate(layout: Layout) -> float:
    """The agents' sampling rate for a run: LIVE_RATE_HZ, or more where a job's bursts alone
    are shorter than BURST_SAMPLES samples (the multi-job example's ResNets: 6.8 ms, which
    measured 11 ms at 250 Hz)."""
    bursts = [t for j in layout.jobs if (t := comm_s(layout, j)) > 0]
    need = BURST_SAMPLES / min(bursts) if bursts else 0.0
    return float(max(LIVE_RATE_HZ, 50 * math.ceil(need / 50)))


def gpu_recording(path: Path, jobs: list[tuple[EmuJob, int, float]],
                  pids: dict[str, int] | None = None) -> Path:
    """The host's emulated GPUs: each job's (job, its rank here, its standalone period),
    one after the other, busy compute_s of every period, each at the scenario's own FLOP
    rate (W_j / GPUs / compute_s), so that the W_j the agents measure is the W_j that
    crux-hints declares. With `pids` (job id -> its rank's pid here) each job's devices are
    listed under its process, as NVML lists them: a host with two jobs can only tell their
    GPUs apart so. The file is rewritten as jobs start (the replay reads it again)."""
    peaks: list[float] = []
    utils: list[float] = []
    owned: dict[str, list[int]] = {}
    for job, rank, period_s in jobs:
        gpus = job.host_gpus[rank]
        if pids and job.id in pids:
            owned[str(pids[job.id])] = list(range(len(peaks), len(peaks) + gpus))
        peaks += [job.flops / (job.gpus * job.compute_s) / 1e12
                  if job.flops > 0 and job.compute_s > 0 else PEAK_TFLOPS] * gpus
        utils += [100.0 * job.compute_s / period_s] * gpus
    inv = [{"index": i, "name": "NVIDIA A100-SXM4-80GB", "uuid": f"GPU-{i}",
            "pci_bus_id": f"00000000:{i + 1:02x}:00.0", "peak_tflops": peak}
           for i, peak in enumerate(peaks)]
    samples = [{"t": float(t), "util": utils, "pids": owned} for t in range(10)]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"inventory": inv, "samples": samples}))
    tmp.replace(path)  # whole, for a replay that reads it while it plays
    return path


def comm_s(layout: Layout, job: EmuJob) -> float:
    """The job's t_j alone: its ring hop's bytes at the slowest link on its way (the
    rig's rates are payload rates, Fabric(goodput=True))."""
    crosses = any(layout.leaf_of(a) != layout.leaf_of(b) for a, b in job.hops)
    rate = min(layout.host_mbit, layout.uplink_mbit) if crosses else layout.host_mbit
    return job.hop_bytes * 8 / (rate * 1e6)


def standalone_period(layout: Layout, job: EmuJob) -> float:
    """The profile's iteration time alone: compute, plus the ring's transfer beyond
    what the overlap hides."""
    return job.compute_s + max(0.0, comm_s(layout, job) - job.overlap * job.compute_s)


def agent_config(f: Fabric, host: str, root: Path, levels: int,
                 gpu_file: Path | None = None,
                 levels_only: bool = False,
                 rate_hz: float = LIVE_RATE_HZ) -> dict[str, dict[str, Any]]:
    """A host's cruxd: declared profiles (static measurement), or live measurement with
    the replayed GPUs in `gpu_file`; TCP probing toward the jobs' ports, or with
    `levels_only` toward OTHER_PORT alone."""
    leader = f"{f.address('h0')}:{LEADER_PORT}"
    cfg: dict[str, dict[str, Any]] = {
        "daemon": {"roles": ["agent", "leader"] if host == "h0" else ["agent"],
                   "log_level": "info"},
        "agent": {"leader": leader, "leader_token": str(root / "h0" / "state" / "leader.token"),
                  "probing": "sweep", "addresses": [f.address(host)], "gpus": 8,
                  "report_interval_s": 1.0, "measurement": "static",
                  "accept_job_hints": True},
        "probing": {"fabric_prefixes": ["10.2.0.0/15"], "rate_pps": 1000, "timeout_s": 0.3},
    }
    if levels_only:
        cfg["probing"].update(tcp_dport=OTHER_PORT, tcp_dports_per_peer=0)
    if gpu_file is not None:
        cfg["agent"].update(measurement="live", accept_job_hints=False)
        cfg["measurement"] = {"rate_hz": rate_hz, "window_s": 30, "gpu": "replay",
                              "gpu_file": str(gpu_file), "gpu_interval_s": 0.5,
                              "settle_s": SETTLE_S}
    if host == "h0":
        cfg["leader"] = {"listen": leader, "levels": levels,
                         "profiling_s": PROFILING_S if gpu_file is not None else 0,
                         "agent_timeout_s": 15,
                         "insecure_remote": True}  # a lab: plaintext on the rig's fabric
    return cfg


def _hints(layout: Layout, job: EmuJob, rank: int) -> list[str]:
    """What a job declares at registration: this host's share of W_j (the leader sums
    the hosts), its compute time, t_j and iteration time alone (together: its overlap;
    without the period the leader assumed half, and GPT's 0.3 read as slack enough to
    put every BERT above it), and its model size."""
    share = job.host_gpus[rank] / job.gpus if job.gpus else 0.0
    return ["--gpus", str(job.host_gpus[rank]), "--node-rank", str(rank),
            "--nnodes", str(len(job.hosts)), "--flops-per-iter", f"{job.flops * share:g}",
            "--compute-s", f"{job.compute_s:g}", "--comm-s", f"{comm_s(layout, job):g}",
            "--period-s", f"{standalone_period(layout, job):g}",
            "--allreduce-bytes", f"{job.model_bytes:g}"]


def planned(doc: dict[str, Any], jobs: tuple[EmuJob, ...], profiled: bool = False,
            steered: bool = True) -> dict[str, Any] | None:
    """The leader's jobs once each is scheduled with TCP ports toward its own ring port on
    every route (the TCP sweep follows the UDP one, so the leader plans twice; without
    `steered`, levels-only, with probed UDP ports: no job's port is probed), and with
    `profiled`, planned with its profiled measurement (from at least one host: the other
    host of a two-host job sometimes keeps its unprofiled figures, not yet understood)."""
    have = {j["job_id"]: j for j in (doc.get("cluster") or {}).get("jobs", [])}
    for job in jobs:
        j = have.get(job.id)
        if j is None or j.get("state") != "scheduled":
            return None
        sources = str((j.get("measurement") or {}).get("source", "")).split(",")
        if profiled and not {"nvml+nic", "nvml+sock"} & set(sources):
            return None
        routes = j.get("routes", [])
        if len(routes) < len(job.hosts) or not all(
                r.get("tcp_dport") == job.port and r.get("tcp_sports") if steered
                else r.get("sport") for r in routes):
            return None
    return have


def run_crux(layout: Layout, workdir: Path, duration_s: float, levels: int, live: bool,
             warmup_s: float = 0.0, progress: bool = True,
             link_down: LinkDown | None = None, steer: str = "both") -> ModeRun:
    """Iteration logs per job after the plan, the bytes each job's hops put on each spine
    meanwhile, the leader's view of each job (levels, routes, measurement) as the
    window began, with `link_down` when the cable went and how long the leader took to
    re-plan, and the jobs' arrivals and departures with the time each took to plan
    (tests/rig/testbed_churn.py). `steer`: "both" (crux), "paths" (paths-only) or
    "levels" (levels-only), see the module docstring."""
    mode = STEERS[steer] or ("crux" if live else "crux-hints")
    steered = steer != "levels"
    logdir = workdir / mode
    logdir.mkdir(parents=True, exist_ok=True)
    dscp = level_dscp(levels)
    initial = tuple(j for j in layout.jobs if j.arrival_s <= 0)
    with layout.fabric(dscp_by_level=dscp) as f:
        root = workdir / {"crux": "dl", "crux-hints": "dh", "paths-only": "dp",
                          "levels-only": "dv"}[mode]  # short: an agent's socket path is
        # at most 107 bytes, and pytest's temporary directories are long
        root.mkdir(parents=True, exist_ok=True)
        daemons = []
        started: dict[str, dict[str, int]] = {h: {} for h in f.host_names}  # host: job: pid

        def record_gpus(h: str) -> Path:
            return gpu_recording(root / f"{h}.gpus.json", [
                (job, rank, standalone_period(layout, job))
                for job, rank in layout.on_host(h)], started[h])

        for h in f.host_names:
            gpu_file = record_gpus(h) if live else None
            cfg = agent_config(f, h, root, levels, gpu_file, levels_only=not steered,
                               rate_hz=live_rate(layout))
            if link_down is not None:  # re-verify paths often: the failure is found by
                cfg["probing"]["interval_s"] = REVERIFY_S  # the sweep after it
            daemons.append(Daemon(root, h, cfg, netns=f.ns(h)))
        sock = {d.name: d.socket for d in daemons}

        def wrap(job: EmuJob) -> dict[str, list[str]]:
            """crux-run from the start: a rank rebuilds its ring when its decisions change."""
            return {host: [str(BIN / "crux-run"), "--socket", str(sock[host]), "--job-id",
                           job.id, "--tcp-port", str(job.port),
                           *_args(layout, job, rank, live), "--"]
                    for rank, host in enumerate(job.hosts)}

        def leader() -> dict[str, Any]:
            return status(sock["h0"])

        def decided(event: JobEvent, doc: dict[str, Any]) -> bool:
            job = next(j for j in layout.jobs if j.id == event.job)
            if event.kind == "arrive":
                return planned(doc, (job,), profiled=live, steered=steered) is not None
            return not any(j["job_id"] == job.id and j.get("state") == "scheduled"
                           for j in (doc.get("cluster") or {}).get("jobs", []))

        with running(daemons, "agent h") as procs:  # killed on the way out, whatever happens
            jobs = JobProcs(f, logdir, time.time() + 1e6, wrap, owner=procs)

            def start(job: EmuJob) -> None:
                """The job's ranks, and (live) its pids in its hosts' GPU recordings."""
                jobs.start(job)
                for rank, h in enumerate(job.hosts):
                    started[h][job.id] = jobs.by_job[job.id][rank].pid
                    if live:
                        record_gpus(h)

            for job in initial:
                start(job)
            _say(progress, f"{mode}: waiting for the plan (probing"
                 f"{', profiling each job alone' if live else ''}, then planning)")
            t0 = time.monotonic()
            seen: list[dict[str, Any]] = [{}]

            def ready() -> dict[str, Any] | None:
                seen[0] = leader()
                return planned(seen[0], initial, profiled=live, steered=steered)
            try:
                plan = wait_for("every job scheduled with TCP ports", ready, timeout=120 + (
                    len(initial) * PROFILING_S * 2 if live else 0))
            except AssertionError as exc:
                stop_jobs(procs)
                raise AssertionError(f"{exc}; jobs: {summary(seen[0])}") from None
            # the control plane is counted from here: every job profiled and planned; the
            # rings take that plan in the settling below, each after its current iteration
            planned_doc, t_planned = seen[0], time.time()
            at_planned = control_counts(planned_doc)
            if steer == "paths":  # after the profiling windows, which need the top level
                f.one_class()
            # the tables take the plan, then each ring rebuilds after its current iteration
            time.sleep(2.0 + 2 * max(standalone_period(layout, j) for j in initial))
            plan = planned(leader(), initial, steered=steered) or plan
            settled = time.time()
            _say(progress, f"{mode}: planned after {time.monotonic() - t0:.1f} s; measuring "
                 f"{duration_s:g} s")
            link: dict[str, float | None] = {}
            with spine_bytes(f, layout.jobs) as read:
                end = time.time() + duration_s
                with JobChurn(layout.jobs, logdir, settled, warmup_s, start, jobs.stop,
                              leader, decided) as churn:
                    if link_down is not None:
                        link = fail_link(f, link_down, end, leader)
                    time.sleep(max(0.0, end - time.time()))
                carried = read()
            doc = leader()
            final = {j["job_id"]: j for j in (doc.get("cluster") or {}).get("jobs", [])}
            stop_jobs(procs)
            raw = {job.id: read_logs(logdir, job) for job in layout.jobs}
            logs = {jid: [[it for it in rank if it["t0"] >= settled] for rank in ranks]
                    for jid, ranks in raw.items()}
    end_counts = {**control_counts(doc), "rebuilds": rebuilds_since(
        layout, raw, t_planned, planned_doc)}
    return ModeRun(logs, carried, plan, final, link, churn.events, (at_planned, end_counts))


def rebuilds_since(layout: Layout, logs: dict[str, list[list[dict[str, Any]]]], t: float,
                   planned: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Per job, (rebuilds after `t`, epoch s; of those, the ones that took a decision other
    than the one the leader's `planned` status held for that rank's hop): the most any of
    its ranks made (they rebuild together), from each rank's count at the last iteration
    that ended before `t`. A rebuild that took the planned decision is that plan taken an
    iteration late (a ring notices a new decision at its next all-reduce)."""
    held: dict[tuple[str, str, str], tuple[int, list[int], int]] = {}
    for j in (planned.get("cluster") or {}).get("jobs", []):
        for r in j.get("routes", []):
            held[(j["job_id"], r["src_host"], r["peer_host"])] = (
                int(j.get("dscp", 0)), sorted(int(p) for p in r.get("tcp_sports", [])),
                int(r.get("tcp_dport", 0)))
    out = {}
    for job in layout.jobs:
        best = (0, 0)
        for rank, r in enumerate(logs.get(job.id, [])):
            dscp, sports, dport = held.get(
                (job.id, job.hosts[rank], job.hosts[(rank + 1) % len(job.hosts)]), (0, [], 0))
            want = [dscp, sports if dport == job.port else [], dport]  # as the ring sees it
            base = max((it["reconnects"] for it in r if it["end"] <= t), default=0)
            after = [it for it in r if it["end"] > t]
            other = sum(1 for a, b in zip([{"reconnects": base}, *after], after, strict=False)
                        if b["reconnects"] > a["reconnects"]
                        and b.get("rebuilt_to") != want)
            best = max(best, ((r[-1]["reconnects"] - base) if r else 0, other))
        out[job.id] = best
    return out


def control_counts(doc: dict[str, Any]) -> dict[str, Any]:
    """The leader's re-plans by kind of cause, plans that changed nothing, and each job's
    decision changes, from `cruxctl status --json` (uint64 fields come as strings)."""
    cluster = doc.get("cluster") or {}
    return {"generation": int(cluster.get("plan_generation") or 0),
            "replans": {k: int(v) for k, v in (cluster.get("replans") or {}).items()},
            "unchanged": int(cluster.get("plans_unchanged") or 0),
            "changes": {j["job_id"]: int(j.get("decision_changes") or 0)
                        for j in cluster.get("jobs", [])}}


def summary(doc: dict[str, Any]) -> dict[str, str]:
    """Each job's state, measurement source and TCP routes, for a timeout's message."""
    return {j["job_id"]: f"{j.get('state')} {(j.get('measurement') or {}).get('source')} "
            f"routes {len(j.get('routes', []))}, with TCP ports "
            f"{sum(1 for r in j.get('routes', []) if r.get('tcp_sports'))}"
            for j in (doc.get("cluster") or {}).get("jobs", [])}


def _args(layout: Layout, job: EmuJob, rank: int, live: bool) -> list[str]:
    placement = ["--gpus", str(job.host_gpus[rank]), "--node-rank", str(rank),
                 "--nnodes", str(len(job.hosts))]
    return placement if live else _hints(layout, job, rank)


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"[testbed] {msg}", file=sys.stderr, flush=True)
