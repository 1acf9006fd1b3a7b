"""The TTL sweep on the namespace Clos: it finds exactly the spine paths between
hosts on different leaves, and each path's source port carries real data over the
spine the probe named."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.rig.fabric import MAX_SPINES, Fabric, can_build
from tests.rig.probe import spine_of, sweep_from

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(can_build() is not None, reason=str(can_build()))]

@pytest.mark.parametrize("spines", [2, 4])
def test_sweep_finds_exactly_the_spine_paths_and_they_carry_data(spines: int) -> None:
    """Every ordered pair of hosts on different leaves (2 leaves x 2 hosts)."""
    with Fabric(hosts_per_leaf=2, leaves=2, spines=spines) as f:
        pairs = [(a, b) for a in f.host_names for b in f.host_names
                 if f.leaf_of(a) != f.leaf_of(b)]
        for src, dst in pairs:
            k, sl, dl = int(src[1:]), f.leaf_of(src), f.leaf_of(dst)
            doc = sweep_from(f, src, dst)
            hops = [tuple(p["hops"]) for p in doc["paths"]]
            assert len(hops) == spines and doc["stopped"] == "quiet", (src, dst, doc)
            # the source's leaf, then spine s on its link from that leaf, then the peer's
            # leaf on its link from that same spine s (routers answer from the interface
            # a probe came in on)
            assert sorted(spine_of(h[1]) for h in hops) == list(range(spines))
            assert all(h[0] == f"10.2.{k}.1"
                       and h[1] == f"10.3.{sl * MAX_SPINES + spine_of(h[1])}.2"
                       and h[2] == f"10.3.{dl * MAX_SPINES + spine_of(h[1])}.1"
                       for h in hops), (src, dst, hops)
            for path in doc["paths"]:
                spine = spine_of(path["hops"][1])
                delta = f.spine_tx_delta(src, dst, path["sports"][:1], count=30)
                assert delta[spine] >= 30 and sum(delta) - delta[spine] < 5, (path, delta)


def test_cruxctl_probe_json_shape() -> None:
    with Fabric(hosts_per_leaf=1, leaves=2, spines=2) as f:
        cruxctl = str(Path(sys.executable).parent / "cruxctl")
        run = f.exec("h0", cruxctl, "probe", f.address("h1"), "--json", "--rate", "0",
                     timeout=120)
        assert run.returncode == 0, run.stderr
        doc = json.loads(run.stdout)
        assert doc["peer"] == f.address("h1") and doc["probes_sent"] >= 2
        assert len(doc["paths"]) == 2
        assert all(isinstance(p["sports"][0], int) and len(p["hops"]) == 3
                   for p in doc["paths"])
        bad = f.exec("h0", cruxctl, "probe", "x", "--sports", "9-1")
        assert bad.returncode == 2 and bad.stderr.startswith("cruxctl: error: --sports")
