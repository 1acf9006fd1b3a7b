"""Acting as another local user in tests (root only): `nobody`, uid and gid 65534."""

from __future__ import annotations

import os
from collections.abc import Callable

# for programs: setpriv execs them as nobody
SETPRIV = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def as_nobody(body: Callable[[], str]) -> str:
    """What `body` returns when run in a forked child turned nobody (or the repr of what it
    raised). Forked, not exec'd: the venv's interpreter may not be executable by nobody."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: become nobody, run, report through the pipe
        code = 99
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, body().encode())
            code = 0
        except BaseException as exc:  # reported through the pipe
            os.write(write, repr(exc).encode())
        finally:
            os._exit(code)
    os.close(write)
    _, st = os.waitpid(pid, 0)
    answer = os.read(read, 4096).decode()
    os.close(read)
    assert os.waitstatus_to_exitcode(st) == 0, answer
    return answer
