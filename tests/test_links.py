"""The agent's NIC ports as links (cruxd/measure/sampling/links.py): speeds from sysfs, transmit
utilisation, congestion events from hw_counters across readings and resets, and the path
from a live agent's report through the leader's validation into `cruxctl status`."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cruxd.agent.measuring import LiveMeasurement
from cruxd.control.records import AgentReport, HostInventory, LinkObservation
from cruxd.control.validate import InvalidMessage, check_report
from cruxd.measure.sampling.links import (
    PortLinks,
    congestion_counters,
    port_speed_bps,
    utilization,
)
from cruxd.rpc import convert
from tests.test_live_measurement import config, feed

FIXTURE = Path(__file__).parent / "fixtures" / "sysfs"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "sys")
    return tmp_path / "sys"


def test_port_speeds(root: Path) -> None:
    assert port_speed_bps(root, "net:eth0") == 25e9
    assert port_speed_bps(root, "rdma:mlx5_0/1") == 100e9
    assert port_speed_bps(root, "net:lo") is None  # no speed file
    (root / "class/net/eth0/speed").write_text("-1\n")  # link down
    assert port_speed_bps(root, "net:eth0") is None
    (root / "class/infiniband/mlx5_0/ports/1/rate").write_text("garbage\n")
    assert port_speed_bps(root, "rdma:mlx5_0/1") is None
    for bad in ("eth0", "net:", "net:a/b", "rdma:mlx5_0", "rdma:mlx5_0/x", "rdma:/1"):
        assert port_speed_bps(root, bad) is None


def test_congestion_counters_are_rdma_only(root: Path) -> None:
    names = [c.name for c in congestion_counters(root, "rdma:mlx5_0/1")]
    assert names == ["rdma:mlx5_0/1#np_ecn_marked_roce_packets", "rdma:mlx5_0/1#rp_cnp_handled"]
    assert congestion_counters(root, "net:eth0") == []


def test_utilization() -> None:
    # 1.25 GB/s on a 25 Gbit/s port is 40 %, NaN intervals left out
    assert utilization(np.array([1.25e9, np.nan, 1.25e9]), 25e9) == pytest.approx(0.4)
    assert utilization(np.array([1e12]), 25e9) == 1.0
    assert utilization(np.array([1e9]), None) == 0.0
    assert utilization(np.array([np.nan]), 25e9) == 0.0
    assert utilization(np.zeros(0), 25e9) == 0.0


@given(st.lists(st.floats(0, 1e12) | st.just(float("nan")), max_size=50),
       st.none() | st.floats(1e6, 1e12))
def test_utilization_is_a_fraction(rates: list[float], speed: float | None) -> None:
    assert 0.0 <= utilization(np.array(rates, dtype=float), speed) <= 1.0


def test_congestion_events_are_deltas_and_survive_resets(root: Path) -> None:
    hw = root / "class/infiniband/mlx5_0/ports/1/hw_counters"
    ports = PortLinks(root, ["net:eth0", "rdma:mlx5_0/1"])
    try:
        first = ports.observe("rdma:mlx5_0/1", np.array([1.25e9]))
        assert first == LinkObservation("rdma:mlx5_0/1", pytest.approx(0.1), 0)  # baseline
        (hw / "np_ecn_marked_roce_packets").write_text("100\n")
        (hw / "rp_cnp_handled").write_text("13\n")
        assert ports.observe("rdma:mlx5_0/1", np.zeros(3)).congestion_events == 60 + 10
        (hw / "np_ecn_marked_roce_packets").write_text("5\n")  # a reset: no events, new base
        assert ports.observe("rdma:mlx5_0/1", np.zeros(3)).congestion_events == 0
        (hw / "np_ecn_marked_roce_packets").write_text("8\n")
        assert ports.observe("rdma:mlx5_0/1", np.zeros(3)).congestion_events == 3
        (hw / "rp_cnp_handled").unlink()  # unreadable: that counter is skipped, logged once
        (hw / "np_ecn_marked_roce_packets").write_text("9\n")
        assert ports.observe("rdma:mlx5_0/1", np.zeros(3)).congestion_events == 1
        assert ports.observe("net:eth0", np.array([3.125e8])) == LinkObservation(
            "net:eth0", pytest.approx(0.1), 0)
    finally:
        ports.close()


def test_links_pass_validation_and_the_rpc_edge() -> None:
    r = AgentReport(HostInventory("h0"), links=(LinkObservation("rdma:mlx5_0/1", 0.5, 7),))
    assert convert.report_from_pb(convert.report_to_pb(r)).links == r.links
    check_report(r)
    for bad, field in ((LinkObservation("x", 1.5, 0), "links[0].utilization"),
                       (LinkObservation("x", 0.5, 2**60), "links[0].congestion_events"),
                       (LinkObservation("x", float("nan"), 0), "links[0].utilization")):
        with pytest.raises(InvalidMessage) as err:
            check_report(AgentReport(HostInventory("h0"), links=(bad,)))
        assert err.value.field == field


def test_live_measurement_reports_each_port(root: Path) -> None:
    m = LiveMeasurement(config(root), (), lambda job: [], lambda: [], lambda: 1)
    m._links_at = time.monotonic() - 2.0
    feed(m, {"net:eth0": np.full(100, 3.125e8), "rdma:mlx5_0/1": np.full(100, 1.25e9)})
    links = {lk.link: lk for lk in m.links()}
    assert links["net:eth0"].utilization == pytest.approx(0.1, rel=0.05)
    assert links["rdma:mlx5_0/1"].utilization == pytest.approx(0.1, rel=0.05)
    assert links["rdma:mlx5_0/1"].congestion_events == 0  # the first reading is the base
    m.stop()
