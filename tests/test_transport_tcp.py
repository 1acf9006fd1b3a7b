"""The TCP backend: a connection leaves from the decided source port and its packets
carry the decided DSCP (classified by a real u32 dsfield filter on the rig's leaf);
without a usable decision it is an ordinary connection."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rig.fabric import Fabric, can_build
from transport.decision_table import Decision, TableWriter
from transport.tcp import Steering, set_dscp, steering_for

SERVER = """
import json, socket
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("", 7000)); srv.listen(1); print("ready", flush=True)
conn, peer = srv.accept(); got = 0
while (chunk := conn.recv(65536)):
    got += len(chunk)
print(json.dumps({"peer": list(peer), "bytes": got}), flush=True)
"""

CLIENT = """
import sys
from transport.tcp import Steering, connect
s = connect(sys.argv[1], 7000, Steering(int(sys.argv[2]), int(sys.argv[3])))
s.sendall(bytes(300_000)); s.close()
"""


def test_steering_from_a_real_table_and_failing_open(tmp_path: Path) -> None:
    path = tmp_path / "decisions"
    with TableWriter.open(path, capacity=16) as w:
        w.apply([Decision("job", None, 1, 26, 104, 0, 3),
                 Decision("job", "10.2.1.2", 1, 26, 104, 50001, 3)], 3)
    assert steering_for(str(path), "job", "10.2.1.2") == Steering(50001, 26, traffic_class=104)
    assert steering_for(str(path), "job", "10.2.9.9") == Steering(0, 26, traffic_class=104)
    assert "no decision" in steering_for(str(path), "other", "10.2.1.2").reason
    assert "decision table" in steering_for(str(tmp_path / "none"), "job", "x").reason
    (tmp_path / "garbage").write_bytes(b"\x00" * 100)
    assert steering_for(str(tmp_path / "garbage"), "job", "10.2.1.2").sport == 0
    with socket.socket() as s, pytest.raises(ValueError):
        set_dscp(s, 64)


@pytest.mark.root
@pytest.mark.skipif(can_build() is not None, reason=str(can_build()))
@pytest.mark.parametrize(("sport", "dscp", "cls"), [(50001, 40, "1:11"), (50002, 8, "1:10")])
def test_tcp_leaves_from_the_decided_port_with_the_decided_dscp(
        sport: int, dscp: int, cls: str) -> None:
    with Fabric(hosts_per_leaf=1, leaves=2, spines=1) as f:
        f.priority_queues("l1", "h1", 100.0, dscp_by_level=[8, 40])
        before = f.class_bytes("l1", "h1")
        srv = subprocess.Popen(["ip", "netns", "exec", f.ns("h1"), sys.executable, "-c",
                                SERVER], stdout=subprocess.PIPE, text=True)
        assert srv.stdout is not None and srv.stdout.readline().strip() == "ready"
        cli = f.exec("h0", sys.executable, "-c", CLIENT, f.address("h1"), str(sport),
                     str(dscp))
        assert cli.returncode == 0, cli.stderr
        doc = json.loads(srv.stdout.readline())
        srv.wait(30)
        after = f.class_bytes("l1", "h1")
    assert doc == {"peer": [f.address("h0"), sport], "bytes": 300_000}
    other = "1:10" if cls == "1:11" else "1:11"
    assert after[cls] - before[cls] >= 300_000  # every data byte classified by its DSCP
    assert after[other] - before[other] < 10_000, (before, after)
