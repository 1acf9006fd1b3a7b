"""Live re-path of mlx5 QPs (shim/crux_repath.c), driven without a NIC.

An mlx5 NIC cannot exist here, so tests/c/fake_mlx5.c stands in for libmlx5.so.1's two calls
(same names and signatures, soname libmlx5.so.1, found the way the wrapper finds the real one:
already loaded). Without it in the process nothing is tracked: on rxe and every other NIC a
changed decision stays pending until the job reconnects (tests/test_rdma.py, docs/shim.md).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.cbuild import build


def test_mlx5_qps_follow_a_moved_decision(tmp_path: Path) -> None:
    fake = build(tmp_path, "libmlx5.so.1", ["tests/c/fake_mlx5.c"], "-shared", "-fPIC",
                 "-Wl,-soname,libmlx5.so.1")
    prog = build(tmp_path, "repath_check", ["tests/c/repath_check.c", "shim/crux_repath.c"],
                 "-pthread", "-ldl")
    r = subprocess.run([str(prog), str(fake)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
    assert "re-pathed to source port 53250" in r.stderr  # 0xD002, logged
    assert "refused" in r.stderr
    assert "re-pathed to source port 49443" in r.stderr  # 0xC123: a QP made before the plan


def test_without_libmlx5_nothing_is_tracked(tmp_path: Path) -> None:
    prog = build(tmp_path, "repath_check", ["tests/c/repath_check.c", "shim/crux_repath.c"],
                 "-pthread", "-ldl")
    r = subprocess.run([str(prog)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
