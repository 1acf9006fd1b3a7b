"""Two jobs on one host pair, measured apart: cruxd agents on the namespace fabric sample
their NIC counters and, per job, the bytes each job's processes send (the TCP interposer's
records, which crux-run loads into every rank), while two synthetic TCP jobs of different
periods and burst lengths run on the same two hosts at once. The NIC counters mix both jobs;
the leader must still plan each with its own period and t_j.

GPUs are played back per host, one device per job, listed under the job's pid (with two
jobs and no process list W_j stays unknown and neither job could be scheduled): each rank
starts first, held before it execs crux-run until the agents run with a recording that
names it (`ip netns exec`, the shell, crux-run and the job keep one pid)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cruxd.testing import BIN, Daemon, running, status, wait_for
from tests.rig.fabric import Fabric, can_build
from tests.test_measure_agent import PEAK, UTIL, config

pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(can_build() is not None, reason=str(can_build()))]

REPO = Path(__file__).resolve().parent.parent
# job: (listening port, period s, burst s, Mbit/s while bursting, iterations)
JOBS = {"ja": (5401, 0.5, 0.15, 40, 400), "jb": (5402, 0.3, 0.06, 60, 660)}
HOSTS = (("h0", "h1"), ("h1", "h0"))  # (host, its peer) by rank


def recording(path: Path, pids: dict[int, int]) -> Path:
    """One device per job process (pid -> device), each busy UTIL % of the time."""
    inv = [{"index": i, "name": "NVIDIA A100-SXM4-80GB", "uuid": f"GPU-{i}",
            "pci_bus_id": f"00000000:{i + 1:02x}:00.0", "peak_tflops": PEAK}
           for i in range(len(pids))]
    samples = [{"t": float(t), "util": [UTIL] * len(pids),
                "pids": {str(p): [d] for p, d in pids.items()}} for t in range(10)]
    path.write_text(json.dumps({"inventory": inv, "samples": samples}))
    return path


def test_two_tcp_jobs_on_one_host_pair_are_planned_with_their_own_period_and_t_j(
        tmp_path: Path) -> None:
    with Fabric(hosts_per_leaf=1, leaves=2, spines=1) as f:
        held: list[subprocess.Popen[bytes]] = []
        pids: dict[str, dict[int, int]] = {h: {} for h, _ in HOSTS}
        sockets = {h: tmp_path / h / "run" / "agent.sock" for h, _ in HOSTS}
        for d, (job, (port, period, burst, mbit, iters)) in enumerate(JOBS.items()):
            for rank, (host, peer) in enumerate(HOSTS):
                run = [str(BIN / "crux-run"), "--socket", str(sockets[host]), "--job-id", job,
                       "--gpus", "1", "--node-rank", str(rank), "--nnodes", "2", "--",
                       sys.executable, "-m", "tests.rig.tcpbursts", f.address(peer), str(port),
                       str(period), str(burst), str(mbit), str(iters)]
                p = subprocess.Popen(
                    ["ip", "netns", "exec", f.ns(host), "sh", "-c", 'read go && exec "$@"',
                     "sh", *run], cwd=REPO, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
                held.append(p)
                pids[host][p.pid] = d
        daemons = [Daemon(tmp_path, h, config(f, h, recording(tmp_path / f"gpus-{h}.json",
                                                              pids[h]), tmp_path),
                          netns=f.ns(h)) for h, _ in HOSTS]
        assert [d.socket for d in daemons] == list(sockets.values())
        with running(daemons, "live measurement: 1 counter(s)") as procs:
            procs.extend(held)  # killed on the way out (before: they wait on stdin's EOF)
            for p in held:
                assert p.stdin is not None
                p.stdin.write(b"go\n")
                p.stdin.close()
            states: dict[str, list[str]] = {j: [] for j in JOBS}

            def both_scheduled_after_profiling() -> dict[str, Any] | None:
                jobs = {j["job_id"]: j
                        for j in (status(daemons[0].socket).get("cluster") or {}).get("jobs", [])}
                for jid, seen in states.items():
                    j = jobs.get(jid)
                    if j is not None and (not seen or seen[-1] != j["state"]):
                        seen.append(j["state"])
                done = all("profiling" in seen and seen[-1] == "scheduled"
                           for seen in states.values())
                return jobs if done else None

            try:
                jobs = wait_for("both jobs profiled, then scheduled",
                                both_scheduled_after_profiling, timeout=120)
            except AssertionError:
                print(f"states {states}")
                for d in daemons:
                    print("\n".join(ln for ln in d.log_text().splitlines()
                                    if "grpc" not in ln)[-8000:])
                for p in held:
                    if p.poll() is not None and p.stderr is not None:
                        print(f"job process exited {p.returncode}: {p.stderr.read()!r}")
                raise
            print(f"states {states}")
            for d in daemons:
                print("\n".join(ln for ln in d.log_text().splitlines() if " profiled from " in ln))
            for jid, (_, period, burst, _, _) in JOBS.items():
                m = jobs[jid]["measurement"]
                print(f"{jid}: period {m['period_s']:.4f} s (true {period}, "
                      f"{m['period_s'] / period - 1:+.1%}), t_j {m['comm_s']:.4f} s (true {burst}, "
                      f"{m['comm_s'] / burst - 1:+.1%}), source {m['source']}")
            for jid, (_, period, burst, _, _) in JOBS.items():
                m = jobs[jid]["measurement"]
                assert m["source"] == "nvml+sock", m  # profiled from the job's own bytes
                assert abs(m["period_s"] - period) <= 0.02 * period, (jid, m)
                assert abs(m["comm_s"] - burst) <= 0.10 * burst, (jid, m)
                # W_j: each host's one device x 60 % x 312 TFLOPS over the job's own period
                want = 2 * UTIL / 100 * PEAK * 1e12 * period
                assert abs(m["flops_per_iter"] - want) <= 0.05 * want, (jid, m)
            log = daemons[1].log_text()
            assert "per-job byte counters from sock" in log
            assert "profiling done: ja" in daemons[0].log_text()
            assert "profiling done: jb" in daemons[0].log_text()
