"""One cruxd per state directory: an exclusive flock on `<state_dir>/cruxd.lock`.

Two daemons on one state directory would both restore, save and rewrite the same leader
state file and agent journal, each over the other's (issue 31: a second cruxd that failed
on its port rewrote the running leader's state on its way out). So `cruxd` takes this lock
before it reads or writes anything in its state or runtime directory, and a second one
whose lock is held exits 2 with one line naming the holder, having touched nothing.

The lock is a `flock(LOCK_EX | LOCK_NB)` on a file that is never removed: the kernel drops
it when the holder's descriptor closes, which happens on any exit, SIGKILL included, so a
crashed daemon never leaves a stale lock behind. The file holds the holder's pid (written
only once the lock is held) for the refusal to name; its presence means nothing by itself.
Do not delete it while cruxd runs: a daemon started after that would lock a new file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from pathlib import Path

from cruxd.errors import UsageError

LOCK_NAME = "cruxd.lock"
# the holder writes its pid right after it takes the lock: a refusal that lands between
# the two waits this long for it before calling the holder unknown
_PID_WAIT_S = 0.5


class InstanceLock:
    """The held lock; it lasts as long as `fd` is open (`release`, or the process's end)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock; the file stays for the next one
            self.fd = -1


def acquire(state_dir: Path) -> InstanceLock:
    """Take `<state_dir>/cruxd.lock` or raise UsageError (exit status 2): held by another
    process (naming its pid), or not a file this process can lock.

    The file is opened without O_TRUNC and written only after the lock is taken, so a
    refused daemon leaves it byte for byte as the holder wrote it."""
    path = state_dir / LOCK_NAME
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o640)
    except OSError as exc:
        why = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot open: {exc.strerror}"
        raise UsageError(f"{path} {why}", where="daemon.state_dir") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # O_NONBLOCK: a FIFO there did not hang
            raise UsageError(f"{path} is not a regular file", where="daemon.state_dir")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"another cruxd ({_holder(fd)}) holds {path}; stop it first, "
                             "or give this one its own daemon.state_dir") from None
        except OSError as exc:  # ENOLCK: a file system without locks (some NFS mounts)
            raise UsageError(f"cannot lock {path}: {exc.strerror}",
                             where="daemon.state_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return InstanceLock(path, fd)


def _holder(fd: int) -> str:
    """'pid N' from the lock file, read through the refused daemon's own descriptor."""
    end = time.monotonic() + _PID_WAIT_S
    while True:
        with contextlib.suppress(OSError, ValueError):
            pid = int(os.pread(fd, 32, 0).decode().strip())
            if pid > 0:
                return f"pid {pid}"
        if time.monotonic() >= end:
            return "pid unknown"
        time.sleep(0.02)
