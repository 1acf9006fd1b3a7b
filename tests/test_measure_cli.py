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
