"""Compile the C test programs in tests/c/ for a test session (skips when gcc is missing)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CFLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", f"-I{REPO / 'shim'}",
          f"-I{REPO / 'tests' / 'c'}"]


def verbs_headers() -> bool:
    return Path("/usr/include/infiniband/verbs.h").exists()


def build(out: Path, name: str, sources: list[str], *extra: str, verbs: bool = True) -> Path:
    """out/name from sources (paths relative to the repo); skips the test without gcc or,
    for programs using verbs.h (`verbs`), without the rdma-core headers (libibverbs-dev)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not found: these tests compile tests/c/*.c")
    if verbs and not verbs_headers():
        pytest.skip("rdma-core headers missing (apt-get install libibverbs-dev)")
    run = subprocess.run([gcc, *CFLAGS, *(str(REPO / s) for s in sources), "-o",
                          str(out / name), *extra], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return out / name
