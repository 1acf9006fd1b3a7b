"""Root-logger setup for cruxd: native journal entries under systemd, JSON lines on request,
timestamped text otherwise ([daemon] log_format, docs/configuration.md).

Structured fields: a log call may pass `extra={"crux_job": ..., "host": ..., "generation":
...}`. The journal gets them as CRUX_JOB, CRUX_HOST and CRUX_GENERATION (`journalctl
CRUX_JOB=gpt`), JSON lines as keys of their own; text shows the message alone.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

JOURNAL_SOCKET = Path("/run/systemd/journal/socket")
FIELDS = {"crux_job": "CRUX_JOB", "host": "CRUX_HOST", "generation": "CRUX_GENERATION"}
MAX_ENTRY = 64 << 10  # a datagram this large always goes; a longer message is cut to fit

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


def _fields(record: logging.LogRecord) -> dict[str, str]:
    return {key: str(getattr(record, key)) for key in FIELDS if hasattr(record, key)}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, the structured
    fields a call passed, and the traceback as `exc`."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name,
            "message": record.getMessage(), **_fields(record)}
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


class JournalHandler(logging.Handler):
    """Entries in journald's native protocol (a datagram of fields on its socket), so that
    the structured fields are journal fields; an entry the socket refuses goes to stderr
    with the journal's priority prefix instead, never lost and never raising."""

    def __init__(self, path: Path = JOURNAL_SOCKET, identifier: str = "cruxd",
                 stream: TextIO | None = None) -> None:
        super().__init__()
        self.path, self.identifier = path, identifier
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.fallback = logging.StreamHandler(sys.stderr if stream is None else stream)
        self.fallback.setFormatter(JournalFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = f"{record.name}: {record.getMessage()}"
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            fields = {"MESSAGE": message[:MAX_ENTRY - 4096],
                      "PRIORITY": str(syslog_priority(record.levelno)),
                      "SYSLOG_IDENTIFIER": self.identifier, "LOGGER": record.name,
                      "CODE_FILE": record.pathname, "CODE_LINE": str(record.lineno),
                      "CODE_FUNC": record.funcName,
                      **{FIELDS[k]: v for k, v in _fields(record).items()}}
            self.sock.sendto(_entry(fields), str(self.path))
        except (OSError, ValueError):
            self.fallback.emit(record)

    def close(self) -> None:
        self.sock.close()
        super().close()


def _entry(fields: Mapping[str, str]) -> bytes:
    """journald's native format: KEY=value lines; a value with a newline as KEY, then its
    length (64-bit little-endian), the bytes and a newline."""
    out = bytearray()
    for key, value in fields.items():
        raw = value.encode("utf-8", "replace")
        if b"\n" in raw:
            out += key.encode() + b"\n" + struct.pack("<Q", len(raw)) + raw + b"\n"
        else:
            out += key.encode() + b"=" + raw + b"\n"
    return bytes(out)


def _level(name: str) -> int:
    try:
        return LEVELS[name.lower()]
    except KeyError:
        accepted = ", ".join(LEVELS)
        raise ValueError(f"unknown log level {name!r}; expected one of: {accepted}") from None


def setup_logging(
    level: str, env: Mapping[str, str] = os.environ, stream: TextIO | None = None,
    log_format: str = "auto", journal: Path = JOURNAL_SOCKET,
) -> None:
    """Send all logging at `level`, replacing any root handlers: to the journal's socket
    (`journal`), or to `stream` (sys.stderr as it is at call time) as JSON lines or text.

    Meant for main() only: a daemon owns its process's logging. "auto" is the journal when
    systemd runs us (JOURNAL_STREAM: stderr goes to the journal) and its socket is there,
    else the journal's priority prefix on stderr under systemd, else text.
    """
    levelno = _level(level)
    under_systemd = bool(env.get("JOURNAL_STREAM"))
    if log_format == "auto":
        log_format = "journal" if under_systemd and journal.exists() else "text"
    handler: logging.Handler
    if log_format == "journal":
        handler = JournalHandler(journal, stream=stream)
    else:
        handler = logging.StreamHandler(sys.stderr if stream is None else stream)
        if log_format == "json":
            handler.setFormatter(JsonFormatter())
        elif under_systemd:
            handler.setFormatter(JournalFormatter())
        else:
            handler.setFormatter(
                logging.Formatter(
                    "%(asctime)s %(levelname)s %(name)s: %(message)s",
                    datefmt="%Y-%m-%d %H:%M:%S"
                )
            )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if isinstance(old, JournalHandler):  # ours: its socket goes with it (a reload)
            old.close()
    root.addHandler(handler)
    root.setLevel(levelno)
