"""Paced UDP traffic across a Fabric and the rate each flow received."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from tests.rig.fabric import Fabric

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
dst, sport, dport, tos = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
mbit, secs = float(sys.argv[5]), float(sys.argv[6])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
if sport:
    s.bind(("", sport))
size = 1000
gap = size * 8 / (mbit * 1e6)
start = time.monotonic(); n = 0
while (now := time.monotonic()) - start < secs:
    target = start + n * gap
    if target > now:
        time.sleep(target - now)
    s.sendto(bytes(size), (dst, dport)); n += 1
"""


@dataclass(frozen=True)
class Flow:
    src: str
    dst: str
    dport: int  # unique per flow: it names the flow at the receiver
    mbit: float
    sport: int = 0  # 0: the kernel's choice
    dscp: int = 0


def run_flows(f: Fabric, flows: list[Flow], secs: float = 3.0) -> dict[int, float]:
    """Run all flows at once for `secs`; Mbit/s each received, by destination port.
    Queues are expected to be short, so what arrives after the senders stop is small."""
    receivers = {}
    for dst in sorted({fl.dst for fl in flows}):
        ports = ",".join(str(fl.dport) for fl in flows if fl.dst == dst)
        rx = subprocess.Popen(["ip", "netns", "exec", f.ns(dst), sys.executable, "-c", RECEIVE,
                               ports, str(secs + 1.0)], stdout=subprocess.PIPE, text=True)
        assert rx.stdout is not None
        if rx.stdout.readline().strip() != "ready":
            raise RuntimeError(f"receiver on {dst} did not start")
        receivers[dst] = rx
    senders = [subprocess.Popen(["ip", "netns", "exec", f.ns(fl.src), sys.executable, "-c",
                                 SEND, f.address(fl.dst), str(fl.sport), str(fl.dport),
                                 str(fl.dscp << 2), str(fl.mbit), str(secs)]) for fl in flows]
    for s in senders:
        if s.wait(60) != 0:
            raise RuntimeError("a sender failed")
    got: dict[int, float] = {}
    for rx in receivers.values():
        assert rx.stdout is not None
        counts = json.loads(rx.stdout.readline())
        got.update({int(p): b * 8 / secs / 1e6 for p, b in counts.items()})
        rx.wait(30)
    return got
