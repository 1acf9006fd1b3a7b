"""Per-process files in the shared records directory, read as hostile input.

The job-side libraries each leave one file per process beside the decision table: the verbs
shim `<pid>` (transport/qp_records.py), the socket interposer `sock-<pid>`
(transport/sock_records.py). The directory is writable by every job, so the agent reads a
name there without trusting it, checks the pid inside against the name, and removes the files
of processes that are gone.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

__all__ = ["pid_alive", "read_untrusted", "scan"]


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


def read_untrusted(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of a file a job may have planted: a name may be a link (to
    /dev/zero, say), a FIFO or a huge file. No links, regular files only, never blocking;
    read(2), never mmap, which a job truncating its file would turn into SIGBUS here.
    OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return os.pread(fd, limit, 0)
    finally:
        os.close(fd)


def scan(root: str | os.PathLike[str], prefix: str, limit: int,
         parse: Callable[[bytes], T], *, prune: bool = False) -> tuple[list[T], list[str]]:
    """(parsed files of live processes, problems) for the names `<prefix><pid>` in `root`.
    `parse` raises ValueError for bytes it does not understand. With prune, files of processes
    that are gone are removed (the agent's job); unreadable or foreign files are reported,
    never removed."""
    out: list[T] = []
    problems: list[str] = []
    try:
        # isascii: str.isdigit also takes "²", which int() refuses
        names = sorted(p for p in Path(root).iterdir()
                       if p.name.startswith(prefix) and p.name.isascii()
                       and p.name[len(prefix):].isdigit())
    except (FileNotFoundError, NotADirectoryError):
        return out, problems
    for p in names:
        try:
            rec = parse(read_untrusted(p, limit))
        except (OSError, ValueError) as exc:
            problems.append(f"{p}: {exc}")
            continue
        if rec.pid != int(p.name[len(prefix):]):
            problems.append(f"{p}: header says pid {rec.pid}")
        elif not pid_alive(rec.pid):
            if prune:
                p.unlink(missing_ok=True)
        else:
            out.append(rec)
    return out, problems
