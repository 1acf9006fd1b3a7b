"""Scenario and topology files for `cruxctl plan` / `simulate` are input like any other
(issue 37, item 10): regular files of bounded size only, bounded nesting and fabric size,
a clear error (exit 2) and none of the file's content in it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import cruxd.model.topology as topology
from cruxd.errors import ScenarioError
from cruxd.scenario.load import load_scenario
from cruxd.testing import BIN

JOB = {"id": "a", "hosts": [["h0", 8]], "compute_s": 1, "flops": 1e15}


def _scenario(tmp_path: Path, fabric: object, name: str = "s.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"topology": fabric, "jobs": [JOB]}))
    return path


def test_devices_and_fifos_are_refused_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fabric.json"
    os.mkfifo(fifo)
    for target in ("/dev/zero", str(fifo)):
        with pytest.raises(ScenarioError, match="not a regular file"):
            load_scenario(target)
        with pytest.raises(ScenarioError, match="not a regular file"):
            load_scenario(_scenario(tmp_path, {"file": target}))


def test_deep_nesting_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    for name in ("deep.json", "deep.yaml"):
        path = tmp_path / name
        path.write_text("[" * 100_000)
        with pytest.raises(ScenarioError, match=r"nested too deeply|invalid"):
            load_scenario(path)


def test_a_fabric_past_the_builder_bounds_stops_at_them(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topology, "MAX_NODES", 1_000)  # the real bound: 200,000 nodes
    huge = {"builder": "clos2", "tors": 10**6, "aggs": 4, "hosts_per_tor": 10**3}
    with pytest.raises(ScenarioError, match="more than 1,000 nodes"):
        load_scenario(_scenario(tmp_path, huge))
    monkeypatch.setattr(topology, "MAX_LINKS", 100)
    with pytest.raises(ScenarioError, match="more than 100 links"):
        load_scenario(_scenario(tmp_path, {"builder": "clos2", "tors": 2, "aggs": 2,
                                           "hosts_per_tor": 1, "links_per_agg": 10**9}))


def test_no_content_of_the_file_in_the_error(tmp_path: Path) -> None:
    """A file that is not a scenario (a password database, say): the error names the file
    and what is wrong, and quotes none of it; exit 2."""
    secret = "root:$y$j9T$s3cr3tHash:19000:0:99999:7:::"
    for name, text in (("a.yaml", f"{secret}\n"), ("b.yaml", f"{secret}\n{secret} x\n- y\n"),
                       ("c.json", secret), ("d.yaml", f"key: [{secret}\n"), ("e.json", "NaN"),
                       ("f.yaml", f"topology: {secret}\n")):
        path = tmp_path / name
        path.write_text(text)
        run = subprocess.run([str(BIN / "cruxctl"), "plan", str(path)], capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 2, run.stderr
        assert "s3cr3t" not in run.stderr and str(path) in run.stderr
