"""The command-line tools' bad-input contract, asserted the same way by every CLI test."""

from __future__ import annotations

import subprocess


def one_error_line(run: subprocess.CompletedProcess[str]) -> str:
    """The bad-input contract: exit 2, one `cruxctl: error:` line, no traceback, no stdout."""
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("cruxctl: error: ")
    assert run.stdout == ""
    return lines[0]
