"""The device -> PCIe link map (transport/pcie_links.py, shim/crux_links.c): computed from a
fixture sysfs, written atomically by the agent, and read by both parsers with the same verdict
on valid and hostile files (the shim's through tests/c/gate_drive.c)."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cbuild import build
from transport.pcie import PcieLocks, shared_links
from transport.pcie_links import (
    MAX_BYTES,
    DeviceLink,
    LinkMap,
    LinkMapError,
    device_links,
    format_map,
    level_for,
    parse_map,
    read_map,
    write_map,
)

SYSFS = Path(__file__).resolve().parent / "fixtures" / "sysfs-pcie"
GATE_SOURCES = ["tests/c/gate_drive.c", "shim/crux_gate.c", "shim/crux_gate_setup.c",
                "shim/crux_links.c", "shim/crux_pcie.c", "shim/crux_decide.c"]
GOOD = b"# c\ncrux-pcie-links 1 3\nmlx5_0 1 0000:04:00.0\n\nrxe0 0 -\nx.y-z_9 2 abcdef01:ff:1f.7\n"


@pytest.fixture(scope="module")
def drive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("cbin"), "gate_drive", GATE_SOURCES, "-pthread")


class CParser:
    """One gate_drive process answering `parse FILE` with the shim's verdict."""

    def __init__(self, prog: Path, tmp: Path) -> None:
        self.tmp = tmp
        self.p = subprocess.Popen([str(prog), str(tmp / "none"), str(tmp / "none"), "-1", "x"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)

    def verdict(self, path: Path) -> str:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(f"parse {path}\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().split(" ")[0].strip()

    def of_bytes(self, data: bytes) -> str:
        f = self.tmp / "map"
        f.write_bytes(data)
        return self.verdict(f)

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait(timeout=30)


@pytest.fixture(scope="module")
def cparse(drive: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CParser]:
    c = CParser(drive, tmp_path_factory.mktemp("parse"))
    yield c
    c.close()


def py_verdict(data: bytes) -> str:
    try:
        parse_map(data)
    except LinkMapError:
        return "bad"
    return "ok"


def test_device_links_from_fixture_sysfs() -> None:
    switches = shared_links(SYSFS)
    assert [s.bridge for s in switches] == ["0000:00:00.1", "0000:01:00.0", "0000:11:00.0"]
    # mlx5_0/1: two functions of one NIC; rxe0: soft-RoCE on eth2, through its `parent`;
    # mlx5_3: a NIC with no GPU beside it; siw0 on lo, odd0 out of sysfs, rxe9 with a `parent`
    # that climbs out, and a name the shim could not look up: all left out
    assert device_links(SYSFS, switches) == [
        DeviceLink("mlx5_0", 1, "0000:04:00.0"), DeviceLink("mlx5_1", 1, "0000:04:00.1"),
        DeviceLink("mlx5_2", 2, "0000:14:00.0"), DeviceLink("rxe0", 0, "0000:31:00.0")]
    assert device_links(SYSFS / "nothing", switches) == []


def test_agent_writes_the_map_beside_the_semaphore_file(tmp_path: Path,
                                                         cparse: CParser) -> None:
    from cruxd.agent.dataplane import DataPlane

    dp = DataPlane(tmp_path / "decisions", sysfs_root=str(SYSFS))
    dp.start()
    m = read_map(tmp_path / "pcie-links")
    assert m == LinkMap(3, tuple(device_links(SYSFS, shared_links(SYSFS))))
    with PcieLocks.open(tmp_path / "pcie") as lk:
        assert lk.links == m.links == dp.pcie_links
    assert stat.S_IMODE(os.stat(tmp_path / "pcie-links").st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pcie", "pcie-links", "qps"]
    assert cparse.verdict(tmp_path / "pcie-links") == "ok"
    # a host without shared links: no stale map stays behind
    DataPlane(tmp_path / "decisions", sysfs_root=str(tmp_path / "empty")).start()
    assert not (tmp_path / "pcie-links").exists()


def test_round_trip_and_atomic_replace(tmp_path: Path, cparse: CParser) -> None:
    m = LinkMap(4, (DeviceLink("mlx5_0", 3, "0000:3b:00.0"), DeviceLink("rxe0", 0, None)))
    path = tmp_path / "pcie-links"
    write_map(path, m)
    assert read_map(path) == m and parse_map(format_map(m).encode()) == m
    assert cparse.verdict(path) == "ok"
    write_map(path, LinkMap(1, ()))
    assert read_map(path) == LinkMap(1, ()) and os.listdir(tmp_path) == ["pcie-links"]
    for bad in [LinkMap(1, (DeviceLink("mlx5 0", 0, None),)),
                LinkMap(1, (DeviceLink("mlx5_0", 1, None),)), LinkMap(0, ()),
                LinkMap(2, (DeviceLink("a", 0, None), DeviceLink("a", 1, None)))]:
        with pytest.raises(LinkMapError):
            write_map(path, bad)
    assert read_map(path) == LinkMap(1, ()) and os.listdir(tmp_path) == ["pcie-links"]


HOSTILE = {
    "empty": b"",
    "no newline at the end": b"crux-pcie-links 1 1\nrxe0 0 -",
    "no header": b"# only\n\n",
    "header after an entry": b"rxe0 0 -\ncrux-pcie-links 1 1\n",
    "version 2": b"crux-pcie-links 2 1\n",
    "zero links": b"crux-pcie-links 1 0\n",
    "too many links": b"crux-pcie-links 1 1025\n",
    "leading zero": b"crux-pcie-links 1 01\n",
    "signed": b"crux-pcie-links 1 +1\n",
    "link out of range": b"crux-pcie-links 1 2\nrxe0 2 -\n",
    "negative link": b"crux-pcie-links 1 2\nrxe0 -1 -\n",
    "huge link": b"crux-pcie-links 1 2\nrxe0 99999999999999999999 -\n",
    "two spaces": b"crux-pcie-links 1 2\nrxe0  0 -\n",
    "tab": b"crux-pcie-links 1 2\nrxe0\t0 -\n",
    "trailing space": b"crux-pcie-links 1 2\nrxe0 0 - \n",
    "four fields": b"crux-pcie-links 1 2\nrxe0 0 - x\n",
    "two fields": b"crux-pcie-links 1 2\nrxe0 0\n",
    "crlf": b"crux-pcie-links 1 2\r\nrxe0 0 -\r\n",
    "slash in name": b"crux-pcie-links 1 2\n../rxe0 0 -\n",
    "long name": b"crux-pcie-links 1 2\n" + b"a" * 64 + b" 0 -\n",
    "utf-8 name": "crux-pcie-links 1 2\nrxé0 0 -\n".encode(),
    "upper-case pci": b"crux-pcie-links 1 2\nrxe0 0 0000:3B:00.0\n",
    "pci function 8": b"crux-pcie-links 1 2\nrxe0 0 0000:3b:00.8\n",
    "short domain": b"crux-pcie-links 1 2\nrxe0 0 000:3b:00.0\n",
    "twice": b"crux-pcie-links 1 2\nrxe0 0 -\nrxe0 1 -\n",
    "NUL": b"crux-pcie-links 1 2\nrxe0\x00 0 -\n",
    "too many devices": b"crux-pcie-links 1 1\n" + b"".join(b"d%d 0 -\n" % i for i in range(257)),
    "too large": b"crux-pcie-links 1 1\n" + b"#" * MAX_BYTES + b"\n",
}


def test_hostile_maps_are_refused_by_both_parsers(cparse: CParser) -> None:
    assert py_verdict(GOOD) == cparse.of_bytes(GOOD) == "ok"
    edge = b"crux-pcie-links 1 1\n" + b"".join(b"d%d 0 -\n" % i for i in range(256))
    assert py_verdict(edge) == cparse.of_bytes(edge) == "ok"  # exactly the device limit
    for name, data in HOSTILE.items():
        assert (py_verdict(data), cparse.of_bytes(data)) == ("bad", "bad"), name


def test_map_file_kinds(tmp_path: Path, cparse: CParser) -> None:
    good = tmp_path / "good"
    good.write_bytes(GOOD)
    (tmp_path / "link").symlink_to(good)  # never followed, even to a valid map
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")  # must not hang either reader
    for name in ("link", "dir", "fifo"):
        assert cparse.verdict(tmp_path / name) == "bad", name
        with pytest.raises((LinkMapError, IsADirectoryError)):
            read_map(tmp_path / name)
    assert cparse.verdict(tmp_path / "none") == "missing"
    with pytest.raises(FileNotFoundError):
        read_map(tmp_path / "none")


LINES = [b"crux-pcie-links 1 3", b"mlx5_0 1 0000:04:00.0", b"rxe0 0 -", b"# x", b"",
         b"rxe1 2 0000:14:00.1"]


@settings(max_examples=300)
@given(lines=st.lists(st.sampled_from(LINES), min_size=1, max_size=6),
       flips=st.lists(st.tuples(st.integers(0, 200), st.sampled_from(
           b" \t\n#-.:0123456789abzAZ_/\x00\xff")), max_size=3))
def test_both_parsers_agree_on_mutated_maps(cparse: CParser, lines: list[bytes],
                                            flips: list[tuple[int, int]]) -> None:
    data = bytearray(b"\n".join(lines) + b"\n")
    for at, byte in flips:
        data[at % len(data)] = byte
    assert py_verdict(bytes(data)) == cparse.of_bytes(bytes(data)), bytes(data)


def test_plan_levels_map_onto_the_semaphore_levels() -> None:
    assert [level_for(x) for x in (-1, 0, 3, 7, 8, 100)] == [0, 0, 3, 7, 7, 7]
