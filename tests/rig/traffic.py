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
got = {}
print("ready", flush=True)
end = time.monotonic() + secs
while (left := end - time.monotonic()) > 0:
    for s in select.select(list(socks), [], [], left)[0]:
        data, (addr, sport) = s.recvfrom(65536)
        key = f"{socks[s]} {addr} {sport}"
        got[key] = got.get(key, 0) + len(data)
print(json.dumps(got), flush=True)
"""

SEND = """
import socket, sys, time
dst, sport, dport, tos = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
mbit, secs = float(sys.argv[5]), float(sys.argv[6])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
s.bind(("", sport))
print(s.getsockname()[1], flush=True)
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
    mbit: float
    sport: int = 0  # 0: the kernel's choice
    dscp: int = 0
    dport: int = 4791  # the data's port: ECMP hashes it, so probed ports hold only for it


def run_flows(f: Fabric, flows: list[Flow], secs: float = 3.0) -> list[float]:
    """Run all flows at once for `secs`; Mbit/s each received, in the order given
    (the receiver tells flows apart by source address and port). Queues are
    expected to be short, so what arrives after the senders stop is small."""
    receivers = {}
    for dst in sorted({fl.dst for fl in flows}):
        ports = ",".join(sorted({str(fl.dport) for fl in flows if fl.dst == dst}))
        rx = subprocess.Popen(["ip", "netns", "exec", f.ns(dst), sys.executable, "-c", RECEIVE,
                               ports, str(secs + 1.0)], stdout=subprocess.PIPE, text=True)
        assert rx.stdout is not None
        if rx.stdout.readline().strip() != "ready":
            raise RuntimeError(f"receiver on {dst} did not start")
        receivers[dst] = rx
    senders = [subprocess.Popen(["ip", "netns", "exec", f.ns(fl.src), sys.executable, "-c",
                                 SEND, f.address(fl.dst), str(fl.sport), str(fl.dport),
                                 str(fl.dscp << 2), str(fl.mbit), str(secs)],
                                stdout=subprocess.PIPE, text=True) for fl in flows]
    bound = []
    for s in senders:
        assert s.stdout is not None
        bound.append(int(s.stdout.readline() or 0))
    for s in senders:
        if s.wait(60) != 0:
            raise RuntimeError("a sender failed")
    got: dict[str, int] = {}
    for rx in receivers.values():
        assert rx.stdout is not None
        got.update(json.loads(rx.stdout.readline()))
        rx.wait(30)
    return [got.get(f"{fl.dport} {f.address(fl.src)} {port}", 0) * 8 / secs / 1e6
            for fl, port in zip(flows, bound, strict=True)]
