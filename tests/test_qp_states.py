"""The agent's view of the shims' QPs: applied, pending or fail-open against the table now."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from cruxd.agent.dataplane import DataPlane
from transport.decision_table import Decision, TableWriter
from transport.qp_records import _HEADER, _RECORD, MAGIC, OUTCOMES

B = bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 2])  # ::ffff:10.0.0.2


def records_file(path: Path, pid: int, job: str,
                 qps: list[tuple[int, str, int, int]]) -> None:
    """A records file as the shim writes it: (qpn, outcome, sport, traffic class) per QP."""
    counters = [0] * len(OUTCOMES)
    body = b""
    for qpn, outcome, sport, tc in qps:
        counters[OUTCOMES.index(outcome)] += 1
        body += _RECORD.pack(2, 1, OUTCOMES.index(outcome), 1, 3, qpn, qpn + 1, 0,
                             sport & 0x3FFF, sport, 40, tc, 1, tc >> 2, B, b"mlx5_0", 5, 9, 0,
                             0, 0, 0)
    head = _HEADER.pack(MAGIC, 1, 192, 128, len(qps), pid, len(qps), *counters,
                        job.encode(), len(qps), 0, 0, 0)
    path.write_bytes(head + body)


def test_states_against_the_table_now(tmp_path: Path) -> None:
    table = tmp_path / "decisions"
    with TableWriter.open(table, capacity=16) as w:
        w.apply([Decision("job", "10.0.0.2", 1, 26, 104, 50000, 5)], 5)
        dp = DataPlane(table, sysfs_root=str(tmp_path / "nosys"))
        dp.start()
        assert dp.qp_dir.stat().st_mode & 0o7777 == 0o1777 and dp.pcie_links == 0
        records_file(dp.qp_dir / str(os.getpid()), os.getpid(), "job", [
            (1, "applied", 50000, 104),   # carries today's decision
            (2, "applied", 50001, 104),   # connected under an older decision
            (3, "no-table", 0, 40),       # connected before the table existed
        ])
        records_file(dp.qp_dir / str(os.getpid() + 1), os.getpid(), "x", [])  # wrong pid
        got = {q.qpn: (q.state, q.want_sport) for q in dp.qp_status()}
        assert got == {1: ("applied", 50000), 2: ("pending", 50000), 3: ("pending", 50000)}
        assert len(dp.problems) == 1 and "header says pid" in dp.problems[0]
        w.apply([], 6)  # the job's decision is gone
        got = {q.qpn: q.state for q in dp.qp_status()}
        assert got == {1: "pending", 2: "pending", 3: "fail-open"}


def test_dead_processes_are_pruned_and_bad_files_kept(tmp_path: Path) -> None:
    dp = DataPlane(tmp_path / "decisions", sysfs_root=str(tmp_path))
    dp.start()
    dead = 2**22 + 12345  # above pid_max's default: no such process
    records_file(dp.qp_dir / str(dead), dead, "job", [(1, "applied", 50000, 104)])
    (dp.qp_dir / "77").write_bytes(struct.pack("<Q", 1) * 30)
    assert dp.qp_status() == []
    assert not (dp.qp_dir / str(dead)).exists() and (dp.qp_dir / "77").exists()
    assert any("bad magic" in p for p in dp.problems)
