"""The namespace Clos rig itself: it builds, forwards across leaves, spreads UDP
flows over every spine by their 5-tuple (real kernel ECMP), keeps one port on one
spine, and leaves nothing behind."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.rig.fabric import Fabric, can_build
from tests.rig.probe import spine_of, trace_from

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(can_build() is not None, reason=str(can_build()))]


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.mark.parametrize("spines", [2, 4])
def test_ecmp_spreads_ports_over_every_spine_and_keeps_each_port_on_one(spines: int) -> None:
    with Fabric(hosts_per_leaf=2, leaves=2, spines=spines) as f:
        spread = f.spine_tx_delta("h0", "h2", list(range(0xC000, 0xC000 + 64)))
        assert sum(spread) >= 64 and all(n > 0 for n in spread), spread
        for port in (0xC000, 0xC001, 0xD123):
            delta = f.spine_tx_delta("h0", "h2", [port], count=20)
            assert sorted(delta)[-1] >= 20 and sum(delta) - max(delta) < 5, (port, delta)
        prefix = f.prefix
    assert prefix not in _namespaces(), "every namespace is deleted on exit"


def test_teardown_after_a_failure_inside_the_block() -> None:
    with pytest.raises(RuntimeError), Fabric(1, 2, 2) as f:
        prefix = f.prefix
        raise RuntimeError("a test failing half-way")
    assert prefix not in _namespaces()


def test_ttl_expiry_names_the_spine_a_port_takes() -> None:
    """The probe's second hop (TTL 2 expires at the spine) names the spine, and it is the
    one whose link counted that port's data."""
    with Fabric(hosts_per_leaf=1, leaves=2, spines=4) as f:
        for port in (0xC000, 0xC00F, 0xE001):
            hops = trace_from(f, "h0", "h1", port)
            assert hops is not None and len(hops) == 3, hops  # leaf, spine, leaf
            assert spine_of(hops[2]) == spine_of(hops[1]), hops  # leaf 1 names that link
            delta = f.spine_tx_delta("h0", "h1", [port], count=20)
            assert delta.index(max(delta)) == spine_of(hops[1]), (port, hops, delta)


def test_a_downed_spine_link_leaves_the_ecmp_set_and_comes_back() -> None:
    """set_link: with leaf 0's cable to spine 0 down, every port's traffic between the
    leaves crosses spine 1, both ways (the downed leaf drops the dead nexthop, the other
    leaf is re-routed); back up, ports spread over both spines again, both ways."""
    ports = list(range(0xC000, 0xC000 + 64))
    with Fabric(hosts_per_leaf=1, leaves=2, spines=2) as f:
        f.set_link(0, 0, up=False)
        for src, dst in (("h0", "h1"), ("h1", "h0")):
            down = f.spine_tx_delta(src, dst, ports)
            assert down[0] == 0 and down[1] >= len(ports), (src, down)
        f.set_link(0, 0, up=True)
        for src, dst in (("h0", "h1"), ("h1", "h0")):
            up = wait_until_spread(f, src, dst, ports)
            assert all(n > 0 for n in up), (src, up)


def wait_until_spread(f: Fabric, src: str, dst: str, ports: list[int]) -> list[int]:
    """Spine counts once both spines carry some of `ports` again (the route comes back
    with the link's address, a moment after `ip link set up`)."""
    for _ in range(50):
        spread = f.spine_tx_delta(src, dst, ports)
        if all(n > 0 for n in spread):
            return spread
        time.sleep(0.1)
    return spread
