"""Root-logger setup for cruxd: journald-aware under systemd, timestamped otherwise."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TextIO

LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

# sd-daemon(3) / syslog priorities, highest logging level first.
_PRIORITIES = (
    (logging.CRITICAL, 2),
    (logging.ERROR, 3),
    (logging.WARNING, 4),
    (logging.INFO, 6),
)
_DEBUG_PRIORITY = 7


def syslog_priority(levelno: int) -> int:
    """The syslog priority for a logging level (custom levels round down)."""
    for floor, priority in _PRIORITIES:
        if levelno >= floor:
            return priority
    return _DEBUG_PRIORITY


class JournalFormatter(logging.Formatter):
    """`<N>logger: message`, the stderr prefix journald turns into a priority.

    No timestamp: journald stamps each entry itself. Every line of a multi-line
    record (a traceback) gets the prefix, since journald splits the stream at
    newlines and an unprefixed line would be filed at the default priority.
    """

    def __init__(self) -> None:
        super().__init__("%(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).splitlines())


def _level(name: str) -> int:
    try:
        return LEVELS[name.lower()]
    except KeyError:
        accepted = ", ".join(LEVELS)
        raise ValueError(f"unknown log level {name!r}; expected one of: {accepted}") from None


def setup_logging(
    level: str, env: Mapping[str, str] = os.environ, stream: TextIO | None = None
) -> None:
    """Send all logging to `stream` at `level`, replacing any root handlers.

    `stream` defaults to sys.stderr as it is at call time, not at import time.

    Meant for main() only: a daemon owns its process's logging. JOURNAL_STREAM is
    set by systemd when stderr goes to the journal.
    """
    levelno = _level(level)
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    if env.get("JOURNAL_STREAM"):
        handler.setFormatter(JournalFormatter())
    else:
        handler.setFormatter(
            logging.Formatter(
                "%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%Y-%m-%d %H:%M:%S"
            )
        )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(levelno)
