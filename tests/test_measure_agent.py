"""Measurements flow from the agents' live sources to the leader through a profiling window:
cruxd agent processes on the namespace fabric sample their hosts' real netdev counters while a
synthetic two-host job (quiet compute, UDP bursts of known length) runs; the GPUs are played
back from a recording (no GPU here). The leader profiles the new job, then schedules it with
the measured period, t_j and W_j."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cruxd.testing import BIN, Daemon, cruxctl, running, status, wait_for
from tests.rig.fabric import Fabric, can_build

pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(can_build() is not None, reason=str(can_build()))]

REPO = Path(__file__).resolve().parent.parent
LEADER = "10.2.0.2:7470"  # h0 runs both roles
PERIOD, BURST = 0.5, 0.15
UTIL, PEAK, GPUS = 60.0, 312.0, 2


def recording(path: Path) -> Path:
    """Two GPUs busy 60 % of the time, no process list (the agent's only job gets them)."""
    inv = [{"index": i, "name": "NVIDIA A100-SXM4-80GB", "uuid": f"GPU-{i}",
            "pci_bus_id": f"00000000:{i + 1:02x}:00.0", "peak_tflops": PEAK} for i in range(GPUS)]
    samples = [{"t": float(t), "util": [UTIL] * GPUS, "pids": {}} for t in range(10)]
    path.write_text(json.dumps({"inventory": inv, "samples": samples}))
    return path


def config(f: Fabric, host: str, gpu_file: Path, root: Path) -> dict[str, dict[str, Any]]:
    cfg: dict[str, dict[str, Any]] = {
        "daemon": {"roles": ["agent", "leader"] if host == "h0" else ["agent"]},
        "agent": {"leader": LEADER, "leader_token": str(root / "h0" / "state" / "leader.token"),
                  "probing": "none", "addresses": [f.address(host)],
                  "gpus": GPUS, "report_interval_s": 0.5, "measurement": "live"},
        "measurement": {"rate_hz": 100, "window_s": 6, "gpu": "replay",
                        "gpu_file": str(gpu_file), "gpu_interval_s": 0.5, "settle_s": 0.5},
    }
    if host == "h0":
        cfg["leader"] = {"listen": LEADER, "profiling_s": 8, "levels": 4,
                         "agent_timeout_s": 10,
                         "insecure_remote": True}  # a lab: plaintext on the rig's fabric
    return cfg


def job_view(doc: dict[str, Any]) -> dict[str, Any] | None:
    jobs = {j["job_id"]: j for j in (doc.get("cluster") or {}).get("jobs", [])}
    return jobs.get("j")


def test_agents_measure_job_in_profiling_window_and_leader_plans_with_it(
        tmp_path: Path) -> None:
    gpu_file = recording(tmp_path / "gpus.json")
    with Fabric(hosts_per_leaf=1, leaves=2, spines=1) as f:
        daemons = [Daemon(tmp_path, h, config(f, h, gpu_file, tmp_path), netns=f.ns(h))
                   for h in ("h0", "h1")]
        with running(daemons, "live measurement: 1 counter(s)") as jobs:
            for rank, (host, peer) in enumerate((("h0", "h1"), ("h1", "h0"))):
                jobs.append(subprocess.Popen(
                    ["ip", "netns", "exec", f.ns(host), str(BIN / "crux-run"), "--socket",
                     str(daemons[rank].socket), "--job-id", "j", "--gpus", str(GPUS),
                     "--node-rank", str(rank), "--nnodes", "2", "--", sys.executable, "-m",
                     "tests.rig.bursts", f.address(peer), str(PERIOD), str(BURST), "40",
                     "400"], cwd=REPO, stderr=subprocess.PIPE))
            states: list[str] = []

            def scheduled_after_profiling() -> dict[str, Any] | None:
                j = job_view(status(daemons[0].socket))
                if j is None:
                    return None
                if not states or states[-1] != j["state"]:
                    states.append(j["state"])
                done = "profiling" in states and j["state"] == "scheduled"
                return j if done else None

            j = wait_for("the job profiled, then scheduled", scheduled_after_profiling,
                         timeout=60)
            m = j["measurement"]
            print(f"states {states}; measured {m}")
            assert m["source"] == "nvml+nic"  # profiled figures, not the unprofiled ones
            assert abs(m["period_s"] - PERIOD) <= 0.02 * PERIOD
            assert abs(m["comm_s"] - BURST) <= 0.10 * BURST
            # W_j: both hosts' 2 GPUs x 60 % x 312 TFLOPS over each iteration
            want = 2 * GPUS * UTIL / 100 * PEAK * 1e12 * PERIOD
            assert abs(m["flops_per_iter"] - want) <= 0.03 * want
            assert j["intensity"] > 0
            local = status(daemons[1].socket)["agent"]
            assert local["measurement_source"] == "live (nvml+nic)"
            assert "profiling done: j" in daemons[0].log_text()
            # the bursts' measured rate is the job's path bandwidth in the hints: paced at
            # 40 Mbit/s of payload, plus the headers the NIC counter sees
            run = cruxctl("hints", "--format", "bandwidth", socket_path=daemons[0].socket)
            assert run.returncode == 0, run.stderr
            paths = json.loads(run.stdout)["paths"]
            assert {(p["src"], p["dst"]) for p in paths} == {("h0", "h1"), ("h1", "h0")}
            profiled = [s["gbps"] for p in paths for s in p["samples"] if s["profiled"]]
            assert profiled and all(0.038 <= g <= 0.046 for g in profiled), profiled
            # each agent reports its port: 0.041 Gbit/s bursts (above) on a 10 Gbit/s veth are
            # 0.41 % of the line, and 0.123 % over whole iterations (0.15 s of every 0.5 s)
            utils: list[float] = []

            def reported_ports() -> bool:
                agents = status(daemons[0].socket)["cluster"]["agents"]
                ports = {a["host_id"]: a.get("links", []) for a in agents}
                assert {h: [lk["link"] for lk in ls] for h, ls in ports.items()} == {
                    "h0": ["net:eth0"], "h1": ["net:eth0"]}
                utils.extend(lk.get("utilization", 0.0) for ls in ports.values() for lk in ls)
                return len(utils) >= 20

            wait_for("ports reported", reported_ports, timeout=30, every=0.25)
            print(f"port utilisation per report: median {np.median(utils):.5f}, "
                  f"max {max(utils):.5f}")
            assert all(u <= 0.0045 for u in utils), utils
            assert 0.0010 <= float(np.median(utils)) <= 0.0015, utils
            text = cruxctl("status", socket_path=daemons[0].socket)
            assert text.returncode == 0, text.stderr
            assert "NIC ports" in text.stdout and "net:eth0" in text.stdout, text.stdout
