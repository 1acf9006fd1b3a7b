"""Fuzzing what parses untrusted bytes outside a unit test's reach (issue 17): the shims' C
decision-table reader, driven through ctypes, and a live agent's socket.

The C reader runs in a forked child per example, so a crash or a hang (alarm) fails the test
instead of killing pytest. See tests/fuzzing.py for the budget.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from cruxd.rpc.local import MAX_FRAME, LocalClient, frame
from cruxd.testing import Daemon
from tests.cbuild import build
from tests.fuzzing import budget, mutate
from transport.decision_table import Decision, TableWriter

# --- (d) the decision-table reader in C ---------------------------------------------------

# The wrapper libibverbs' path: map the file (crux_tablemap), validate, look up per peer and
# job-wide, then decide for a connect. Returns the outcome and lookup results packed.
HARNESS = r"""
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <string.h>
#include "crux_shim.h"
#include "crux_tablemap.h"

int fuzz_table(const char *path, const char *job, const unsigned char *peer)
{
    struct crux_tablemap m;
    struct crux_table_entry e;
    struct ibv_ah_attr ah;
    struct crux_applied d;
    memset(&m, 0, sizeof m);
    crux_tablemap_refresh(&m, path);
    int found = crux_table_lookup(m.table, m.len, job, peer, &e) + 1;
    found += crux_table_lookup(m.table, m.len, job, NULL, &e) + 1;
    memset(&ah, 0, sizeof ah);
    ah.is_global = 1;
    memcpy(ah.grh.dgid.raw, peer, 16);
    crux_decide(m.table, m.len, job, &ah, &d);
    crux__tablemap_close(&m);
    return d.outcome * 4 + found;
}
"""
# setjmp in the inline readers (the SIGBUS guard) draws gcc's -Wclobbered false positive
# once they are inlined into this harness.
BUILD_FLAGS = ("-shared", "-fPIC", "-Wno-error=clobbered")
HANG_S = 10  # one lookup in a table of at most a few entries takes microseconds


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path, bytes, bytes], int]:
    out = tmp_path_factory.mktemp("cfuzz")
    (out / "harness.c").write_text(HARNESS)
    lib = ctypes.CDLL(str(build(out, "libfuzz_table.so", [str(out / "harness.c"),
                                                          "shim/crux_decide.c"],
                                *BUILD_FLAGS)))
    fn = lib.fuzz_table
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
    fn.restype = ctypes.c_int

    def call(path: Path, job: bytes, peer: bytes) -> int:
        return int(fn(bytes(path), job, peer))
    return call


def in_child(work: Callable[[], int]) -> int:
    """work() in a forked child; its result (0-127), or a failure naming the signal."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns into pytest
        code = 126
        try:
            signal.alarm(HANG_S)
            code = work() & 0x7F
        finally:
            os._exit(code)
    _, wait_status = os.waitpid(pid, 0)
    assert os.WIFEXITED(wait_status), f"C reader died of signal {os.WTERMSIG(wait_status)}"
    return os.WEXITSTATUS(wait_status)


def valid_table(path: Path) -> bytes:
    with TableWriter.open(path, capacity=4) as w:
        w.apply([Decision("job", None, 1, 10, 40, 0xC123, 7),
                 Decision("job", "10.0.0.2", 3, 26, 104, 50000, 7)], 7)
    return path.read_bytes()


@st.composite
def tables(draw: st.DrawFn, valid: bytes) -> bytes:
    kind = draw(st.sampled_from(("valid", "random", "mutated", "header")))
    if kind == "valid":
        return valid
    if kind == "random":
        return draw(st.binary(max_size=1024))
    if kind == "mutated":
        return mutate(valid, draw)
    # A valid header claiming any sizes over a random body.
    header = bytearray(valid[:64])
    for offset in draw(st.lists(st.sampled_from((12, 16, 20, 52, 56)), max_size=3)):
        struct.pack_into("<I", header, offset, draw(st.integers(0, 2**32 - 1)))
    return bytes(header) + draw(st.binary(max_size=1024))


peers = st.sampled_from([bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 2]), bytes(16),
                         b"\xff" * 16])
jobs = st.sampled_from([b"job", b"", b"x" * 63, b"x" * 64, b"x" * 200])


@budget(200)
@given(data=st.data())
def test_c_table_reader(tmp_path_factory: pytest.TempPathFactory,
                        reader: Callable[[Path, bytes, bytes], int], data: st.DataObject) -> None:
    d = tmp_path_factory.mktemp("table")
    raw = data.draw(tables(valid_table(d / "valid")))
    path = d / "decisions"
    path.write_bytes(raw)
    job, peer = data.draw(jobs), data.draw(peers)
    got = in_child(lambda: reader(path, job, peer))
    assert got != 126  # the call itself raised in the child
    if raw == (d / "valid").read_bytes() and job == b"job":
        assert got // 4 == 0  # CRUX_OUT_APPLIED: an untouched table still applies


# --- (a) a live agent's socket ---------------------------------------------------------------

@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("fuzzd"), "h0", {
        "leader": {"listen": "127.0.0.1:0", "profiling_s": 0, "debounce_ms": 10},
        "agent": {"addresses": ["10.1.0.1"], "gpus": 8}})
    d.start()
    d.wait_log(" applied: ")
    yield d
    assert d.stop() == 0, d.log_text()[-2000:]


def exchange(path: Path, data: bytes) -> bytes:
    """Send data, then read whatever comes back until the agent closes or goes quiet."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(str(path))
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            got = b""
            while chunk := s.recv(65536):
                got += chunk
        except (TimeoutError, ConnectionError):
            return b""
        return got


frames_in = st.one_of(
    st.binary(max_size=512),
    st.binary(max_size=256).map(frame),
    st.sampled_from([struct.pack(">I", MAX_FRAME + 1), struct.pack(">I", 0xFFFFFFFF),
                     struct.pack(">I", 1000) + b"short", b"\0\0"]),
    st.text(max_size=100).map(lambda j: frame(apb.LocalRequest(
        deregister=apb.DeregisterJob(job_id=j)).SerializeToString())))


@budget(40)
@given(st.lists(frames_in, min_size=1, max_size=3).map(b"".join))
@example(frame(apb.LocalRequest(jobs=apb.ListJobsRequest()).SerializeToString()))
def test_live_agent_socket(agent: Daemon, data: bytes) -> None:
    exchange(agent.socket, data)
    agent.check_alive("random frames")
    reply = LocalClient(agent.socket).call(apb.LocalRequest(
        status=apb.LocalStatusRequest(local_only=True)))
    assert reply.status.agent.host_id == "h0"  # still answering
