"""A record name another user planted in the shared records directory (issue 37, item 3):
the job-side library passes it by and the job runs on, recorded under the next name
(`sock-<pid>.1`); the planted file is left as it was. Before, the socket interposer opened it
with O_TRUNC and mapped it, and its planter could truncate it under the mapping: SIGBUS, exit
135, in a root job. The verbs wrapper's QP records use the same creation
(shim/crux_recfile.h); the NCCL profiler's are tested in tests/test_nccl_profiler.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from transport import native

# connects to the listener whose port it reads, after printing its pid and a line from stdin
JOB = ("import os, socket, sys\n"
       "print(os.getpid(), flush=True)\n"
       "port = int(sys.stdin.readline())\n"
       "s = socket.create_connection(('127.0.0.1', port))\n"
       "s.sendall(b'x' * 1000)\n"
       "s.close()\n"
       "print('done', flush=True)\n")


def run_job(tmp_path: Path, plant: str | None) -> tuple[subprocess.CompletedProcess[str], Path]:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CRUX_")},
           "LD_PRELOAD": str(native.library(native.SOCK)), "CRUX_JOB_ID": "victim",
           "CRUX_QP_DIR": str(tmp_path), "CRUX_DECISION_TABLE": str(tmp_path / "none"),
           "CRUX_SOCK_LOOPBACK": "1"}
    p = subprocess.Popen([sys.executable, "-c", JOB], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None and p.stdin is not None
    pid = int(p.stdout.readline())
    name = tmp_path / f"sock-{pid}"
    if plant == "other":
        name.write_bytes(b"planted")
        os.chmod(name, 0o666)
        os.chown(name, 65534, 65534)
    elif plant == "ours":  # a leftover of an earlier process of ours with this pid
        name.write_bytes(b"stale")
    p.stdin.write(f"{port}\n")
    p.stdin.flush()
    conn, _ = listener.accept()
    conn.recv(4096)
    out, err = p.communicate(timeout=60)
    conn.close()
    listener.close()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err), name


@pytest.mark.root
def test_a_planted_counter_file_is_refused_and_the_job_runs_on(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the planted file belongs to another uid")
    tmp_path.chmod(0o1777)
    done, name = run_job(tmp_path, "other")
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    assert name.read_bytes() == b"planted" and name.stat().st_uid == 65534
    assert Path(f"{name}.1").stat().st_uid == 0  # the job's own record, beside it
    # a leftover of this uid is replaced by the live process's own record
    done, name = run_job(tmp_path, "ours")
    assert done.returncode == 0
    assert name.stat().st_size > len(b"stale") and name.read_bytes()[:8] != b"stale"
    # and with nothing planted, the record is made as always
    done, name = run_job(tmp_path, None)
    assert done.returncode == 0 and name.stat().st_size > 0
    assert oct(name.stat().st_mode & 0o777) == oct(0o444)  # its writer locks (crux_recfile.h)
