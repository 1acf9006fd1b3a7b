"""`cruxctl measure` without a daemon: inputs checked up front, a recording round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cruxd.cli.cruxctl import main

FIXTURES = Path(__file__).parent / "fixtures"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["measure", "--sysfs", str(FIXTURES / "sysfs"), "--window", "1",
               "--rate", "20", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize(("args", "message"), [
    (("--gpu", "replay"), "--gpu replay needs --gpu-file"),
    (("--gpu", "none", "--gpu-file", "x.json"), "only used with --gpu replay"),
    (("--interface", "eth9"), "no such interface under"),
    (("--rate", "0"), "--rate must be 1..1000"),
    (("--window", "0.1"), "at least 16 samples"),
    (("--gpu", "replay", "--gpu-file", str(FIXTURES / "sysfs")), "not a GPU recording"),
])
def test_bad_input_is_one_clear_line(capsys: pytest.CaptureFixture[str], args: tuple[str, ...],
                                     message: str) -> None:
    rc, out, err = run(capsys, *args)
    assert rc == 2 and message in err and out == ""


def test_fixture_counters_and_replayed_gpus_recorded_again(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rec = tmp_path / "again.json"
    rc, out, _ = run(capsys, "--gpu", "replay", "--gpu-file",
                     str(FIXTURES / "gpu_recording.json"), "--record", str(rec), "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["counters"] == ["net:eth0", "rdma:mlx5_0/1"]
    assert doc["gpus"] == ["NVIDIA H100 80GB HBM3"] * 2
    assert doc["estimate"] is None  # the fixture's counters never move: no period
    again = json.loads(rec.read_text())
    original = json.loads((FIXTURES / "gpu_recording.json").read_text())
    assert again["inventory"] == original["inventory"]
    assert again["samples"] == original["samples"][:len(again["samples"])]
    rc, out, _ = run(capsys, "--no-rdma", "--gpu", "none")
    assert rc == 0 and "net:eth0 at 20 Hz" in out and "no bursts" in out


def test_progress_shows_on_a_terminal_and_nowhere_else(tmp_path: Path) -> None:
    """A person at a terminal sees the window go by (stderr, a pty here); a script's pipe
    gets the result alone."""
    import os
    import pty
    import subprocess
    import sys

    cmd = [str(Path(sys.executable).parent / "cruxctl"), "measure", "--sysfs",
           str(FIXTURES / "sysfs"), "--window", "2", "--rate", "20", "--gpu", "none", "--json"]
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, text=True)
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(master)
    assert proc.returncode == 0
    assert b"sampling 2 counter(s)" in seen and b"/2 s" in seen
    assert json.loads(out)["window_s"] >= 2  # stdout: the JSON alone
    piped = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0 and piped.stderr == ""
