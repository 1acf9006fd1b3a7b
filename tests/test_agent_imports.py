"""An agent-only cruxd loads only what its configured sources use (issue 19: the idle agent's
RSS went from 45 to 85 MB when numpy and scapy, with cryptography, came in through imports).

Each case starts and stops the daemon's agent role in a fresh interpreter and reads its
sys.modules; the RSS and CPU figures themselves are bench/agent_idle.py's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cruxd.testing import free_port, toml

REPO = Path(__file__).resolve().parent.parent

# start the agent role as cruxd.daemon.main does, stop it, print the loaded modules
SCRIPT = """
import asyncio, json, sys
from pathlib import Path
from cruxd.config.parse import load_config
from cruxd.daemon.main import Daemon
from cruxd.daemon.notify import Notifier

async def main() -> None:
    d = Daemon(load_config(Path(sys.argv[1])), None, Notifier(None))
    d.preflight()
    await d.start()
    assert d.agent is not None and d.leader is None
    await asyncio.sleep(0.2)
    await d.shutdown()

asyncio.run(main())
print(json.dumps(sorted(sys.modules)))
"""

# not for an agent whatever its sources: the leader's planner and solvers, the CLI's tables;
# the etcd client only where [leader] ha = "etcd" (not in these configurations)
NEVER = ("scipy", "scapy", "cryptography", "rich", "yaml", "aetcd", "cruxd.leader.service",
         "cruxd.leader.etcd", "cruxd.scheduler.planner", "cruxd.hints", "cruxd.sim")


def loaded(tmp_path: Path, extra: dict[str, dict[str, Any]]) -> set[str]:
    agent = {"leader": f"127.0.0.1:{free_port()}", "addresses": ["10.1.0.1"], "gpus": 8,
             "leader_token": str(tmp_path / "leader.token"), **extra.pop("agent", {})}
    conf = tmp_path / "cruxd.toml"
    conf.write_text(toml({
        "daemon": {"roles": ["agent"], "host_id": "h0", "state_dir": str(tmp_path / "state"),
                   "runtime_dir": str(tmp_path / "run"), "log_level": "warning"},
        "agent": agent, "metrics": {"listen": ""}, **extra}))
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(conf)], capture_output=True,
                         text=True, timeout=60, cwd=REPO)
    assert run.returncode == 0, run.stderr
    return set(json.loads(run.stdout.splitlines()[-1]))


def under(modules: set[str], *roots: str) -> list[str]:
    return sorted(m for m in modules for r in roots if m == r or m.startswith(r + "."))


def test_default_agent_loads_neither_numpy_nor_scapy(tmp_path: Path) -> None:
    """Static measurement and paths (the defaults): no numpy, no probing stack."""
    modules = loaded(tmp_path, {})
    assert "cruxd.agent.core" in modules
    assert under(modules, "numpy", "cruxd.agent.measuring", "cruxd.agent.sweeper",
                 "probing.int_md", *NEVER) == []


@pytest.mark.parametrize("probing", ["none", "static"])
def test_live_measurement_loads_numpy_but_not_the_prober(tmp_path: Path, probing: str) -> None:
    modules = loaded(tmp_path, {"agent": {"measurement": "live", "probing": probing},
                                "measurement": {"gpu": "none", "interfaces": ["lo"]}})
    assert "numpy" in modules and "cruxd.agent.measuring" in modules
    assert under(modules, "cruxd.agent.sweeper", "probing.int_md", *NEVER) == []


def test_a_sweeping_agent_loads_the_probers_but_not_scapy(tmp_path: Path) -> None:
    """probing = "sweep" loads the INT-MD codec, which is plain struct: scapy stays a test
    dependency (tests/int_scapy.py), never an agent's."""
    modules = loaded(tmp_path, {"agent": {"probing": "sweep"},
                                "probing": {"method": "int", "fabric_prefixes": ["10.1.0.0/16"],
                                            "responder_port": free_port()}})
    assert "cruxd.agent.sweeper" in modules and "probing.int_md" in modules
    assert under(modules, *NEVER) == []
