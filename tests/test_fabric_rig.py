"""The namespace Clos rig itself: it builds, forwards across leaves, spreads UDP
flows over every spine by their 5-tuple (real kernel ECMP), keeps one port on one
spine, and leaves nothing behind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.rig.fabric import Fabric, can_build

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(can_build() is not None, reason=str(can_build()))]


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.mark.parametrize("spines", [2, 4])
def test_ecmp_spreads_ports_over_every_spine_and_keeps_each_port_on_one(spines: int) -> None:
    with Fabric(hosts_per_leaf=2, leaves=2, spines=spines) as f:
        before = f.spine_tx(0)
        f.send_udp("h0", "h2", list(range(0xC000, 0xC000 + 64)))
        spread = [a - b for a, b in zip(f.spine_tx(0), before, strict=True)]
        assert sum(spread) >= 64 and all(n > 0 for n in spread), spread
        for port in (0xC000, 0xC001, 0xD123):
            before = f.spine_tx(0)
            f.send_udp("h0", "h2", [port], count=20)
            delta = [a - b for a, b in zip(f.spine_tx(0), before, strict=True)]
            assert sorted(delta)[-1] >= 20 and sum(delta) - max(delta) < 5, (port, delta)
        prefix = f.prefix
    assert prefix not in _namespaces(), "every namespace is deleted on exit"


def test_teardown_after_a_failure_inside_the_block() -> None:
    with pytest.raises(RuntimeError), Fabric(1, 2, 2) as f:
        prefix = f.prefix
        raise RuntimeError("a test failing half-way")
    assert prefix not in _namespaces()


TTL_PROBE = """
import socket, struct, sys
dst, sport, ttl = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
icmp = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
icmp.settimeout(2)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("", sport))
udp.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
udp.sendto(b"probe", (dst, 4791))
while True:
    data, (src, _) = icmp.recvfrom(2048)
    ihl = (data[0] & 15) * 4
    kind, code = data[ihl], data[ihl + 1]
    inner = data[ihl + 8:]
    iihl = (inner[0] & 15) * 4
    isport, idport = struct.unpack("!HH", inner[iihl:iihl + 4])
    if kind == 11 and isport == sport and idport == 4791:
        print(src)
        break
"""


def test_ttl_expiry_names_the_spine_a_port_takes() -> None:
    """TTL 2 from a host expires at the spine: its ICMP time-exceeded names the spine,
    and the spine named is the one whose link counted that port's traffic."""
    with Fabric(hosts_per_leaf=1, leaves=2, spines=4) as f:
        for port in (0xC000, 0xC00F, 0xE001):
            run = f.exec("h0", sys.executable, "-c", TTL_PROBE, f.address("h1"), str(port), "2")
            assert run.returncode == 0, run.stderr
            spine_ip = run.stdout.strip()  # 10.3.(leaf*32+s).2 on the spine's leaf-0 link
            spine = int(spine_ip.split(".")[2]) % 32
            before = f.spine_tx(0)
            f.send_udp("h0", "h1", [port], count=20)
            delta = [a - b for a, b in zip(f.spine_tx(0), before, strict=True)]
            assert delta.index(max(delta)) == spine, (port, spine_ip, delta)
