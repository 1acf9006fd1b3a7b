"""`cruxctl status` at 80 columns: agents and jobs as labelled lines, nothing cut."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import termios
from pathlib import Path

from rich.console import Console

from cruxd.cli.status_view import print_status
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.testing import BIN, Daemon, crux_run, status, wait_for


def cluster() -> cpb.ClusterStatus:
    route = cpb.PeerRoute(src_host="gpu-host-0001", peer_host="gpu-host-0002", sport=49153,
                          hops=["leaf-01", "spine-03", "leaf-02"])
    return cpb.ClusterStatus(
        leader_host="h0", levels=4, plan_generation=12,
        agents=[cpb.AgentStatus(host_id=f"gpu-host-000{i}", version="0.1.0", connected=True,
                                gpus=8, addresses=["10.0.0.1", "10.0.1.1"],
                                measurement_source="live", probing_source="sweep",
                                applied_generation=12) for i in (1, 2)],
        jobs=[cpb.JobDecision(job_id="llama-70b-pretrain", state=2, level=3, dscp=26, rank=1,
                              hosts=["gpu-host-0001", "gpu-host-0002"], gpus=16,
                              intensity=2.5e14, k=1.5, routes=[route], qps_applied=32,
                              qps_total=32, measurement=cpb.JobMeasurement(
                                  flops_per_iter=4e15, comm_s=0.21, period_s=0.5,
                                  source="nvml+nccl"))])


def test_eighty_columns_get_lines_not_squeezed_tables() -> None:
    console = Console(width=80, record=True)
    print_status(console, None, cluster(), 0.0)
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "llama-70b-pretrain  scheduled  level 3  DSCP 26  rank 1" in text
    assert "t_j 0.21 s (nccl)" in text and "period 0.5 s" in text
    assert "gpu-host-0001->gpu-host-0002 sport 49153 via leaf-01>spine-03>leaf-02" in text
    assert "gpu-host-0001  connected  v0.1.0  8 GPUs  plan 12" in text
    wide = Console(width=200, record=True)
    print_status(wide, None, cluster(), 0.0)
    assert "┃ job" in wide.export_text()  # wide terminals keep the tables


def test_status_in_an_80_column_terminal(tmp_path: Path) -> None:
    d = Daemon(tmp_path, "h0", {
        "leader": {"listen": "127.0.0.1:0", "profiling_s": 0, "debounce_ms": 10},
        "agent": {"addresses": ["10.1.0.1"], "gpus": 8, "report_interval_s": 0.3}})
    d.start().wait_log(" applied: ")
    job = crux_run(d.socket, "narrow-job", "--flops-per-iter", "1e15")
    try:
        wait_for("the job planned", lambda: [j["state"] for j in status(d.socket)["cluster"]
                                             ["jobs"]] == ["scheduled"], timeout=30)
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        proc = subprocess.Popen([str(BIN / "cruxctl"), "status", "--socket", str(d.socket)],
                                stdout=slave, stderr=slave, env=env)
        os.close(slave)
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        proc.wait(timeout=30)
        os.close(master)
        # one job, explained, from the same daemon
        one = subprocess.run([str(BIN / "cruxctl"), "status", "narrow-job", "--socket",
                              str(d.socket)], capture_output=True, text=True, timeout=30)
        none = subprocess.run([str(BIN / "cruxctl"), "status", "nope", "--socket",
                               str(d.socket)], capture_output=True, text=True, timeout=30)
    finally:
        job.kill()
        job.wait()
        d.stop()
    assert proc.returncode == 0
    text = out.decode()
    import re

    plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text).replace("\r", "")
    assert all(len(line) <= 80 for line in plain.splitlines()), plain
    assert "narrow-job  scheduled  level" in plain, plain
    assert one.returncode == 0, one.stderr
    assert one.stdout.startswith("job narrow-job: scheduled, level"), one.stdout
    assert "applied:" in one.stdout
    assert none.returncode == 2 and "no job 'nope' in the leader's view (jobs: narrow-job)" in (
        none.stderr)
