"""What the cruxctl subcommands share: the scenario argument and the output console."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from cruxd.errors import UsageError
from cruxd.scenario import bundled, bundled_names

DEFAULT_SCENARIO = "testbed96"


def resolve_scenario(arg: str | None) -> Path:
    """A scenario argument as a file: a path, else a bundled name, else the default."""
    if arg is None:
        print(f"cruxctl: no scenario given, planning the bundled '{DEFAULT_SCENARIO}'",
              file=sys.stderr)
        arg = DEFAULT_SCENARIO
    path = Path(arg)
    if path.exists():
        return path
    found = bundled(arg)
    if found is not None:
        return found
    raise UsageError(f"{arg}: no such file, nor a bundled scenario "
                     f"(bundled: {', '.join(bundled_names())})")


def console() -> Console:
    out = Console()
    if not out.is_terminal:  # pipes and logs: wide enough that no number is cut
        out = Console(width=120)
    return out
