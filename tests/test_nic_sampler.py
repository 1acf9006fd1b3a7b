"""The NIC sampler on a sysfs fixture tree (tests/fixtures/sysfs): counter discovery, rates,
and skipped intervals on unreadable or reset counters."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from cruxd.measure.sampling.nic import Sampler, net_counters, rdma_counters

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "sysfs"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "sys")
    return tmp_path / "sys"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_discovery(root: Path) -> None:
    (c,) = rdma_counters(root)
    assert (c.name, c.scale, c.path.name) == ("rdma:mlx5_0/1", 4, "port_xmit_data")
    assert [c.name for c in net_counters(root)] == ["net:eth0"]  # loopback left out
    assert [c.path.name for c in net_counters(root, ["eth0"], "rx")] == ["rx_bytes"]
    assert net_counters(root, ["nope"]) == [] and rdma_counters(root / "none") == []


def test_rates_skips_and_recovery(root: Path) -> None:
    clock = Clock()
    xmit = root / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data"
    tx = root / "class/net/eth0/statistics/tx_bytes"
    s = Sampler(rdma_counters(root) + net_counters(root), rate_hz=10, clock=clock)
    s.tick()  # baseline
    for words, nbytes in [(1250, 123956), (1250, 123956), (1500, 124956)]:
        clock.t += 0.1
        xmit.write_text(f"{words}\n")
        tx.write_text(f"{nbytes}\n")
        s.tick()
    rd, net = s.series["rdma:mlx5_0/1"], s.series["net:eth0"]
    assert rd.rates == pytest.approx([1000 * 10, 0, 1000 * 10])  # 250 words = 1000 bytes
    assert net.rates == pytest.approx([5000, 0, 10000]) and net.total_bytes == 1500
    tx.write_text("garbage\n")  # unreadable: skipped, and the file is reopened next time
    clock.t += 0.1
    s.tick()
    tx.unlink()  # the device was replaced: a new file, which the reader must pick up
    tx.write_text("100\n")
    clock.t += 0.1
    s.tick()  # new baseline after the failure
    clock.t += 0.1
    tx.write_text("50\n")  # went backwards: a reset
    s.tick()
    assert all(math.isnan(x) for x in net.rates[3:]) and s.failed_reads == 2
    assert len(rd.rates) == 6 and not any(math.isnan(x) for x in rd.rates[3:])


def test_run_keeps_the_grid(root: Path) -> None:
    clock = Clock()
    slept: list[float] = []

    def sleep(d: float) -> None:
        slept.append(d)
        clock.t += d + 0.002  # every sleep overshoots a little

    out = Sampler(net_counters(root), rate_hz=50, clock=clock).run(1.0, sleep)
    assert len(out["net:eth0"].rates) == 50
    assert clock.t == pytest.approx(100.0 + 1.0 + 0.002, abs=1e-9)  # no drift


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="no counters"):
        Sampler([])
    with pytest.raises(ValueError, match="rate_hz"):
        Sampler(net_counters(FIXTURE), rate_hz=0)
