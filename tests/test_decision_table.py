"""transport.decision_table against shim/crux_table.h: golden bytes, C and Python reading each
other's tables, torn reads under a hammering writer, adoption and replacement, bad input."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transport.decision_table import (
    Decision,
    TableError,
    TableFullError,
    TableHeader,
    TableReader,
    TableWriter,
    pack_entry,
    pack_header,
    unpack_entry,
    unpack_header,
)

REPO = Path(__file__).resolve().parent.parent
little_endian = pytest.mark.skipif(sys.byteorder != "little", reason="golden bytes are LE")

D1 = Decision("job-a", None, 1, 2, 3, 4, 5)
D2 = Decision("job-a", "10.0.0.1", 200, 46, 184, 0, 5)
D3 = Decision("jöb-b", "2001:db8::1", 255, 63, 255, 65535, 2**64 - 1)
SET = [D1, D2, D3]


@pytest.fixture(scope="module")
def cbin(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not found: the C interop tests compile tests/c/*.c")
    out = tmp_path_factory.mktemp("cbin")
    for name in ("table_reader", "table_writer", "table_torture"):
        run = subprocess.run([gcc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-O2",
                              f"-I{REPO / 'shim'}", str(REPO / "tests" / "c" / f"{name}.c"),
                              "-o", str(out / name)], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
    return {name: out / name for name in ("table_reader", "table_writer", "table_torture")}


def _c_args(d: Decision) -> list[str]:
    return [d.job_id, d.peer or "-", *map(str, (d.level, d.dscp, d.traffic_class, d.sport,
                                                 d.plan_generation))]


def _c_read(cbin: dict[str, Path], path: Path, *lookups: str) -> tuple[int, list[dict[str, str]]]:
    run = subprocess.run([cbin["table_reader"], path, *lookups], capture_output=True)
    lines = run.stdout.decode().splitlines()
    return run.returncode, [dict([("kind", ln.split()[0])] + [t.split("=", 1) for t in ln.split()
                                                             if "=" in t]) for ln in lines]


def _as_decision(row: dict[str, str]) -> Decision:
    peer = ipaddress.IPv6Address(bytes.fromhex(row["peer"]))
    return Decision(row["job"], None if peer.packed == bytes(16) else str(peer),
                    int(row["level"]), int(row["dscp"]), int(row["tc"]), int(row["sport"]),
                    int(row["gen"]))


@little_endian
def test_golden_header() -> None:
    h = TableHeader(capacity=4096, generation=0x0102030405060708, plan_generation=42,
                    updated_ns=0x1122334455667788, writer_pid=1234, flags=1, used=3)
    want = (b"CRUXTBL1" + bytes.fromhex("01000000 40000000 80000000 00100000")
            + bytes.fromhex("0807060504030201 2a00000000000000 8877665544332211")
            + bytes.fromhex("d2040000 01000000 03000000 00000000"))
    assert pack_header(h) == want
    assert unpack_header(want) == h


@little_endian
def test_golden_entries() -> None:
    v4 = (bytes.fromhex("06000000 01 05 2e b8 00c0 0000 00000000") + bytes(10) + b"\xff\xff"
          + bytes([10, 1, 2, 3]) + b"job-7" + bytes(59) + bytes.fromhex("0b0a000000000000")
          + bytes(24))
    d = Decision("job-7", "10.1.2.3", 5, 46, 184, 0xC000, 0x0A0B)
    assert pack_entry(d, seq=6) == v4
    assert unpack_entry(v4) == (6, d)
    wide = (bytes.fromhex("00000000 01 00 00 00 0000 0100 00000000") + bytes(16) + b"j"
            + bytes(63) + bytes(32))
    assert pack_entry(Decision("j", None, 0, 0, 0, 0, 0)) == wide
    v6 = pack_entry(Decision("j", "2001:db8::1", 0, 0, 0, 0, 0))
    assert v6[16:32] == bytes.fromhex("20010db8000000000000000000000001")
    assert pack_entry(None, seq=9) == bytes.fromhex("09000000") + bytes(124)
    assert unpack_entry(pack_entry(None, seq=9)) == (9, None)


@little_endian
def test_golden_tcp_ports() -> None:
    """tcp_dport at 104, tcp_sports[8] at 106 (unused slots 0), 6 reserved bytes at 122."""
    d = Decision("j", "10.1.2.3", 1, 46, 184, 0, 7, tcp_dport=29500,
                 tcp_sports=(40001, 40002, 65535))
    raw = pack_entry(d, seq=2)
    assert raw[:104] == pack_entry(Decision("j", "10.1.2.3", 1, 46, 184, 0, 7), seq=2)[:104]
    assert raw[104:] == bytes.fromhex("3c73 419c 429c ffff 0000 0000 0000 0000 0000") + bytes(6)
    assert unpack_entry(raw) == (2, d)
    full = Decision("j", None, 0, 0, 0, 0, 0, 1, tuple(range(1, 9)))
    assert pack_entry(full)[106:122] == b"".join(i.to_bytes(2, "little") for i in range(1, 9))
    # a C writer may leave a hole: zeros are unused slots wherever they are
    holey = bytearray(raw)
    holey[106:108] = bytes(2)
    assert unpack_entry(bytes(holey))[1] == Decision(
        "j", "10.1.2.3", 1, 46, 184, 0, 7, tcp_dport=29500, tcp_sports=(40002, 65535))
    # an old reader's view: these bytes were reserved, and an entry without ports keeps them 0
    assert pack_entry(Decision("j", None, 0, 0, 0, 0, 0))[104:] == bytes(24)


def test_c_reads_python_table(tmp_path: Path, cbin: dict[str, Path]) -> None:
    path = tmp_path / "t"
    with TableWriter.open(path, capacity=8) as w:
        w.apply(SET, plan_generation=77)
        h = w.header()
    rc, rows = _c_read(cbin, path, "job-a", "-", "job-a", "::ffff:10.0.0.1", "jöb-b",
                       "2001:db8::1", "job-a", "10.0.0.2", "nope", "-")
    assert rc == 0
    head = rows[0]
    assert head["kind"] == "header"
    assert {k: int(v, 0) for k, v in head.items() if k != "kind"} == {
        "magic": h.magic, "version": 1, "header_size": 64, "entry_size": 128, "capacity": 8,
        "generation": 1, "plan_generation": 77, "updated_ns": h.updated_ns,
        "writer_pid": os.getpid(), "flags": 0, "used": 3, "retired": 0}
    entries = [r for r in rows if r["kind"] == "entry"]
    assert [int(r["slot"]) for r in entries] == [0, 1, 2]
    assert [_as_decision(r) for r in entries] == SET
    assert [(r["seq"], r["flags"]) for r in entries] == [("2", "1"), ("2", "0"), ("2", "0")]
    found = [r for r in rows if r["kind"] == "lookup"]
    assert [_as_decision(r) for r in found[:3]] == SET
    assert "job" not in found[3] and "job" not in found[4]  # misses


def test_python_reads_c_table_and_bytes_match(tmp_path: Path, cbin: dict[str, Path]) -> None:
    c_path, py_path = tmp_path / "c", tmp_path / "py"
    args = [a for d in SET for a in _c_args(d)]
    subprocess.run([cbin["table_writer"], c_path, "8", "77", *args], check=True)
    with TableReader(c_path) as r:
        assert r.snapshot() == SET
        assert r.lookup("jöb-b", "2001:db8:0::1") == D3
        assert r.lookup("job-a", "::ffff:10.0.0.1") == D2
        assert (r.generation, r.header().used, r.header().plan_generation) == (1, 3, 77)
    with TableWriter.open(py_path, capacity=8) as w:
        w.apply(SET, plan_generation=77)
    c_raw, py_raw = bytearray(c_path.read_bytes()), bytearray(py_path.read_bytes())
    for raw in (c_raw, py_raw):
        raw[40:52] = bytes(12)  # updated_ns, writer_pid
    assert c_raw == py_raw
    with TableWriter.open(c_path, capacity=8) as w:  # the agent adopts a C-written table
        assert w.entries() == SET


HAMMER = """
import sys, time
from transport.decision_table import Decision, TableWriter
def d(n): return Decision("torture", None, n % 251, n % 61, n % 239, n % 65536, n)
with TableWriter.open(sys.argv[1], capacity=4) as w:
    n = 1
    w.upsert(d(n))
    print("ready", flush=True)
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        n += 1
        w.upsert(d(n))
"""


def test_no_torn_reads_under_a_hammering_writer(tmp_path: Path, cbin: dict[str, Path]) -> None:
    path = tmp_path / "t"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writer = subprocess.Popen([sys.executable, "-c", HAMMER, path, "1.6"], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        torture = subprocess.Popen([cbin["table_torture"], path, "1.2"],
                                   stdout=subprocess.PIPE, text=True)
        seen: set[int] = set()
        reads, end = 0, time.monotonic() + 1.2
        with TableReader(path) as r:
            while time.monotonic() < end:
                reads += 1
                if (d := r.read_slot(0)) is None:
                    continue  # gave up on a busy entry: fail open
                n = d.plan_generation
                assert (d.job_id, d.peer, d.level, d.dscp, d.traffic_class, d.sport) == (
                    "torture", None, n % 251, n % 61, n % 239, n % 65536)
                seen.add(n)
        out, _ = torture.communicate(timeout=30)
    finally:
        writer.wait(timeout=30)
    assert torture.returncode == 0, out
    stats = dict(t.split("=") for t in out.split())
    assert int(stats["ok"]) > 1000 and int(stats["changes"]) >= 2, out
    assert reads > 1000 and len(seen) >= 2


def test_reader_is_read_only_and_mode_is_exact(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        TableWriter.open(tmp_path / "a").close()
        TableWriter.open(tmp_path / "b", capacity=4, mode=0o640).close()
    finally:
        os.umask(old)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b").stat().st_mode & 0o777 == 0o640
    with TableReader(tmp_path / "a") as r:
        assert r.capacity == 4096
        with pytest.raises(TypeError):
            r.mm[0:1] = b"x"


def test_restarted_writer_adopts_the_table(tmp_path: Path) -> None:
    path = tmp_path / "t"
    w = TableWriter.open(path, capacity=8)
    w.apply(SET, plan_generation=3)
    gen, ino = w.generation, path.stat().st_ino
    with pytest.raises(TableError, match="another writer"):
        TableWriter.open(path, capacity=8)
    w.close()
    w.close()  # safe twice
    with pytest.raises(TableError, match="closed"):
        _ = w.generation
    with TableReader(path) as r, TableWriter.open(path, capacity=8) as w2:
        assert w2.entries() == SET and w2.generation >= gen
        assert path.stat().st_ino == ino and not r.retired
        assert w2.apply(SET, plan_generation=3) == 0 and w2.generation == gen  # no-op
        assert w2.apply([D1, D3], plan_generation=4) == 1 and w2.generation == gen + 1
        assert w2.upsert(Decision("new", None, 0, 0, 0, 0, 4))  # reuses the freed slot 1
        assert r.header().used == 3 and r.lookup("new") is not None
        assert w2.remove_job("job-a") == 1 and w2.remove_job("job-a") == 0
        assert set(r.snapshot()) == {D3, Decision("new", None, 0, 0, 0, 0, 4)}


def test_half_written_entry_is_freed_on_adopt(tmp_path: Path) -> None:
    path = tmp_path / "t"
    with TableWriter.open(path, capacity=4) as w:
        w.apply(SET, plan_generation=1)
    with path.open("r+b") as f:  # a writer that died between the odd and the even seq
        f.seek(64 + 128)
        f.write((3).to_bytes(4, sys.byteorder))
    with TableWriter.open(path, capacity=4) as w:
        assert w.entries() == [D1, D3] and w.generation == 2


def test_incompatible_table_is_replaced_and_retired(tmp_path: Path) -> None:
    path = tmp_path / "t"
    with TableWriter.open(path, capacity=8) as w:
        w.apply(SET, plan_generation=1)
    r = TableReader(path)
    (tmp_path / "t.tmp").write_bytes(b"leftover")
    with TableWriter.open(path, capacity=16) as w:
        assert r.retired and r.snapshot() == SET  # the old mapping still reads
        assert w.entries() == [] and not (tmp_path / "t.tmp").exists()
        with TableReader(path) as fresh:
            assert fresh.capacity == 16 and not fresh.retired
    r.close()
    for junk in (b"\x00" * 4096, pack_header(TableHeader(8, version=2)) + bytes(1024)):
        path.write_bytes(junk)
        with path.open("rb") as held:
            TableWriter.open(path, capacity=8).close()
            old = held.read()
        with TableReader(path) as fresh:
            assert fresh.capacity == 8
        ours = junk[:8] == b"CRUXTBL1"  # only a file with our magic gets the RETIRED flag
        assert old[52] == int(ours) and old[:52] + old[53:] == junk[:52] + junk[53:]


@pytest.mark.parametrize(("kwargs", "msg"), [
    ({"job_id": "x" * 64}, "at most 63 UTF-8 bytes"), ({"job_id": "é" * 32}, "at most 63"),
    ({"job_id": ""}, "must not be empty"), ({"job_id": "a\0b"}, "without NUL"),
    ({"dscp": 64}, r"dscp must be in 0\.\.63, got 64"), ({"sport": 65536}, "0..65535"),
    ({"level": -1}, "level must be in 0..255"), ({"peer": "::"}, "use peer=None"),
    ({"peer": "10.0.0.256"}, "peer must be an IPv4 or IPv6 address, got '10.0.0.256'"),
    ({"peer": "fe80::1%eth0"}, "scoped"),
    ({"tcp_dport": 65536}, r"tcp_dport must be in 0\.\.65535"),
    ({"tcp_dport": 1, "tcp_sports": tuple(range(1, 10))}, "at most 8 ports, got 9"),
    ({"tcp_dport": 1, "tcp_sports": (0,)}, r"in 1\.\.65535, got 0"),
    ({"tcp_dport": 1, "tcp_sports": (70000,)}, r"tcp_sports port must be in 0\.\.65535"),
    ({"tcp_dport": 1, "tcp_sports": (5, 5)}, r"must not repeat a port, got \[5, 5\]"),
    ({"tcp_sports": (5,)}, "needs the tcp_dport they were probed for"),
])
def test_decision_validation(kwargs: dict[str, object], msg: str) -> None:
    fields: dict[str, object] = {"job_id": "j", "peer": None, "level": 0, "dscp": 0,
                                 "traffic_class": 0, "sport": 0, "plan_generation": 0}
    with pytest.raises(ValueError, match=msg):
        Decision(**{**fields, **kwargs})


def test_decision_tcp_ports_types() -> None:
    assert Decision("j", None, 0, 0, 0, 0, 0, 80, [1, 2]).tcp_sports == (1, 2)  # list -> tuple
    with pytest.raises(TypeError, match="tcp_sports must be a tuple of ints, got set"):
        Decision("j", None, 0, 0, 0, 0, 0, 80, {1, 2})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tcp_sports port must be an int, got bool"):
        Decision("j", None, 0, 0, 0, 0, 0, 80, (True,))
    with pytest.raises(TypeError, match="tcp_dport must be an int, got str"):
        Decision("j", None, 0, 0, 0, 0, 0, "80")  # type: ignore[arg-type]


def test_reader_rejects_bad_files(tmp_path: Path) -> None:
    good = pack_header(TableHeader(capacity=8))
    cases = {
        "missing": (None, "cannot open"), "empty": (b"", "truncated, 0 bytes"),
        "short": (b"CRUXTBL1", "truncated, 8 bytes"),
        "garbage": (bytes(range(256)) * 16, "bad magic 0x0706050403020100"),
        "version": (pack_header(TableHeader(8, version=9)) + bytes(1024), "version 9"),
        "sizes": (pack_header(TableHeader(8, entry_size=64)) + bytes(1024), "64, expected"),
        "cut": (good + bytes(128 * 7), "truncated, 960 bytes but capacity 8 needs 1088"),
    }
    for name, (content, reason) in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_bytes(content)
        with pytest.raises(TableError, match=reason) as err:
            TableReader(path)
        assert str(path) in str(err.value)


def test_table_full_leaves_table_unchanged(tmp_path: Path) -> None:
    with TableWriter.open(tmp_path / "t", capacity=2) as w:
        w.apply([D1, D2], plan_generation=1)
        before = (w.entries(), w.generation, w.header().plan_generation)
        with pytest.raises(TableFullError, match="3 decisions do not fit in 2 slots"):
            w.apply(SET, plan_generation=2)
        with pytest.raises(TableFullError, match="all 2 slots"):
            w.upsert(D3)
        with pytest.raises(ValueError, match="two decisions"):
            w.apply([D1, D1], plan_generation=2)
        assert (w.entries(), w.generation, w.header().plan_generation) == before
        assert w.apply([D2, D3], plan_generation=2) == 2  # D1's slot is freed before D3 lands


_jobs = st.sampled_from(["a", "jöb", "x" * 63]) | st.text(
    st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=15)
_peers = st.none() | st.ip_addresses().filter(
    lambda a: not (getattr(a, "ipv4_mapped", None) or a).is_unspecified).map(str)
_tcp = st.just((0, ())) | st.tuples(
    st.integers(1, 65535),
    st.lists(st.integers(1, 65535), max_size=8, unique=True).map(tuple))
_decisions = st.builds(lambda job, peer, lvl, dscp, tc, sport, plan, tcp: Decision(
    job, peer, lvl, dscp, tc, sport, plan, *tcp),
    _jobs, _peers, st.integers(0, 255), st.integers(0, 63), st.integers(0, 255),
    st.integers(0, 65535), st.integers(0, 2**64 - 1), _tcp)


@given(_decisions, st.integers(0, 2**32 - 1))
def test_entry_round_trip(d: Decision, seq: int) -> None:
    raw = pack_entry(d, seq)
    assert len(raw) == 128 and unpack_entry(raw) == (seq, d)
    assert raw[122:] == bytes(6)  # reserved stays zero


def test_apply_then_read_back_is_the_set(tmp_path: Path) -> None:
    with TableWriter.open(tmp_path / "t", capacity=32) as w, TableReader(tmp_path / "t") as r:

        @settings(max_examples=60)
        @given(st.lists(_decisions, max_size=32, unique_by=lambda d: d.key),
               st.integers(0, 2**64 - 1))
        def check(ds: list[Decision], plan: int) -> None:
            w.apply(ds, plan_generation=plan)
            assert set(w.entries()) == set(ds) == set(r.snapshot())
            assert r.header().plan_generation == plan and len(ds) <= r.header().used <= 32
            assert all(r.lookup(d.job_id, d.peer) == d for d in ds[:4])

        check()
