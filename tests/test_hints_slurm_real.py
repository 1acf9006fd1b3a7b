"""Slurm's own parser reads our topology.conf: slurmctld runs in the foreground on a
generated slurm.conf (auth/none, private ports and state directory) and
`scontrol show topology` must echo back the tree we wrote.

Needs the Debian packages `slurmctld` and `slurm-client` (22.05 in bookworm)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from cruxd.hints import slurm
from cruxd.hints.fabric_view import FabricView, build_view
from cruxd.topo.builders import clos2, double_sided, testbed96

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("slurmctld") is None or shutil.which("scontrol") is None,
                       reason="needs slurmctld and scontrol (apt: slurmctld slurm-client)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _slurm_conf(tmp: Path, view: FabricView) -> str:
    return "\n".join([
        "ClusterName=cruxtest",
        f"SlurmctldHost={socket.gethostname().split('.')[0]}",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        "AuthType=auth/none",  # no munge daemon needed
        "CredType=cred/none",
        "SlurmUser=root",
        "MpiDefault=none",
        "MailProg=/bin/true",
        f"StateSaveLocation={tmp / 'state'}",
        f"SlurmctldPidFile={tmp / 'slurmctld.pid'}",
        "TopologyPlugin=topology/tree",
        "SchedulerType=sched/builtin",
        "SelectType=select/linear",
        "ProctrackType=proctrack/linuxproc",
        f"NodeName={slurm.compress(view.hosts)} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN",
        "PartitionName=all Nodes=ALL Default=YES State=UP",
    ]) + "\n"


def _scontrol_topology(tmp: Path, view: FabricView) -> tuple[str, str]:
    (tmp / "state").mkdir()
    (tmp / "slurm.conf").write_text(_slurm_conf(tmp, view))
    (tmp / "topology.conf").write_text(slurm.topology_conf(view))
    env = {**os.environ, "SLURM_CONF": str(tmp / "slurm.conf")}
    log = (tmp / "slurmctld.out").open("w")
    ctld = subprocess.Popen(["slurmctld", "-D", "-c", "-i"], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and ctld.poll() is None:
            run = subprocess.run(["scontrol", "show", "topology"], env=env, text=True,
                                 capture_output=True, timeout=10)
            if run.returncode == 0 and run.stdout.strip():
                return run.stdout, (tmp / "slurmctld.out").read_text()
            time.sleep(0.1)
        pytest.fail("slurmctld did not answer:\n" + (tmp / "slurmctld.out").read_text())
    finally:
        ctld.terminate()
        try:
            ctld.wait(timeout=10)
        except subprocess.TimeoutExpired:
            ctld.kill()
            ctld.wait()
        log.close()
    raise AssertionError("unreachable")


@pytest.mark.parametrize("topo", [
    pytest.param(lambda: double_sided(hosts_per_pod=4), id="double_sided"),
    pytest.param(lambda: clos2(tors=3, aggs=2, hosts_per_tor=2), id="clos2"),
    pytest.param(testbed96, id="testbed96"),
])
def test_slurmctld_reads_topology_conf(tmp_path: Path, topo: object) -> None:
    view = build_view(topo())  # type: ignore[operator]
    shown, log = _scontrol_topology(tmp_path, view)
    for bad in ("fatal", "lack access", "lookup failure", "Parsing error", "invalid child"):
        assert bad not in log, log
    ours: dict[str, tuple[set[str], set[str]]] = {}
    for line in slurm.topology_conf(view).splitlines():
        if line.startswith("SwitchName="):
            f = dict(tok.split("=", 1) for tok in line.split())
            ours[f["SwitchName"]] = (set(slurm.expand(f.get("Nodes", ""))),
                                     set(slurm.expand(f.get("Switches", ""))))
    theirs: dict[str, tuple[set[str], set[str]]] = {}
    for line in shown.splitlines():
        f = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        nodes = set(slurm.expand(f.get("Nodes", "")))
        theirs[f["SwitchName"]] = (nodes, set(slurm.expand(f.get("Switches", ""))))
    assert set(theirs) == set(ours)
    for name, (nodes, children) in ours.items():
        assert theirs[name][1] == children
        if nodes:  # leaves: exactly our nodes; inner switches show the union below them
            assert theirs[name][0] == nodes
    assert set().union(*(n for n, _ in theirs.values())) == set(view.hosts)
