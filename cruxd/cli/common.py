"""What the cruxctl subcommands share: the scenario argument and the output console."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from cruxd.errors import UsageError
from cruxd.scenario.shipped import bundled, bundled_names

if TYPE_CHECKING:
    from rich.console import Console

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


UNBOUNDED = 100_000  # columns on a pipe or file: no line is ever cut or wrapped


def console(stderr: bool = False) -> Console:
    """The console a command prints to (stdout, or stderr for progress).

    Width: $COLUMNS when set, else the terminal's; on a pipe or file, unbounded (text is not
    wrapped, tables are as wide as their content). NO_COLOR (set, not empty) removes every
    style: rich's own NO_COLOR handling drops colours but keeps bold and dim, and with no
    colour system rich writes no escape codes at all.
    """
    from rich.console import Console  # here: commands that print JSON never load rich

    env = os.environ
    wide = not _isatty(sys.stderr if stderr else sys.stdout) and not env.get(
        "COLUMNS", "").isdigit()
    # emoji off: ":x:" in a job id is two colons and an x, not a picture (safe_text.py)
    return Console(stderr=stderr, width=UNBOUNDED if wide else None, soft_wrap=wide,
                   color_system=None if env.get("NO_COLOR", "") != "" else "auto", emoji=False)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False
