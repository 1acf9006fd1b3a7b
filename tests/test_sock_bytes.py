"""The interposer's per-job byte counts and listening ports (shim/crux_sockbytes.c, record
version 2 in shim/crux_sockrec.h) and their reader (transport/sock_records.py).

tests/c/sock_bytes.c runs under LD_PRELOAD, sends through every wrapped call and checks its
own record through the C header; here the same files are read through the Python reader, the
header's offsets are held against golden bytes built field by field, and hostile files (old,
short, mis-sized, planted) are read without trust."""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import pytest

from tests.cbuild import build
from transport import native
from transport.sock_records import (
    BYTES_SENT_OFFSET,
    MAGIC,
    SIZE,
    SockRecordError,
    by_job,
    job_bytes_sent,
    job_listen_ports,
    parse,
    read_dir,
    read_file,
)


@pytest.fixture(scope="module")
def prog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("c"), "sock_bytes", ["tests/c/sock_bytes.c"],
                 verbs=False)


def run(prog: Path, qps: Path, loopback: bool) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRUX_") and k != "LD_PRELOAD"}
    env.update(LD_PRELOAD=str(native.library(native.SOCK)), CRUX_JOB_ID="job-b",
               CRUX_QP_DIR=str(qps), CRUX_DECISION_TABLE=str(qps / "no-table"))
    if loopback:
        env["CRUX_SOCK_LOOPBACK"] = "1"
    out = subprocess.run([str(prog), "run"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return {k: int(v) for k, v in (kv.split("=") for kv in out.stdout.split())}


def test_every_send_path_counts_on_connected_and_accepted_sockets(prog: Path,
                                                                  tmp_path: Path) -> None:
    got = run(prog, tmp_path, loopback=True)
    # send 100, sendto 200, sendmsg 350, write 400, writev 505, the accepted end 1000, a dup 7,
    # a dup2 3; not the pipe that reused a closed number, not UDP, not the child's 17
    assert (got["bytes"], got["calls"]) == (2565, 8)
    rec = read_file(tmp_path / f"sock-{got['pid']}")
    assert (rec.version, rec.job_id, rec.bytes_sent, rec.send_calls) == (2, "job-b", 2565, 8)
    assert rec.listen_ports == (got["port"], got["lo_port"])
    child = read_file(tmp_path / f"sock-{got['child']}")
    assert (child.bytes_sent, child.send_calls, child.listen_ports) == (17, 1, ())
    assert job_bytes_sent([rec, child]) == 2582
    assert job_listen_ports([rec, child]) == tuple(sorted((got["port"], got["lo_port"])))


def test_loopback_connections_and_listeners_are_left_out(prog: Path, tmp_path: Path) -> None:
    got = run(prog, tmp_path, loopback=False)
    rec = read_file(tmp_path / f"sock-{got['pid']}")
    assert (rec.bytes_sent, rec.send_calls) == (0, 0)
    assert rec.listen_ports == (got["port"],)  # the wildcard one: reachable from elsewhere
    assert not (tmp_path / f"sock-{got['child']}").exists()  # nothing counted, no file


def test_header_layout_matches_the_reader(prog: Path) -> None:
    out = subprocess.run([str(prog), "layout"], capture_output=True, text=True, check=True)
    c = {k: int(v) for k, v in (ln.split("=") for ln in out.stdout.split())}
    assert c == {"magic": 0, "version": 8, "size": 12, "pid": 16, "outcomes": 20, "calls": 24,
                 "job_id": 32, "counters": 96, "created_ns": 224, "accepts": 232,
                 "bytes_sent": BYTES_SENT_OFFSET, "send_calls": 248, "listen_ports": 256,
                 "reserved": 288, "sizeof": SIZE, "SIZE": 512, "VERSION": 2,
                 "LISTEN_PORTS": 16}


def golden(version: int = 2, size: int = 512, pid: int = 77, *, length: int | None = None,
           sent: int = 0, sends: int = 0, ports: tuple[int, ...] = ()) -> bytes:
    """A record built field by field at the header's offsets, not through the reader's
    struct formats."""
    b = bytearray(length if length is not None else size)

    def put(off: int, fmt: str, *v: int) -> None:
        if off + struct.calcsize(fmt) <= len(b):
            struct.pack_into(fmt, b, off, *v)

    put(0, "<Q", MAGIC)
    put(8, "<I", version)
    put(12, "<I", size)
    put(16, "<I", pid)
    put(20, "<I", 7)  # outcomes
    put(24, "<Q", 5)  # calls
    b[32:36] = b"jobz"
    put(96, "<Q", 5)  # counters[applied]
    put(224, "<Q", 123)  # created_ns
    put(232, "<Q", 2)  # accepts
    if version >= 2:
        put(240, "<Q", sent)
        put(248, "<Q", sends)
        for i, p in enumerate(ports):
            put(256 + 2 * i, "<H", p)
    return bytes(b)


def test_version_2_reads_every_field() -> None:
    ports = (29500, 0, 41000, *range(1000, 1013))  # an empty slot among them is skipped
    r = parse(golden(sent=2**40 + 3, sends=9, ports=ports))
    assert (r.pid, r.job_id, r.calls, r.accepts, r.created_ns) == (77, "jobz", 5, 2, 123)
    assert (r.bytes_sent, r.send_calls, r.version) == (2**40 + 3, 9, 2)
    assert r.listen_ports == (29500, 41000, *range(1000, 1013))
    assert r.counters["applied"] == 5


def test_version_1_reads_with_no_bytes_or_ports() -> None:
    r = parse(golden(version=1, size=256))
    assert (r.version, r.calls, r.accepts, r.bytes_sent, r.send_calls, r.listen_ports) == (
        1, 5, 2, 0, 0, ())
    # what lies past a version 1 record is not its own (a newer writer's, or junk)
    assert parse(golden(version=1, size=256) + b"\xff" * 256).bytes_sent == 0


@pytest.mark.parametrize(("raw", "why"), [
    (golden(length=300), "300 bytes is shorter than the 512-byte record"),
    (golden(length=100), "100 bytes is shorter than the 256-byte record"),
    (golden(version=2, size=256), "version 2, size 256"),
    (golden(version=1, size=512), "version 1, size 512"),
    (golden(version=3, size=768, length=512), "version 3, size 768"),
])
def test_truncated_or_mis_sized_records_are_refused(raw: bytes, why: str) -> None:
    with pytest.raises(SockRecordError, match=why):
        parse(raw)


def test_planted_files_are_refused_and_jobs_sum(tmp_path: Path) -> None:
    me, parent = os.getpid(), os.getppid()
    (tmp_path / f"sock-{me}").write_bytes(golden(pid=me, sent=1000, sends=4, ports=(80, 81)))
    (tmp_path / f"sock-{parent}").write_bytes(golden(version=1, size=256, pid=parent))
    os.mkfifo(tmp_path / "sock-5")  # must neither hang nor count
    (tmp_path / "sock-6").symlink_to(tmp_path / f"sock-{me}")
    (tmp_path / "sock-7").write_bytes(golden(pid=7, length=400))  # a truncated version 2
    recs, problems = read_dir(tmp_path)
    assert sorted((r.pid, r.bytes_sent) for r in recs) == sorted([(me, 1000), (parent, 0)])
    why = " | ".join(sorted(problems))
    assert "not a regular file" in why and "symbolic links" in why
    assert "400 bytes is shorter than the 512-byte record" in why
    [job] = by_job(recs)
    assert (job.job_id, job.processes, job.bytes_sent, job.send_calls, job.listen_ports) == (
        "jobz", 2, 1000, 4, (80, 81))
