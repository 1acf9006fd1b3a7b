"""Shared fixtures and hooks. Tests needing root, RDMA or a GPU are marked and skip with a
reason. Constants live in tests/paths.py, helpers in modules of their own: tests import
those, never this file."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.paths import EXAMPLES


def pytest_configure(config: pytest.Config) -> None:
    # no per-example deadline: a loaded machine must not fail a property test
    settings.register_profile("ci", deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("ci")
    # pytest's readline import exports the terminal's COLUMNS/LINES to every subprocess; the
    # commands honour COLUMNS, so a test that wants a width sets one itself
    os.unsetenv("COLUMNS")
    os.unsetenv("LINES")
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root (network namespaces, raw sockets)")
        for item in items:
            if "root" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def examples() -> Path:
    return EXAMPLES


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory short enough for a Unix socket path (pytest's tmp_path may not be)."""
    d = Path(tempfile.mkdtemp(prefix="crux-src-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)
