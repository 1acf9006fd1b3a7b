"""Where the tests find the checkout's files: plain constants, importable from any test."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
FIXTURES = REPO / "tests" / "fixtures"
