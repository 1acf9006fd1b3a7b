"""The agent against local users and its own crashes (issue 17): hostile files in the
world-writable records directory, a flooded local socket, jobs per host, job ids bound to
their user, the last job kept across a SIGKILL, and the runtime directory's ownership.

Hangs are detected by a subprocess's timeout, never by timing a normal run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from cruxd.agent.local_server import RESERVED
from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.local import AgentUnavailable, LocalClient, frame
from cruxd.testing import Daemon, crux_run, status, wait_for
from tests.nobody import SETPRIV, as_nobody
from transport import qp_records
from transport.decision_table import TableReader

pytestmark = pytest.mark.slow



def qp_record_file(path: Path, pid: int, job: str = "good") -> None:
    """A records file as the shim writes it: full size, one applied QP."""
    buf = bytearray(qp_records.MAX_FILE)
    qp_records._HEADER.pack_into(buf, 0, qp_records.MAGIC, qp_records.VERSION,
                                 qp_records.HEADER_SIZE, qp_records.RECORD_SIZE,
                                 qp_records.CAPACITY, pid, 1, 1, *([0] * 7), job.encode(), 1,
                                 0, 0, 0)
    qp_records._RECORD.pack_into(buf, qp_records.HEADER_SIZE, 2, 1, 0, 1, 3, 17, 18, 0, 0,
                                 50000, 0, 104, 3, 26, bytes(10) + b"\xff\xff" + bytes(4),
                                 b"mlx5_0", 1, 1, 1, 0, 0, 0)
    path.write_bytes(bytes(buf))


# Run in a child: a hang is its timeout, its peak RSS its own. VmHWM, not ru_maxrss: Linux
# carries the spawning process's high-water mark into ru_maxrss across exec (a pytest worker
# grown to 400 MB made a 57 MB scan look like 396 MB).
_SCAN = """
import json, sys
from transport.qp_records import read_dir
live, problems = read_dir(sys.argv[1])
with open("/proc/self/status") as f:
    hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
print(json.dumps({"live": [[r.pid, r.job_id] for r in live], "problems": problems,
                  "maxrss_kib": hwm}))
"""


def scan_in_child(qps: Path) -> dict[str, object]:
    run = subprocess.run([sys.executable, "-c", _SCAN, str(qps)], capture_output=True,
                         text=True, timeout=60, cwd=Path(__file__).resolve().parent.parent)
    assert run.returncode == 0, run.stderr
    doc: dict[str, object] = json.loads(run.stdout)
    return doc


def plant_hostile_files(qps: Path) -> None:
    """The audit's three: a FIFO, a sparse 3 GB file and a link to /dev/zero, each named
    after a live process (this one) so nothing is skipped for its name alone."""
    me = os.getpid()
    os.mkfifo(qps / str(me + 1_000_000))  # beyond pid_max: but read before any pid check
    with open(qps / str(me + 1_000_001), "wb") as f:
        f.truncate(3 << 30)
    (qps / str(me + 1_000_002)).symlink_to("/dev/zero")


def test_hostile_record_files_are_skipped_promptly_with_bounded_memory(tmp_path: Path) -> None:
    qps = tmp_path / "qps"
    qps.mkdir()
    plant_hostile_files(qps)
    qp_record_file(qps / str(os.getpid()), os.getpid())
    doc = scan_in_child(qps)
    assert doc["live"] == [[os.getpid(), "good"]], doc
    problems = doc["problems"]
    assert isinstance(problems, list) and len(problems) == 3, problems
    assert any("not a regular file" in p for p in problems)
    assert any(p.startswith(f"{qps}/{os.getpid() + 1_000_001}: bad magic") for p in problems)
    assert any("Too many levels of symbolic links" in p for p in problems)
    rss = doc["maxrss_kib"]
    assert isinstance(rss, int) and rss < 200 << 10, f"{rss} KiB"


@pytest.mark.root
def test_records_owned_by_another_user_are_refused(tmp_path: Path) -> None:
    """nobody may not plant records for root's processes; its own processes' records count."""
    qps = tmp_path / "qps"
    qps.mkdir()
    sleeper = subprocess.Popen([*SETPRIV, "sleep", "600"])
    try:
        theirs, forged = qps / str(sleeper.pid), qps / str(os.getpid())
        qp_record_file(theirs, sleeper.pid, "nobodys")
        qp_record_file(forged, os.getpid(), "forged")
        os.chown(theirs, 65534, 65534)
        os.chown(forged, 65534, 65534)
        doc = scan_in_child(qps)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert doc["live"] == [[sleeper.pid, "nobodys"]], doc
    assert doc["problems"] == [f"{forged}: owned by uid 65534, not by process "
                               f"{os.getpid()}'s user"]


def test_busy_records_cost_one_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record left odd (busy) must not make the reader spin on its own copy."""
    path = tmp_path / "qps" / str(os.getpid())
    path.parent.mkdir()
    qp_record_file(path, os.getpid())
    buf = bytearray(path.read_bytes())
    calls = 0
    real = struct.unpack_from

    def counting(fmt: str, b: bytes, off: int = 0) -> tuple[object, ...]:
        nonlocal calls
        calls += 1
        return real(fmt, b, off)

    struct.pack_into("<I", buf, qp_records.HEADER_SIZE, 1)  # seq odd: a writer inside
    monkeypatch.setattr(qp_records.struct, "unpack_from", counting)
    rec = qp_records.parse(bytes(buf))
    monkeypatch.undo()
    assert rec.qps == () and calls == 1


def test_status_survives_hostile_records_in_a_real_agent(tmp_path: Path) -> None:
    d = Daemon(tmp_path, "h0", {"leader": {"listen": "127.0.0.1:0"},
                                "agent": {"addresses": ["10.1.0.1"], "gpus": 0}})
    d.start()
    try:
        d.wait_log(" applied: ")
        plant_hostile_files(d.root / "run" / "qps")
        doc = status(d.socket)
        assert doc["agent"].get("qps", []) == []
        d.wait_log("QP records: 3 file(s) skipped")
        d.check_alive("status")
    finally:
        assert d.stop(signal.SIGTERM) == 0


# --- the local socket ------------------------------------------------------------------

def _agent(tmp_path: Path, name: str = "h0", **agent: object) -> Daemon:
    return Daemon(tmp_path, name, {
        "leader": {"listen": "127.0.0.1:0", "debounce_ms": 10, "profiling_s": 0},
        "agent": {"addresses": ["10.1.0.1"], "gpus": 8, "report_interval_s": 0.5, **agent}})


def _refused_then_served(d: Daemon, held: list[socket.socket], code: int, why: str) -> None:
    reply = LocalClient(d.socket, timeout=1.0).call(apb.LocalRequest(jobs=apb.ListJobsRequest()))
    assert reply.error.code == code and why in reply.error.message, reply
    assert reply.error.retry_after_ms > 0  # a refusal that passes: clients try again
    for s in held:
        s.close()
    ok = wait_for("a slot again", lambda: not LocalClient(d.socket).call(
        apb.LocalRequest(jobs=apb.ListJobsRequest())).HasField("error"))
    assert ok


def _hold(d: Daemon, n: int) -> list[socket.socket]:
    held = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(d.socket))
        held.append(s)
    # each is answered once the agent took it: a full request/reply on the last proves order
    s = held[-1]
    s.sendall(frame(apb.LocalRequest(jobs=apb.ListJobsRequest()).SerializeToString()))
    s.settimeout(30)
    assert len(s.recv(4)) == 4
    return held


@pytest.mark.parametrize(("limits", "why"), [
    ({"max_connections_per_uid": 3}, f"too many connections from uid {os.geteuid()} (3,"),
    ({"max_connections": 3}, "too many connections (3, agent.max_connections)")])
def test_connections_are_capped_in_all_and_per_user(tmp_path: Path, limits: dict[str, int],
                                                    why: str) -> None:
    d = _agent(tmp_path, request_timeout_s=60, **limits).start()
    try:
        d.wait_log(" applied: ")
        # the test runs as the daemon's own user: past max_connections it has RESERVED more
        held = _hold(d, 3 + (RESERVED if "max_connections" in limits else 0))
        _refused_then_served(d, held, 8, why)
        assert "refusing pid" in d.log_text()
    finally:
        assert d.stop() == 0


def test_a_client_over_the_connection_limit_is_served_once_a_slot_frees(
        tmp_path: Path) -> None:
    """A launcher starting every rank at once: the ones over the limit are told to retry,
    and register within their deadline instead of running without crux."""
    d = _agent(tmp_path, request_timeout_s=60, max_connections_per_uid=3).start()
    try:
        d.wait_log(" applied: ")
        held = _hold(d, 3)
        threading.Timer(0.5, lambda: [s.close() for s in held]).start()
        reply = LocalClient(d.socket, timeout=10.0).call(apb.LocalRequest(
            register=apb.RegisterJob(job_id="late", gpus=1, nnodes=1)))
        assert reply.WhichOneof("body") == "registered", reply
        assert "refusing pid" in d.log_text()
    finally:
        assert d.stop() == 0


def test_a_full_listen_queue_is_waited_out_within_the_deadline(tmp_path: Path) -> None:
    """EAGAIN on connect (the agent's listen queue is full) is busy, not absent: the client
    tries again until its deadline, then names the cause."""
    path = str(tmp_path / "busy.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(0)
    queued = []
    try:
        for _ in range(8):  # fill the queue (its length is the kernel's backlog + 1)
            c = socket.socket(socket.AF_UNIX)
            c.setblocking(False)
            try:
                c.connect(path)
            except BlockingIOError:
                c.close()
                break
            queued.append(c)
        else:
            pytest.fail("the listen queue never filled")
        with pytest.raises(AgentUnavailable, match=r"busy \(its listen queue stayed full"):
            LocalClient(path, timeout=0.5).call(apb.LocalRequest(jobs=apb.ListJobsRequest()))

        def serve() -> None:  # drain the queue, then answer the client that got in
            time.sleep(0.3)
            for c in queued:
                c.close()
            while True:
                conn, _ = srv.accept()
                with conn:
                    conn.settimeout(5)
                    try:
                        head = conn.recv(4)
                    except OSError:
                        continue
                    if len(head) == 4:
                        conn.recv(struct.unpack(">I", head)[0])
                        conn.sendall(frame(apb.LocalReply().SerializeToString()))
                        return
        t = threading.Thread(target=serve, daemon=True)
        t.start()
        reply = LocalClient(path, timeout=10.0).call(apb.LocalRequest(jobs=apb.ListJobsRequest()))
        assert reply.WhichOneof("body") is None
        t.join(5)
    finally:
        srv.close()


def test_oversized_and_half_sent_requests_are_dropped(tmp_path: Path) -> None:
    """A request frame is at most 64 KiB (a reply may be larger); a connection that does not
    finish its request within request_timeout_s is dropped. recv's timeout is the hang
    detector: before these limits the agent waited for the 1 MiB body, or forever."""
    d = _agent(tmp_path, request_timeout_s=0.5).start()
    try:
        d.wait_log(" applied: ")
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(d.socket))
            s.sendall((1 << 20).to_bytes(4, "big"))  # under the old 4 MiB limit
            s.settimeout(30)
            assert s.recv(16) == b""
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(d.socket))
            s.sendall(b"\0\0")  # half a header, then nothing
            s.settimeout(30)
            assert s.recv(16) == b""
        d.wait_log("no whole request or reply taken in 0.5 s")
        assert "exceeds the 65536-byte limit" in d.log_text()
        assert status(d.socket)["agent"]["jobs"] == []
    finally:
        assert d.stop() == 0


# --- registration ------------------------------------------------------------------------

def _register(sock: Path, job: str, **hints: float) -> apb.LocalReply:
    return LocalClient(sock).call(apb.LocalRequest(register=apb.RegisterJob(
        job_id=job, gpus=1, hints=cpb.JobMeasurement(**hints))))


def test_jobs_per_host_are_capped_like_the_leader_does(tmp_path: Path) -> None:
    d = _agent(tmp_path, max_jobs=3).start()
    try:
        d.wait_log(" applied: ")
        for i in range(3):
            assert not _register(d.socket, f"j{i}").HasField("error")
        over = _register(d.socket, "j3")
        assert over.error.code == 8 and "agent.max_jobs" in over.error.message, over
        assert not _register(d.socket, "j0").HasField("error"), "joining is not a new job"
        jobs = [j["job_id"] for j in status(d.socket)["agent"]["jobs"]]
        assert jobs == ["j0", "j1", "j2"]
        d.check_alive("registrations")
    finally:
        assert d.stop() == 0


def test_registration_appends_instead_of_rewriting_the_state(tmp_path: Path) -> None:
    """O(1) per registration: a line in the journal, not the whole state file again."""
    d = _agent(tmp_path).start()
    state = d.root / "state" / "agent-state.json"
    try:
        d.wait_log(" applied: ")
        def stamp() -> tuple[int, int] | None:
            return (state.stat().st_ino, state.stat().st_mtime_ns) if state.exists() else None
        before = stamp()
        for i in range(20):
            assert not _register(d.socket, f"j{i}").HasField("error")
        assert stamp() == before
        journal = state.with_name("agent-state.json.journal").read_text().splitlines()
        assert len(journal) == 20
    finally:
        assert d.stop() == 0
    assert len(json.loads(state.read_text())["jobs"]) == 20, "a clean stop saves them all"


def test_sigkilled_agent_keeps_the_job_registered_last(tmp_path: Path) -> None:
    d = _agent(tmp_path).start()
    job = None
    try:
        d.wait_log(" applied: ")
        job = crux_run(d.socket, "last", "--flops-per-iter", "1e15")
        d.wait_log("job last registered")
        d.stop(signal.SIGKILL)
        d.start()
        d.wait_log("job last kept across the restart")
        assert [j["job_id"] for j in status(d.socket)["agent"]["jobs"]] == ["last"]

        def in_table() -> bool:
            with TableReader(d.table) as t:
                return any(e.job_id == "last" for e in t.snapshot())
        wait_for("the job's table entry", in_table)
    finally:
        if job is not None:
            job.kill()
            job.wait()
        assert d.stop() == 0


def _as_nobody(sock: Path, request: apb.LocalRequest) -> str:
    """`code message` of `request` sent by a process turned nobody."""
    def send() -> str:
        r = LocalClient(sock).call(request)
        return f"{r.error.code} {r.error.message}"
    return as_nobody(send)


@pytest.mark.root
def test_a_job_id_belongs_to_the_user_who_registered_it(tmp_path: Path) -> None:
    open_dir = Path(tempfile.mkdtemp(prefix="crux-ids-"))
    open_dir.chmod(0o755)
    sock = open_dir / "agent.sock"
    d = _agent(tmp_path, socket=str(sock), socket_group="nogroup").start()
    rank1 = None
    try:
        d.wait_log(" applied: ")
        assert not _register(sock, "shared", comm_s=0.5).HasField("error")
        rank1 = crux_run(sock, "shared")  # the same user, another rank: joins
        d.wait_log("joined by process")
        evil = apb.LocalRequest(register=apb.RegisterJob(
            job_id="shared", gpus=8, hints=cpb.JobMeasurement(comm_s=1e6)))
        answer = _as_nobody(sock, evil)
        assert answer.startswith("7 ") and "registered here by uid 0" in answer, answer
        own = apb.LocalRequest(register=apb.RegisterJob(job_id="theirs", gpus=1))
        assert _as_nobody(sock, own) == "0 ", "nobody may use the socket for its own ids"
        (job,) = [j for j in status(sock)["agent"]["jobs"] if j["job_id"] == "shared"]
        assert job["measurement"]["comm_s"] == 0.5 and job["gpus"] == 1, job
    finally:
        if rank1 is not None:
            rank1.kill()
            rank1.wait()
        assert d.stop() == 0
        shutil.rmtree(open_dir, ignore_errors=True)


# --- the runtime directory ---------------------------------------------------------------

def _parse_as_nobody() -> str:
    """What the embedded default does with /tmp/crux-65534 for nobody (no XDG dir)."""
    from cruxd.config.parse import embedded_default

    def parse() -> str:
        try:
            c = embedded_default(env={"HOME": "/nonexistent"}, euid=65534)
            return f"ok {c.runtime_dir}"
        except Exception as exc:  # the refusal
            return f"{type(exc).__name__}: {exc}"
    return as_nobody(parse)


@pytest.mark.root
def test_a_tmp_runtime_dir_made_by_another_user_is_refused() -> None:
    tmp = Path("/tmp/crux-65534")
    if tmp.is_dir() and not tmp.is_symlink() and not any(tmp.iterdir()):
        tmp.rmdir()  # an empty one left by another test's nobody-run command (cruxctl)
    if tmp.exists() or tmp.is_symlink():
        pytest.skip(f"{tmp} exists already, not empty; this test makes its own")
    try:
        assert _parse_as_nobody() == f"ok {tmp}"
        st = tmp.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (65534, 0o700), "created private"
        tmp.chmod(0o777)
        assert "is group- or world-writable (mode 0777)" in _parse_as_nobody()
        tmp.rmdir()
        tmp.mkdir(mode=0o755)  # made by root: standing in for any other user
        answer = _parse_as_nobody()
        assert "belongs to uid 0, not to this user (65534)" in answer, answer
        tmp.rmdir()
        tmp.symlink_to("/tmp")
        assert "is not a directory" in _parse_as_nobody()
    finally:
        if tmp.is_symlink():
            tmp.unlink()
        elif tmp.exists():
            tmp.rmdir()
