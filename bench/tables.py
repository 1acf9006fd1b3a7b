"""Plain aligned text tables for the benchmarks' output."""

from __future__ import annotations

import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                      enumerate(zip(r, widths, strict=True))) for r in cells]
    return "\n".join([line[0], "  ".join("-" * w for w in widths), *line[1:]])


def preamble(*extra: str) -> None:
    """The first lines of every benchmark's output: the exact command that made it, then the
    interpreter, `extra` (library versions, the kernel), the machine and the time."""
    print("$ " + shlex.join(sys.orig_argv))
    env = [f"python {platform.python_version()}", *extra,
           f"{platform.machine()} x{os.cpu_count()} cores", time.strftime("%Y-%m-%d %H:%M:%S")]
    print("# " + ", ".join(env), flush=True)
