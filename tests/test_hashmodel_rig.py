"""The hash model against the kernel: on a Clos whose leaves pick spines with nftables'
jhash (Fabric(ecmp="jhash")), probing.hashmodel predicts every port's spine exactly -
by the leaf's uplink counters and by TTL traces - and the guided sweep finds all N
paths with N probes, under two seeds and two field selections."""

from __future__ import annotations

import sys

import pytest

from probing.hashmodel import HashModel
from tests.rig.fabric import Fabric, can_build_jhash
from tests.rig.probe import guided_from, spine_of, trace_from

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(can_build_jhash() is not None, reason=str(can_build_jhash()))]

PORTS = list(range(0xC000, 0xC000 + 64))
COUNT = 10


def _check_counters(f: Fabric, ports: list[int]) -> dict[int, int]:
    """Send COUNT datagrams from each port, a batch per predicted spine: every batch must
    leave over its spine only (a single stray port would add COUNT elsewhere). Returns
    the prediction."""
    m, src, dst = f.hash_model(), f.address("h0"), f.address("h1")
    predicted = {p: m.path_of(src, dst, p, n=f.spines) for p in ports}
    for s in range(f.spines):
        batch = [p for p in ports if predicted[p] == s]
        delta = f.spine_tx_delta("h0", "h1", batch, count=COUNT)
        others = sum(delta) - delta[s]
        # >=: IPv6 neighbour discovery and the like may add a packet or two
        assert delta[s] >= COUNT * len(batch) and others < COUNT, (s, batch, delta)
    return predicted


def test_the_model_predicts_every_ports_spine_and_the_guided_sweep_needs_n_probes() -> None:
    with Fabric(hosts_per_leaf=1, leaves=2, spines=4, ecmp="jhash", hash_seed=0x5EED) as f:
        predicted = _check_counters(f, PORTS)
        assert sorted(set(predicted.values())) == [0, 1, 2, 3]
        m = f.hash_model()
        one_each = m.ports_per_path(f.address("h0"), f.address("h1"), f.spines)
        for s, port in one_each.items():
            hops = trace_from(f, "h0", "h1", port)
            assert hops is not None and len(hops) == 3, hops
            assert spine_of(hops[1]) == spine_of(hops[2]) == s, (port, hops)
        doc = guided_from(f, "h0", "h1", m, f.spines)
        assert doc["stopped"] == "model" and doc["probes_sent"] == 4, doc
        assert sorted(spine_of(p["hops"][1]) for p in doc["paths"]) == [0, 1, 2, 3]
        assert {p["sports"][0] for p in doc["paths"]} == set(one_each.values())
        assert doc["datagrams"] == 4 * 4  # TTL 1..3 expire, TTL 4 reaches the peer


def test_another_seed_moves_the_ports_and_the_model_follows() -> None:
    maps = []
    for seed, fields in ((1, ("src", "dst", "sport", "dport")),
                         (0xFFFFFFFF, ("dport", "sport", "proto"))):
        with Fabric(hosts_per_leaf=1, leaves=2, spines=4, ecmp="jhash", hash_seed=seed,
                    hash_fields=fields) as f:
            maps.append(_check_counters(f, PORTS))
            # a guided sweep with a wrong seed (one whose 4 ports collide here): it
            # notices, and the blind sweep it falls back to still finds all 4 paths
            wrong = HashModel("jhash", seed ^ 2, fields)
            doc = guided_from(f, "h0", "h1", wrong, f.spines, expected=f.spines)
            assert doc["stopped"] == "model-mismatch:expected", doc
            assert len(doc["paths"]) == 4 and doc["probes_sent"] > 4, doc
    moved = sum(a != b for a, b in zip(maps[0].values(), maps[1].values(), strict=True))
    assert moved > len(PORTS) // 2, maps


def test_non_udp_keeps_the_kernel_route() -> None:
    """TCP is not marked: it crosses on the kernel's multipath route (a RST comes back)."""
    connect = ("import socket, sys\n"
               "try:\n"
               "    socket.create_connection((sys.argv[1], 9), timeout=3)\n"
               "except ConnectionRefusedError:\n"
               "    print('refused')\n")
    with Fabric(hosts_per_leaf=1, leaves=2, spines=2, ecmp="jhash", hash_seed=7) as f:
        run = f.exec("h0", sys.executable, "-c", connect, f.address("h1"))
        assert run.stdout.strip() == "refused", run.stdout + run.stderr
