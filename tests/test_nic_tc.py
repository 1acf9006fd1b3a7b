"""The NIC traffic-class override reader (fixture sysfs trees) and which class wins on a QP."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from cruxd.agent.nic_tc import TcOverride, parse_traffic_class, tc_overrides, winning_class


def attr(root: Path, dev: str, port: str, text: bytes) -> None:
    p = root / "class" / "infiniband" / dev / "tc" / port / "traffic_class"
    p.parent.mkdir(parents=True)
    p.write_bytes(text)


def test_overrides_from_a_fixture_tree(tmp_path: Path) -> None:
    attr(tmp_path, "mlx5_0", "1", b"Global tclass=106\n")
    attr(tmp_path, "mlx5_1", "1", b"")  # never written: no override
    attr(tmp_path, "mlx5_2", "1", b"Global tclass=-1\n")  # cleared
    attr(tmp_path, "mlx5_3", "1", b"\xff\xfe garbage tclass=999" + b"x" * 10_000)
    (tmp_path / "class" / "infiniband" / "rxe0").mkdir(parents=True)  # no tc/ at all
    assert tc_overrides(tmp_path) == [TcOverride("mlx5_0/1", 106)]


def test_no_rdma_at_all(tmp_path: Path) -> None:
    assert tc_overrides(tmp_path) == []


@given(st.text(max_size=64))
def test_parse_never_raises_and_stays_in_range(text: str) -> None:
    tc = parse_traffic_class(text)
    assert tc is None or 0 <= tc <= 255


def test_which_class_wins() -> None:
    assert winning_class(106, True, 104, 40) == (106, "nic-override")
    assert winning_class(None, True, 104, 40) == (104, "crux")
    assert winning_class(None, False, 104, 40) == (40, "program")
