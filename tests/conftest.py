"""Shared fixtures. Tests needing root, RDMA or a GPU are marked and skip with a reason."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
SHARED = REPO.parent / "shared"

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root (network namespaces, raw sockets)")
        for item in items:
            if "root" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def examples() -> Path:
    return EXAMPLES


def one_error_line(run: subprocess.CompletedProcess[str]) -> str:
    """The bad-input contract: exit 2, one `cruxctl: error:` line, no traceback, no stdout."""
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("cruxctl: error: ")
    assert run.stdout == ""
    return lines[0]
