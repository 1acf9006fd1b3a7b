"""Per-process files in the shared records directory, read as hostile input.

The job-side libraries each leave one file per process beside the decision table: the verbs
shim `<pid>` (transport/qp_records.py), the socket interposer `sock-<pid>`
(transport/sock_records.py). The directory is writable by every job, so the agent reads a
name there without trusting it: a regular file no larger than its format allows, never
followed or blocked on, whose pid inside matches its name and whose owner is that process's
user (or root), so one user cannot plant records for another's processes. Files of processes
that are gone are removed.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Protocol, TypeVar

__all__ = ["MAX_FILES", "TornRead", "pid_alive", "process_uids", "read_untrusted", "scan"]

# Names read per scan: every job may create files here, and a scan runs on the agent's loop.
MAX_FILES = 16384
READS = 3  # a file whose parse says TornRead is read this often before it counts as bad


class TornRead(ValueError):
    """`parse` saw a read that raced the writer's rewrite (a checksum that does not match):
    read the file again."""


class _HasPid(Protocol):
    @property
    def pid(self) -> int: ...


T = TypeVar("T", bound=_HasPid)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) holds no QPs and opens no sockets
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def process_uids(pid: int, proc: str = "/proc") -> set[int] | None:
    """The real, effective, saved and filesystem uids of `pid`; None if it is gone."""
    try:
        with open(f"{proc}/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return {int(u) for u in line.split()[1:]}
    except (OSError, ValueError):
        pass
    return None


def read_owned(path: Path, limit: int) -> tuple[bytes, int]:
    """(at most the first `limit` bytes, the owner uid) of a file a job may have planted: a
    name may be a link (to /dev/zero, say), a FIFO or a huge (sparse) file. No links,
    regular files only, never blocking; the format's size at most (what lies beyond is not
    the format's, and a newer writer may add it); read(2), never mmap, which a job truncating
    its file would turn into SIGBUS here. OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return os.pread(fd, limit, 0), st.st_uid
    finally:
        os.close(fd)


def read_untrusted(path: Path, limit: int) -> bytes:
    """read_owned's bytes."""
    return read_owned(path, limit)[0]


def scan(root: str | os.PathLike[str], prefix: str, limit: int,
         parse: Callable[[bytes], T], *, prune: bool = False,
         gone: list[T] | None = None) -> tuple[list[T], list[str]]:
    """(parsed files of live processes, problems) for the names `<prefix><pid>` in `root`.
    `parse` raises ValueError for bytes it does not understand. With prune, files of processes
    that are gone are removed (the agent's job); unreadable or foreign files are reported,
    never removed. `gone` collects the parsed files of processes that are gone (their owner
    cannot be checked any more: counts, never trust). At most MAX_FILES names are read."""
    out: list[T] = []
    problems: list[str] = []
    try:
        # isascii: str.isdigit also takes "²", which int() refuses
        names = sorted(islice((p for p in Path(root).iterdir()
                               if p.name.startswith(prefix) and p.name.isascii()
                               and p.name[len(prefix):].isdigit()), MAX_FILES + 1))
    except (FileNotFoundError, NotADirectoryError):
        return out, problems
    if len(names) > MAX_FILES:
        problems.append(f"{root}: more than {MAX_FILES} files; the rest are not read")
        names = names[:MAX_FILES]
    for p in names:
        try:
            for attempt in range(READS):
                data, owner = read_owned(p, limit)
                try:
                    rec = parse(data)
                    break
                except TornRead:
                    if attempt == READS - 1:
                        raise
        except (OSError, ValueError) as exc:
            problems.append(f"{p}: {exc}")
            continue
        if rec.pid != int(p.name[len(prefix):]):
            problems.append(f"{p}: header says pid {rec.pid}")
        elif not pid_alive(rec.pid):
            if gone is not None:
                gone.append(rec)
            if prune:
                p.unlink(missing_ok=True)
        elif owner != 0 and owner not in (process_uids(rec.pid) or ()):
            problems.append(f"{p}: owned by uid {owner}, not by process {rec.pid}'s user")
        else:
            out.append(rec)
    return out, problems


class SkippedFiles:
    """Files a scan refused (hostile or broken), counted over all scans and warned about at
    most once every `every_s`: any job can fill the directory with junk, and a warning per
    scan would flood the journal. Each refusal is also logged at debug level."""

    def __init__(self, log: logging.Logger, every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.every_s, self.clock = log, every_s, clock
        self.count = 0
        self._logged = -every_s

    def note(self, what: str, problems: list[str]) -> None:
        if not problems:
            return
        self.count += len(problems)
        now = self.clock()
        if now - self._logged >= self.every_s:
            self._logged = now
            self.log.warning("%s: %d file(s) skipped (%d in all so far), e.g. %s", what,
                             len(problems), self.count, problems[0])
        for p in problems:
            self.log.debug("%s: %s", what, p)
