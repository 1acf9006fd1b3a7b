"""The rig's emulated switch queues: through a congested, rate-limited port, traffic
marked with the higher level's DSCP keeps its rate while the lower level is
squeezed -- the mechanism the leader's levels rely on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.rig.fabric import Fabric, can_build

pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(can_build() is not None, reason=str(can_build()))]

RECEIVE = """
import json, select, socket, sys, time
ports, secs = [int(p) for p in sys.argv[1].split(",")], float(sys.argv[2])
socks = {}
for p in ports:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    s.bind(("", p))
    socks[s] = p
got = {p: 0 for p in ports}
print("ready", flush=True)
end = time.monotonic() + secs
while (left := end - time.monotonic()) > 0:
    for s in select.select(list(socks), [], [], left)[0]:
        got[socks[s]] += len(s.recv(65536))
print(json.dumps(got), flush=True)
"""

SEND = """
import socket, sys, time
dst, port, tos = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mbit, secs = float(sys.argv[4]), float(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
size = 1000
gap = size * 8 / (mbit * 1e6)
start = time.monotonic(); n = 0
while (now := time.monotonic()) - start < secs:
    target = start + n * gap
    if target > now:
        time.sleep(target - now)
    s.sendto(bytes(size), (dst, port)); n += 1
"""


def test_higher_dscp_keeps_its_rate_through_a_congested_port() -> None:
    rate, secs = 8.0, 3.0  # Mbit/s at leaf 1's port toward h1; each sender offers 6
    with Fabric(hosts_per_leaf=1, leaves=2, spines=1) as f:
        f.priority_queues("l1", "h1", rate, dscp_by_level=[8, 40])
        rx = subprocess.Popen(["ip", "netns", "exec", f.ns("h1"), sys.executable, "-c",
                               RECEIVE, "5001,5002", str(secs + 1.5)],
                              stdout=subprocess.PIPE, text=True)
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        senders = [subprocess.Popen(["ip", "netns", "exec", f.ns("h0"), sys.executable, "-c",
                                     SEND, f.address("h1"), str(port), str(dscp << 2), "6",
                                     str(secs)])
                   for port, dscp in ((5001, 8), (5002, 40))]
        for s in senders:
            assert s.wait(30) == 0
        got = json.loads(rx.stdout.readline())
        rx.wait(30)
    low, high = (got["5001"] * 8 / secs / 1e6, got["5002"] * 8 / secs / 1e6)
    print(f"through {rate} Mbit/s: high level {high:.2f}, low level {low:.2f} Mbit/s")
    # the high level gets (nearly) all it offers; the low level gets what is left
    assert high > 0.8 * 6, (high, low)
    assert low < 0.5 * 6 and high > 2 * low, (high, low)
    assert high + low <= rate * 1.15, (high, low)
