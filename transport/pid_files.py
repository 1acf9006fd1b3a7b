"""Per-process files in the shared records directory, read as hostile input.

The job-side libraries each leave one file per process beside the decision table: the verbs
shim `<pid>` (transport/qp_records.py), the socket interposer `sock-<pid>`
(transport/sock_records.py), the NCCL profiler plugin `nccl-<pid>`
(transport/nccl_records.py). The directory is writable by every job, so the agent reads a
name there without trusting it: a regular file no larger than its format allows, never
followed or blocked on, whose pid inside matches its name, and whose owner is its writer's
user (or root), so one user cannot plant records for another's processes. Files of processes
that are gone are removed.

Who the writer is. A name's pid is the writer's getpid(), in the job's pid namespace (a
container's), which is not the agent's. So a writer holds a POSIX write lock on byte 0 of
its file while it lives (shim/crux_recfile.h), and `scan` asks the kernel who holds it
(F_GETLK): the holder's pid comes back in the agent's own pid namespace, and a held lock is a
live process, never a reused pid. The records come back with that pid, so later uses (a
job's process tree, its user) look at the right process. The name may carry `.N` after the
pid: two containers' processes may share a pid. A writer that locks makes its file mode 0444;
such a file without a lock is gone. Any other file without a lock (an older writer's, 0644)
is checked as before: its name's pid, in the agent's namespace, alive and of the file's
owner. docs/shim.md, "Record files and pid namespaces".
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import logging
import os
import re
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

__all__ = ["MAX_FILES", "TornRead", "lock_holder", "pid_alive", "process_ids", "process_uids",
           "read_record", "read_untrusted", "scan"]

# Names read per scan: every job may create files here, and a scan runs on the agent's loop.
MAX_FILES = 16384
READS = 3  # a file whose parse says TornRead is read this often before it counts as bad
LOCKING_MODE = 0o444  # CRUX_RECORD_MODE: its writer holds the lock while it lives (else 0644)
_NAME = re.compile(r"([0-9]+)(?:\.([1-9][0-9]?))?")  # <pid>[.N], crux_recfile.h
# struct flock on 64-bit Linux: l_type, l_whence, (pad), l_start, l_len, l_pid, (pad)
_FLOCK = struct.Struct("@hhqqi4x")


class TornRead(ValueError):
    """`parse` saw a read that raced the writer's rewrite (a checksum that does not match):
    read the file again."""


class _Record(Protocol):
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @property
    def pid(self) -> int: ...

    @property
    def file(self) -> str: ...

    @property
    def owner_uid(self) -> int: ...


T = TypeVar("T", bound=_Record)


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


@dataclass(frozen=True)
class ProcessIds:
    uids: set[int]  # real, effective, saved, filesystem
    nspids: tuple[int, ...]  # its pid in each pid namespace from ours down; () if not said


def process_ids(pid: int, proc: str = "/proc") -> ProcessIds | None:
    """`pid`'s uids and namespace pids (/proc/<pid>/status, readable without privilege);
    None if it is gone."""
    uids: set[int] | None = None
    nspids: tuple[int, ...] = ()
    try:
        with open(f"{proc}/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    uids = {int(u) for u in line.split()[1:]}
                elif line.startswith("NSpid:"):  # Linux >= 4.1
                    nspids = tuple(int(p) for p in line.split()[1:])
    except (OSError, ValueError):
        return None
    return None if uids is None else ProcessIds(uids, nspids)


def process_uids(pid: int, proc: str = "/proc") -> set[int] | None:
    """The real, effective, saved and filesystem uids of `pid`; None if it is gone."""
    ids = process_ids(pid, proc)
    return None if ids is None else ids.uids


def lock_holder(fd: int) -> int | None:
    """Who holds a write lock on byte 0 of `fd`'s file (a record's writer, crux_recfile.h):
    its pid in this process's pid namespace; 0 when it is not visible here (a namespace beside
    or above ours); None when no one does. Never blocks. A read lock, which any reader may
    take, is not a writer's and is not seen (the probe is itself a read lock)."""
    probe = _FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, 0, 1, 0)
    kind, _, _, _, pid = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_GETLK, probe))
    return None if kind == fcntl.F_UNLCK else max(pid, 0)


@dataclass(frozen=True)
class Opened:
    data: bytes  # at most the format's size
    owner: int  # uid
    mode: int  # permission bits
    holder: int | None  # lock_holder
    inode: tuple[int, int]  # (st_dev, st_ino): which file this was


def read_record(path: Path, limit: int) -> Opened:
    """A file a job may have planted, and who holds its lock: a name may be a link (to
    /dev/zero, say), a FIFO or a huge (sparse) file. No links, regular files only, never
    blocking; the format's size at most (what lies beyond is not the format's, and a newer
    writer may add it); read(2), never mmap, which a job truncating its file would turn into
    SIGBUS here. The lock is asked on the same descriptor: the file read. OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return Opened(os.pread(fd, limit, 0), st.st_uid, stat.S_IMODE(st.st_mode),
                      lock_holder(fd), (st.st_dev, st.st_ino))
    finally:
        os.close(fd)  # the agent holds no lock: closing drops none


def read_untrusted(path: Path, limit: int) -> bytes:
    """read_record's bytes."""
    return read_record(path, limit).data


def _parsed(p: Path, limit: int, parse: Callable[[bytes], T]) -> tuple[T, Opened]:
    for attempt in range(READS):
        f = read_record(p, limit)
        try:
            return parse(f.data), f
        except TornRead:
            if attempt == READS - 1:
                raise
    raise AssertionError("unreachable")


def _writer(own: int, suffixed: bool, f: Opened) -> int | str | None:
    """The writer's pid here; None if it is gone; else why the file is refused. `own`: the
    pid the name and header give (the writer's own view)."""
    if f.holder is None:  # gone, unless an older writer's file: its name's pid, here, as before
        if f.mode == LOCKING_MODE or suffixed or not pid_alive(own):
            return None
        writer, uids = own, process_uids(own) or set()
    elif f.holder == 0:
        return "locked by a process outside this pid namespace"
    else:
        ids = process_ids(f.holder)
        if ids is None:  # exited since the probe (its lock is gone: the next scan prunes it)
            return f"its writer {f.holder} is not in /proc"
        if ids.nspids and ids.nspids[-1] != own:
            return f"locked by process {f.holder}, whose own pid is {ids.nspids[-1]}"
        writer, uids = f.holder, ids.uids
    if f.owner != 0 and f.owner not in uids:
        return f"owned by uid {f.owner}, not by process {writer}'s user"
    return writer


def _remove(p: Path, inode: tuple[int, int]) -> None:
    """Unlink `p` if it is still the file read: a new writer may have replaced it since (a
    leftover is replaced by its uid's next process with that pid, crux_recfile.h)."""
    try:
        st = os.lstat(p)
        if (st.st_dev, st.st_ino) == inode:
            p.unlink()
    except FileNotFoundError:
        pass


def scan(root: str | os.PathLike[str], prefix: str, limit: int,
         parse: Callable[[bytes], T], *, prune: bool = False,
         gone: list[T] | None = None) -> tuple[list[T], list[str]]:
    """(parsed files of live processes, problems) for the names `<prefix><pid>[.N]` in `root`.
    `parse` raises ValueError for bytes it does not understand. A record comes back with its
    writer's pid as this process sees it (`pid`, see the module doc) and its file's name
    (`file`). With prune, files of processes that are gone are removed (the agent's job);
    unreadable or foreign files are reported, never removed. `gone` collects the parsed
    files of processes that are gone, with the pid the file says (the job's own view: the
    writer cannot be asked any more; counts, never trust). At most MAX_FILES names are read."""
    out: list[T] = []
    problems: list[str] = []
    try:
        names = sorted(islice((p for p in Path(root).iterdir()
                               if p.name.startswith(prefix)
                               and _NAME.fullmatch(p.name, len(prefix))), MAX_FILES + 1))
    except (FileNotFoundError, NotADirectoryError):
        return out, problems
    if len(names) > MAX_FILES:
        problems.append(f"{root}: more than {MAX_FILES} files; the rest are not read")
        names = names[:MAX_FILES]
    for p in names:
        match = _NAME.fullmatch(p.name, len(prefix))
        assert match is not None
        own = int(match[1])
        try:
            rec, f = _parsed(p, limit, parse)
        except (OSError, ValueError) as exc:
            problems.append(f"{p}: {exc}")
            continue
        if rec.pid != own:
            problems.append(f"{p}: header says pid {rec.pid}")
            continue
        writer = _writer(own, match[2] is not None, f)
        if writer is None:
            if gone is not None:
                gone.append(dataclasses.replace(rec, file=p.name, owner_uid=f.owner))
            if prune:
                _remove(p, f.inode)
        elif isinstance(writer, str):
            problems.append(f"{p}: {writer}")
        else:
            out.append(dataclasses.replace(rec, pid=writer, file=p.name, owner_uid=f.owner))
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
