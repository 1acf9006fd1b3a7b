"""The job-side records from a job in its own pid namespace (a container without the host's
pids): the agent finds each record's writer by the lock it holds on its file
(shim/crux_recfile.h), as a pid in the agent's own namespace (transport/pid_files.py).

Jobs run under `unshare --pid --fork --mount-proc`, so their own pid is 1, which on the host
is init: the name's pid says nothing about the writer there. The socket interposer and the
NCCL profiler plugin (driven by its harness, without NCCL) write their real records, and so
does the verbs wrapper, on a fake QP over a fake libibverbs (tests/c/fake_ibverbs.c). The
QP records' reader is also fed a file that a process in a child namespace holds locked.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench._make import BUILD, ensure_built
from cruxd.agent.process_tree import belongs
from tests.cbuild import build
from tests.nobody import SETPRIV
from transport import native, nccl_records, qp_records, sock_records
from transport.pid_files import lock_holder, process_uids

pytestmark = pytest.mark.root

UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]
PY = "/usr/bin/python3"  # the jobs need the standard library only, and nobody may run it

# The job: connects, says its pid, then takes commands on stdin until it closes.
JOB = r"""
import ctypes, json, os, socket, sys
port = int(sys.argv[1])
keep = [socket.create_connection(("127.0.0.1", port))]
keep[0].sendall(b"x" * 1000)
print(os.getpid(), flush=True)

def record_fds():
    out = []
    for n in os.listdir("/proc/self/fd"):
        try:
            if "/sock-" in os.readlink(f"/proc/self/fd/{n}"):
                out.append(int(n))
        except OSError:
            pass
    return out

for line in sys.stdin:
    cmd = line.strip()
    if cmd == "exec":  # the same program again, exec'd: it connects and says its pid
        import time; time.sleep(0.05)  # a later created_ns (a coarse clock)
        os.execv(sys.executable, [sys.executable, *sys.argv])
    if cmd == "close-all":  # what a daemonising program does: close every descriptor
        (fd,) = record_fds()
        try:
            os.close(fd)
            errno = 0
        except OSError as exc:
            errno = exc.errno
        os.closerange(3, 1 << 16)
        ctypes.CDLL(None).closefrom(3)
        kept = record_fds()
        os.dup2(0, fd)  # and one that wants that number for itself
        print(json.dumps({"errno": errno, "kept": kept, "before": fd, "after": record_fds(),
                          "taken": os.readlink(f"/proc/self/fd/{fd}")}), flush=True)
"""

# Holds a write lock on byte 0 of the file it is given, as the job-side libraries do.
LOCKER = r"""
import fcntl, os, sys
f = open(sys.argv[1], "r+b")
fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
print(os.getpid(), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def shared() -> Iterator[Path]:
    """A records directory every user can reach (pytest's tmp_path is root's alone)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: pid namespaces and another uid")
    top = Path(tempfile.mkdtemp(prefix="crux-pidns-"))
    top.chmod(0o755)
    (top / "qps").mkdir(mode=0o1777)
    (top / "qps").chmod(0o1777)
    (top / "job.py").write_text(JOB)
    (top / "locker.py").write_text(LOCKER)
    yield top
    shutil.rmtree(top)


@pytest.fixture
def server() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0), backlog=64) as s:
        yield s


def forked_child(pid: int) -> int:
    """The process `unshare --fork` (pid) started: pid 1 of the new namespace."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    end = time.monotonic() + 10
    while time.monotonic() < end:
        kids = path.read_text().split() if path.exists() else []
        if kids:
            return int(kids[0])
        time.sleep(0.02)
    raise AssertionError(f"unshare {pid} started nothing")


class Proc:
    """A program in a new pid namespace; `own` its pid there, `host` its pid here."""

    def __init__(self, argv: list[str], env: dict[str, str], user: bool = False) -> None:
        self.p = subprocess.Popen([*UNSHARE, *(SETPRIV if user else []), *argv],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True,
                                  env={"PATH": os.environ["PATH"], **env})
        self.own = int(self.line().split()[-1])
        self.host = forked_child(self.p.pid)

    def line(self) -> str:
        assert self.p.stdout is not None
        got = self.p.stdout.readline()
        assert got, self.p.stderr.read() if self.p.stderr else "exited"
        return got

    def say(self, cmd: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def end(self) -> None:
        if self.p.stdin is not None:
            self.p.stdin.close()
        self.p.wait(timeout=30)
        assert not Path(f"/proc/{self.host}").exists()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    made: list[Proc] = []
    yield made
    for p in made:
        p.p.kill()
        p.p.wait()


def sock_job(shared: Path, server: socket.socket, procs: list[Proc], user: bool = False,
             job: str = "pidns") -> Proc:
    env = {"CRUX_JOB_ID": job, "CRUX_QP_DIR": str(shared / "qps"),
           "CRUX_DECISION_TABLE": str(shared / "none"), "CRUX_SOCK_LOOPBACK": "1"}
    p = Proc(["env", f"LD_PRELOAD={native.library(native.SOCK)}", PY, str(shared / "job.py"),
              str(server.getsockname()[1])], env, user)
    procs.append(p)
    return p


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_a_record_is_its_writers_by_the_hosts_pid(shared: Path, server: socket.socket,
                                                  procs: list[Proc], user: str) -> None:
    job = sock_job(shared, server, procs, user == "nobody")
    assert job.own == 1 != job.host
    qps = shared / "qps"
    recs, problems = sock_records.read_dir(qps)
    assert problems == []
    assert [(r.pid, r.file, r.job_id, r.bytes_sent) for r in recs] == [
        (job.host, "sock-1", "pidns", 1000)]
    uid = 65534 if user == "nobody" else 0
    # the owner checked against the writer, not against the host's pid 1 (init, root's)
    assert (qps / "sock-1").stat().st_uid == uid and process_uids(job.host) == {uid}
    assert belongs(recs[0].pid, {job.p.pid})  # the job's process tree: unshare started it
    # exited: gone, though the host's pid 1 lives (and is root's, as a root job's file is)
    job.end()
    gone: list[sock_records.SockCounts] = []
    assert sock_records.read_dir(qps, prune=True, gone=gone) == ([], [])
    assert [(g.pid, g.file, g.bytes_sent) for g in gone] == [(1, "sock-1", 1000)]
    assert not (qps / "sock-1").exists()


def test_two_namespaces_that_share_a_pid_keep_a_record_each(
        shared: Path, server: socket.socket, procs: list[Proc]) -> None:
    a = sock_job(shared, server, procs, job="a")
    b = sock_job(shared, server, procs, job="b")
    assert a.own == b.own == 1
    recs, problems = sock_records.read_dir(shared / "qps")
    assert problems == []
    assert {(r.file, r.pid, r.job_id) for r in recs} == {
        ("sock-1", a.host, "a"), ("sock-1.1", b.host, "b")}
    a.end()
    recs, _ = sock_records.read_dir(shared / "qps", prune=True)
    assert [(r.file, r.pid) for r in recs] == [("sock-1.1", b.host)]
    c = sock_job(shared, server, procs, job="c")  # the free name again
    recs, _ = sock_records.read_dir(shared / "qps")
    assert {(r.file, r.pid) for r in recs} == {("sock-1", c.host), ("sock-1.1", b.host)}


def test_the_program_a_job_execs_replaces_its_record(shared: Path, server: socket.socket,
                                                    procs: list[Proc]) -> None:
    job = sock_job(shared, server, procs)
    (before,) = sock_records.read_dir(shared / "qps")[0]
    job.say("exec")  # the lock goes with exec (close-on-exec); the new program's file replaces
    assert int(job.line()) == 1
    recs, problems = sock_records.read_dir(shared / "qps")
    assert problems == [] and [(r.file, r.pid) for r in recs] == [("sock-1", job.host)]
    assert recs[0].created_ns > before.created_ns


def test_the_program_cannot_close_the_records_descriptor(shared: Path, server: socket.socket,
                                                        procs: list[Proc]) -> None:
    job = sock_job(shared, server, procs)
    job.say("close-all")
    got: dict[str, Any] = json.loads(job.line())
    assert got["errno"] == 9  # EBADF: not the program's descriptor
    assert got["kept"] == [got["before"]]  # closerange and closefrom passed it by
    assert got["taken"].startswith("pipe:")  # dup2 got the number the program asked for
    assert len(got["after"]) == 1 and got["after"] != [got["before"]]  # the record moved
    recs, problems = sock_records.read_dir(shared / "qps")
    assert problems == [] and [r.pid for r in recs] == [job.host]  # and locked again


def sock_bytes(pid: int, job: str) -> bytes:
    counters = [0] * sock_records.COUNTERS
    return sock_records._REC.pack(sock_records.MAGIC, 1, 256, pid, len(sock_records.OUTCOMES),
                                  0, job.encode(), *counters, 5, 0)


def plant(path: Path, data: bytes, uid: int, mode: int) -> None:
    path.write_bytes(data)
    os.chown(path, uid, uid)
    path.chmod(mode)


def test_planted_records_are_refused(shared: Path, procs: list[Proc]) -> None:
    """Another user's files named after root's live processes: one with no lock (an older
    writer's mode) is refused on its owner, as before; one that says its writer locks, and
    holds no lock, is gone; one locked by its planter is refused, its planter's pid not the
    name's."""
    qps = shared / "qps"
    sleeps = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    locker: subprocess.Popen[str] | None = None
    try:
        old, claims, held = (qps / f"sock-{s.pid}" for s in sleeps)
        plant(old, sock_bytes(sleeps[0].pid, "victim"), 65534, 0o644)
        plant(claims, sock_bytes(sleeps[1].pid, "victim"), 65534, 0o444)
        plant(held, sock_bytes(sleeps[2].pid, "victim"), 65534, 0o644)
        locker = subprocess.Popen([*SETPRIV, PY, str(shared / "locker.py"), str(held)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert locker.stdout is not None
        planter = int(locker.stdout.readline())
        recs, problems = sock_records.read_dir(qps, prune=True)
        assert recs == []
        assert sorted(p.split(": ", 1)[1] for p in problems) == sorted([
            f"owned by uid 65534, not by process {sleeps[0].pid}'s user",
            f"locked by process {planter}, whose own pid is {planter}"])
        assert old.exists() and held.exists() and not claims.exists()
    finally:
        for s in sleeps:
            s.kill()
            s.wait()
        if locker is not None:
            locker.kill()
            locker.wait()


def qp_bytes(pid: int, job: str) -> bytes:
    head = qp_records._HEADER.pack(qp_records.MAGIC, 2, qp_records.HEADER_SIZE,
                                   qp_records.RECORD_SIZE, 1, pid, 1, *[0] * 8, job.encode(), 1,
                                   0, 0, 0)
    rec = qp_records._RECORD.pack(2, 1, 0, 1, 3, 17, 18, 0, 5, 50000, 0, 104, 3, 26,
                                  bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 2]),
                                  b"mlx5_0", 7, 7, 5, 1000, 1, 10)
    return head + rec


def test_qp_records_carry_their_writers_pid(shared: Path, procs: list[Proc]) -> None:
    """A QP records file held locked from a child pid namespace, as the verbs wrapper holds
    its own: the process and each of its QPs come back with the holder's pid here."""
    qps = shared / "qps"
    path = qps / "1"  # the holder's own pid, as the wrapper names it
    plant(path, qp_bytes(1, "rdma"), 0, 0o444)
    holder = Proc([PY, str(shared / "locker.py"), str(path)], {})
    procs.append(holder)
    assert holder.own == 1
    (rec,), problems = qp_records.read_dir(qps)
    assert problems == [] and (rec.pid, rec.file, rec.job_id) == (holder.host, "1", "rdma")
    assert [(q.pid, q.qpn, q.bytes_posted) for q in rec.qps] == [(holder.host, 17, 1000)]
    holder.end()
    assert qp_records.read_dir(qps, prune=True) == ([], []) and not path.exists()


VERBS = "IBVERBS_1.1 { global: ibv_modify_qp; ibv_destroy_qp; ibv_create_qp; ibv_close_device;" \
    " local: *; };\n"


def test_the_verbs_wrappers_records_from_a_pid_namespace(
        shared: Path, procs: list[Proc], tmp_path_factory: pytest.TempPathFactory) -> None:
    out = tmp_path_factory.mktemp("verbs")
    (out / "verbs.map").write_text(VERBS)
    build(out, "libibverbs.so.1", ["tests/c/fake_ibverbs.c"], "-fPIC", "-shared",
          f"-Wl,--version-script={out / 'verbs.map'}", "-Wl,-soname,libibverbs.so.1")
    prog = build(out, "verbs_record", ["tests/c/verbs_record.c"], "-ldl")
    run = Proc([str(prog), str(native.library(native.IBVERBS))],
               {"LD_LIBRARY_PATH": str(out), "CRUX_QP_DIR": str(shared / "qps"),
                "CRUX_DECISION_TABLE": str(shared / "none"), "CRUX_JOB_ID": "rdma"})
    procs.append(run)
    assert run.own == 1
    (rec,), problems = qp_records.read_dir(shared / "qps")
    assert problems == [] and (rec.pid, rec.file, rec.job_id) == (run.host, "1", "rdma")
    assert [(q.pid, q.qpn, q.peer, q.outcome) for q in rec.qps] == [
        (run.host, 17, "10.0.0.2", "no-table")]
    run.end()
    assert qp_records.read_dir(shared / "qps", prune=True) == ([], [])
    assert not list((shared / "qps").iterdir())


def test_nccl_profiler_records_from_a_pid_namespace(shared: Path, procs: list[Proc]) -> None:
    harness = ensure_built(BUILD / "nccl_harness", "nccl")
    plugin = native.library(native.NCCL_PROFILER)
    run = Proc([str(harness), plugin.name, "2.30"],
               {"LD_LIBRARY_PATH": str(plugin.parent), "CRUX_QP_DIR": str(shared / "qps"),
                "CRUX_JOB_ID": "nccl"})
    procs.append(run)
    assert run.own == 1
    run.say("init 0 8 3 77")  # the plugin makes its file with the first communicator
    recs = wait_for(lambda: nccl_records.read_dir(shared / "qps")[0])
    assert [(r.pid, r.file, r.job_id) for r in recs] == [(run.host, "nccl-1", "nccl")]
    assert [c.comm_hash for c in recs[0].comms] == [77]
    run.end()
    assert nccl_records.read_dir(shared / "qps", prune=True) == ([], [])
    assert not list((shared / "qps").iterdir())


def wait_for(what: Callable[[], list[Any]], timeout: float = 10.0) -> list[Any]:
    end = time.monotonic() + timeout
    while not (got := what()):
        assert time.monotonic() < end, "nothing came"
        time.sleep(0.02)
    return got


def test_the_lock_probe_sees_a_writers_lock_only(tmp_path: Path) -> None:
    """F_GETLK from the reader: another process's write lock, by its pid; not a read lock
    (which any reader may take), nor the reader's own (F_GETLK never reports those)."""
    path = tmp_path / "f"
    path.write_bytes(b"x")

    def holding(kind: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([PY, "-c", (
            "import fcntl, sys\n"
            f"f = open({str(path)!r}, 'r+b')\n"
            f"fcntl.lockf(f, fcntl.{kind} | fcntl.LOCK_NB, 1, 0)\n"
            "print('ok', flush=True); sys.stdin.read()\n")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline() == "ok\n"
        return p

    fd = os.open(path, os.O_RDONLY)
    try:
        assert lock_holder(fd) is None
        for kind, want in (("LOCK_SH", None), ("LOCK_EX", "pid")):
            p = holding(kind)
            assert lock_holder(fd) == (p.pid if want else None)
            p.kill()
            p.wait()
        assert lock_holder(fd) is None  # died with its holder
        with open(path, "r+b") as mine:
            fcntl.lockf(mine, fcntl.LOCK_EX, 1, 0)
            assert lock_holder(fd) is None
    finally:
        os.close(fd)
