"""bench/testbed.py's ablation modes without the rig: what each one sets up so that it
runs one of crux's mechanisms only. paths-only's switch side (Fabric.one_class) is
tested on the rig in tests/test_fabric_qos.py; that the socket interposer gives a
connection to a port other than the decision's tcp_dport its class and nothing else,
which levels-only rests on, in tests/test_sock_interposer.py
(test_class_only_for_an_unprobed_port_or_a_bound_socket)."""

from __future__ import annotations

import importlib
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.paths import REPO
from tests.rig.fabric import Fabric
from tests.rig.ringjob import Decisions
from tests.rig.testbed import RING_PORT
from tests.rig.testbed_crux import OTHER_PORT, agent_config, planned
from transport.decision_table import Decision, TableWriter

PEER = "10.2.4.2"


@pytest.fixture
def testbed(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """bench/testbed.py as a module (it imports its neighbours in bench/ by name)."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    return importlib.import_module("testbed")


def _publish(path: Path, generation: int, dscp: int, dport: int, sports: list[int]) -> None:
    with TableWriter.open(path, capacity=16) as w:
        w.apply([Decision("j", PEER, 1, dscp, dscp << 2, 0, generation, tcp_dport=dport,
                          tcp_sports=tuple(sports))], plan_generation=generation)


def _carrying(dscp: int) -> tuple[socket.socket, socket.socket]:
    """A connected loopback TCP socket with this class (and its listener)."""
    lst = socket.create_server(("127.0.0.1", 0))
    s = socket.socket()
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
    s.connect(lst.getsockname())
    return s, lst


def test_a_ring_rebuilds_only_for_a_decision_its_connection_does_not_carry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """levels-only: the agents probe toward OTHER_PORT, so the decided ports do not apply
    to the ring's connections (to RING_PORT) and a re-plan that moves them must not make
    the ring reconnect (each reconnect is a fresh draw of the kernel's ports). Toward the
    ring's own port the ports count, but only where the connection's own port is not
    among them: a re-plan that keeps the path (and so the port) rebuilds nothing."""
    table = tmp_path / "decisions"
    _publish(table, 1, 10, OTHER_PORT, [40001, 40002])
    monkeypatch.setenv("CRUX_DECISION_TABLE", str(table))
    monkeypatch.setenv("CRUX_JOB_ID", "j")
    ring = Decisions(PEER, RING_PORT)
    assert ring.at_connect == (10, (), OTHER_PORT)
    sock, lst = _carrying(10)
    with sock, lst:
        _publish(table, 2, 10, OTHER_PORT, [40003])
        assert not ring.changed(sock)
        _publish(table, 3, 18, OTHER_PORT, [40003])
        assert ring.changed(sock)  # a new class
    # toward the ring's own port (crux, paths-only) the ports are part of the decision
    toward = Decisions(PEER, OTHER_PORT)
    assert toward.at_connect == (18, (40003,), OTHER_PORT)
    sock, lst = _carrying(18)
    with sock, lst:
        own = sock.getsockname()[1]
        _publish(table, 4, 18, OTHER_PORT, [40004])
        assert toward.changed(sock)  # another path: its port is not ours
        _publish(table, 5, 18, OTHER_PORT, [40004, own])
        assert not toward.changed(sock)  # our port is among them: the same path
        _publish(table, 6, 18, OTHER_PORT, [40003])
        assert not toward.changed(sock)  # the decision we connected on: ports were busy


def test_levels_only_agents_probe_a_port_the_rings_do_not_use(tmp_path: Path) -> None:
    assert OTHER_PORT < RING_PORT  # every job's ring port is RING_PORT + k
    for host in ("h0", "h1"):
        cfg = agent_config(Fabric(), host, tmp_path, 3, levels_only=True)
        assert cfg["probing"]["tcp_dport"] == OTHER_PORT
        assert cfg["probing"]["tcp_dports_per_peer"] == 0  # and toward no job's port
    # crux's modes probe toward the ports the jobs declare (crux-run --tcp-port) alone
    assert "tcp_dport" not in agent_config(Fabric(), "h1", tmp_path, 3)["probing"]


def test_a_plan_counts_as_ready_only_with_ports_toward_each_jobs_own_port() -> None:
    from tests.rig.testbed import EmuJob
    a = EmuJob("a", ("h0", "h1"), 8, 1.0, 0.3, 1000, port=RING_PORT)
    b = EmuJob("b", ("h0", "h1"), 8, 1.0, 0.3, 1000, port=RING_PORT + 1)

    def doc(port_a: int, port_b: int, sports: list[int]) -> dict[str, object]:
        return {"cluster": {"jobs": [
            {"job_id": j, "state": "scheduled",
             "routes": [{"sport": 49152, "tcp_dport": p, "tcp_sports": sports}] * 2}
            for j, p in (("a", port_a), ("b", port_b))]}}
    assert planned(doc(RING_PORT, RING_PORT + 1, [40001]), (a, b)) is not None
    assert planned(doc(RING_PORT, RING_PORT, [40001]), (a, b)) is None  # b's is a's port
    assert planned(doc(RING_PORT, RING_PORT + 1, []), (a, b)) is None  # not probed yet
    # levels-only waits for the probed paths alone: no job's port is probed there
    assert planned(doc(RING_PORT, RING_PORT + 1, []), (a, b), steered=False) is not None


def test_paths_only_is_replayed_on_one_level_the_others_on_the_plans(
        testbed: ModuleType) -> None:
    jobs = {"gpt": {"level": 2}, "bert": {"level": 0}, "new": {}}
    assert testbed.replayed_levels("paths-only", jobs) is None  # Pinned: all on level 0
    for mode in ("crux", "crux-hints", "levels-only"):
        assert testbed.replayed_levels(mode, jobs) == {"gpt": 2, "bert": 0, "new": 0}


def test_the_ablations_are_modes_each_run_as_live_crux_with_one_mechanism(
        testbed: ModuleType) -> None:
    assert {"paths-only", "levels-only"} <= set(testbed.MODES)
    assert testbed.STEER == {"paths-only": "paths", "levels-only": "levels"}
    assert set(testbed.SIM_POLICY) == set(testbed.MODES)


def test_an_unknown_mode_is_refused_naming_every_mode() -> None:
    run = subprocess.run([sys.executable, str(REPO / "bench" / "testbed.py"),
                          str(REPO / "examples" / "testbed-pair-rig.json"), "--mode",
                          "ecmp,paths"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "unknown paths" in run.stderr and "paths-only, levels-only" in run.stderr


def test_the_simulators_own_ablations_keep_their_mechanism(testbed: ModuleType) -> None:
    """paths-only is crux-full on one level, levels-only crux's levels on ECMP: on the
    oversubscribed example each lies between ECMP and crux-full, as the simulator
    predicted when the example was made (docs/benchmarks.md)."""
    from cruxd.scenario import load_scenario
    sim = testbed.simulated(load_scenario(REPO / "examples" / "testbed-oversub-rig.json"),
                            30.0)
    u = {k: v["utilization"] for k, v in sim.items()}
    for mode in ("paths-only", "levels-only"):
        assert u["ecmp"] < u[mode] < u["crux-full"], u
