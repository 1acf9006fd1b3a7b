"""The verbs shim's pure core (shim/crux_decide.c) and its wrapper library, without a NIC.

The C core runs on real decision-table files written by the Python writer; the expected
values come from the Python side (steering_for, flow_label_for), so both ends of the table
contract are checked against each other. Packets on the wire: tests/test_rdma.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cbuild import build, verbs_headers
from transport import native
from transport.decision_table import Decision, TableWriter
from transport.qp_records import parse, read_dir
from transport.steering import steering_for
from transport.verbs import flow_label_for, sport_of

NO_JOB, NO_TABLE, BAD_TABLE, NO_ENTRY, SPORT_RANGE = 1, 2, 3, 4, 6


@pytest.fixture(scope="module")
def decide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("cbin"), "decide_check",
                 ["tests/c/decide_check.c", "shim/crux_decide.c"])


def run(decide: Path, table: str, job: str, peer: str, tc: int = 40, fl: int = 0,
        records: str = "") -> dict[str, int]:
    args = [str(decide), table, job, peer, str(tc), str(fl)] + ([records] if records else [])
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (kv.split("=") for kv in out.split())}


def table(path: Path, *decisions: Decision) -> str:
    with TableWriter.open(path, capacity=64) as w:
        w.apply(list(decisions), 7)
    return str(path)


def test_flow_label_sets_the_port() -> None:
    # the kernel's formula, checked against values observed on rxe (issue 6)
    assert [sport_of(fl) for fl in (0x1, 0x12345, 0xABCDE)] == [49153, 58177, 64756]
    assert all(sport_of(flow_label_for(s)) == s for s in range(0xC000, 0x10000))
    assert 0 not in {flow_label_for(s) for s in range(0xC000, 0x10000)}  # 0 = "no label"
    with pytest.raises(ValueError, match="49152-65535"):
        flow_label_for(4791)


def test_fixed_cases(tmp_path: Path, decide: Path) -> None:
    t = table(tmp_path / "d", Decision("job", None, 1, 10, 40, 0xC123, 7),
              Decision("job", "10.0.0.2", 3, 26, 104, 50000, 7),
              Decision("low", None, 0, 8, 32, 4791, 7),
              Decision("nat", None, 2, 46, 184, 0, 7),
              Decision("edge", None, 2, 46, 184, 0xC000, 7))
    # 0xC000 cannot use label 0 (= no label): 0x4001's halves cancel in the XOR
    assert run(decide, t, "edge", "10.0.0.2")["flow_label"] == 0x4001
    assert run(decide, t, "job", "10.0.0.2") == {
        "outcome": 0, "flow_label": 50000 & 0x3FFF, "traffic_class": 104, "sport": 50000}
    assert run(decide, t, "job", "10.0.0.9") == {  # the job-wide entry
        "outcome": 0, "flow_label": 0x0123, "traffic_class": 40, "sport": 0xC123}
    # sport 0 leaves the port to the NIC: the program's own flow label stays
    assert run(decide, t, "nat", "10.0.0.2", fl=77) == {
        "outcome": 0, "flow_label": 77, "traffic_class": 184, "sport": 0}
    # a port a flow label cannot express: the class is applied, the port is not
    assert run(decide, t, "low", "10.0.0.2", fl=5) == {
        "outcome": SPORT_RANGE, "flow_label": 5, "traffic_class": 32, "sport": 4791}
    unchanged = {"flow_label": 9, "traffic_class": 40, "sport": 0}
    assert run(decide, t, "other", "10.0.0.2", fl=9) == {"outcome": NO_ENTRY, **unchanged}
    assert run(decide, t, "", "10.0.0.2", fl=9) == {"outcome": NO_JOB, **unchanged}
    assert run(decide, "-", "job", "10.0.0.2", fl=9) == {"outcome": NO_TABLE, **unchanged}


def test_bad_tables_fail_open(tmp_path: Path, decide: Path) -> None:
    good = Path(table(tmp_path / "good", Decision("job", None, 1, 26, 104, 50000, 7)))
    raw = good.read_bytes()
    future = bytearray(raw)
    future[8] = 2  # version 2
    bad = {"truncated": raw[:64 + 100], "garbage": os.urandom(len(raw)),
           "future": bytes(future), "empty": b"", "header-only": raw[:64]}
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
        got = run(decide, str(tmp_path / name), "job", "10.0.0.2", fl=3)
        assert got == {"outcome": BAD_TABLE, "flow_label": 3, "traffic_class": 40,
                       "sport": 0}, name


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "job-long-name"]),
                          st.sampled_from([None, "10.0.0.1", "10.0.0.2", "fd00::7"]),
                          st.integers(0, 7), st.integers(0, 63),
                          st.sampled_from([0, 4791, 0xC000, 0xD00D, 0xFFFF])),
                unique_by=lambda t: (t[0], t[1]), max_size=8),
       st.sampled_from(["a", "b", "c"]), st.sampled_from(["10.0.0.1", "10.0.0.2", "fd00::7"]))
def test_c_core_agrees_with_python(tmp_path_factory: pytest.TempPathFactory, decide: Path,
                                   rows: list[tuple[str, str | None, int, int, int]],
                                   job: str, peer: str) -> None:
    path = tmp_path_factory.mktemp("t") / "d"
    table(path, *(Decision(j, p, lvl, dscp, dscp << 2, sport, 7)
                  for j, p, lvl, dscp, sport in rows))
    want = steering_for(str(path), job, peer)
    got = run(decide, str(path), job, peer, tc=12, fl=5)
    if want.reason:
        assert got == {"outcome": NO_ENTRY, "flow_label": 5, "traffic_class": 12, "sport": 0}
        return
    assert got["traffic_class"] == want.tclass and got["sport"] == want.sport
    if want.sport >= 0xC000:
        assert (got["outcome"], sport_of(got["flow_label"])) == (0, want.sport)
    else:
        assert got["flow_label"] == 5
        assert got["outcome"] == (SPORT_RANGE if want.sport else 0)


def test_qp_records_round_trip(tmp_path: Path, decide: Path) -> None:
    t = table(tmp_path / "d", Decision("job", "10.0.0.2", 3, 26, 104, 50000, 7))
    rec = tmp_path / "qps" / str(os.getpid())  # named as the shim names it: by pid
    rec.parent.mkdir()
    run(decide, t, "job", "10.0.0.2", records=str(rec))
    p = parse(rec.read_bytes())
    assert p.job_id == "job" and p.calls == 1 and p.counters["applied"] == 1
    (q,) = p.qps
    assert (q.peer, q.outcome, q.sport, q.flow_label, q.traffic_class, q.dscp, q.level,
            q.device, q.qpn, q.dest_qpn, q.plan_generation) == (
        "10.0.0.2", "applied", 50000, 50000 & 0x3FFF, 104, 26, 3, "mlx5_0", 17, 18, 7)
    # decide_check wrote its own pid into the header: a dead process, pruned by the agent
    live, problems = read_dir(tmp_path / "qps", prune=True)
    assert live == [] and len(problems) == 1 and "header says pid" in problems[0]
    (tmp_path / "qps" / "123").write_bytes(b"junk")
    _, problems = read_dir(tmp_path / "qps")
    assert any("shorter than" in p for p in problems)


def test_wrapper_exports_and_nccl_style_loading(tmp_path: Path) -> None:
    if not verbs_headers():
        pytest.skip("rdma-core headers missing (apt-get install libibverbs-dev)")
    lib = native.library(native.IBVERBS)
    syms = subprocess.run(["objdump", "-T", str(lib)], capture_output=True, text=True).stdout
    exported = sorted(line.split()[-1] for line in syms.splitlines()
                      if " DF .text" in line and "IBVERBS_1.1" in line)
    # modify/destroy for decisions; create/close for the PCIe gate (crux_gate.h)
    assert exported == ["ibv_close_device", "ibv_create_qp", "ibv_destroy_qp", "ibv_modify_qp"]
    prog = build(tmp_path, "rc_pair_nccl", ["tests/c/rc_pair.c"])
    # It resolves every symbol NCCL resolves through the wrapper's handle first, then needs
    # devices: on a host without RDMA getting that far is the proof the loading works.
    r = subprocess.run([str(prog)], env={**os.environ, "NCCL_IBVERBS_LIB": str(lib)},
                       capture_output=True, text=True)
    assert "dlvsym" not in r.stderr and "dlopen" not in r.stderr, r.stderr
    assert r.returncode == 0 or "no RDMA device" in r.stderr


def test_hostile_records_files_are_reported_not_followed(tmp_path: Path) -> None:
    """The records directory is writable by every job: a link, a FIFO or an oversized file is
    a problem to report, never something to follow, block on, or read whole."""
    d = tmp_path / "qps"
    d.mkdir()
    (d / "101").symlink_to("/dev/zero")
    os.mkfifo(d / "102")
    with open(d / "103", "wb") as f:  # sparse: a header claiming more than the shim writes
        f.truncate(64 << 20)
    live, problems = read_dir(d)
    assert live == []
    assert sorted(p.split(":")[0].rsplit("/", 1)[1] for p in problems) == ["101", "102", "103"]
    assert any("not a regular file" in p for p in problems)
