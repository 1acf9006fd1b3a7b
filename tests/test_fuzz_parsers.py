"""Fuzzing the Python parsers a local user, a job or a remote host can reach (issue 17).

Each parser gets random bytes and mutated valid input. The property everywhere: it returns,
or raises only its documented error, and allocates a bounded amount while doing so. The C
decision-table reader and a live agent socket: tests/test_fuzz_native.py.

State files: test_fuzz_state_files.py. Budget and helpers: tests/fuzzing.py.
"""

from __future__ import annotations

import asyncio
import os
import struct
from pathlib import Path

import pytest
from google.protobuf.message import DecodeError
from hypothesis import example, given
from hypothesis import strategies as st

from cruxd.agent.local_server import LocalServer, PeerCred
from cruxd.control.records import LocalJob
from cruxd.control.validate import (
    InvalidMessage,
    check_local_job,
    check_measurement,
    check_report,
)
from cruxd.rpc import convert
from cruxd.rpc.gen.crux.v1 import agent_pb2 as apb
from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb
from cruxd.rpc.local import MAX_FRAME, FrameError, frame, read_frame
from tests.fuzzing import bounded, budget, variant
from transport import qp_records, sock_records

# --- (a) the agent's local socket: framing and LocalRequest decoding ------------------------

def read_all(data: bytes) -> list[bytes]:
    async def go() -> list[bytes]:
        reader = asyncio.StreamReader(limit=MAX_FRAME)
        reader.feed_data(data)
        reader.feed_eof()
        out = []
        while (payload := await read_frame(reader)) is not None:
            out.append(payload)
        return out
    return asyncio.run(go())


frames = st.lists(st.binary(max_size=64), max_size=4).map(lambda ps: b"".join(map(frame, ps)))


@budget(300)
@given(st.one_of(st.binary(max_size=256), st.tuples(frames, st.binary(max_size=8)).map(
    lambda t: t[0] + t[1])))
@example(struct.pack(">I", MAX_FRAME + 1) + b"x")
@example(struct.pack(">I", 0xFFFFFFFF))
def test_frames_split_or_refuse(data: bytes) -> None:
    try:
        with bounded():
            got = read_all(data)
    except FrameError:
        return  # too large, or the stream ends inside a frame
    assert b"".join(map(frame, got)) == data  # what was read is exactly what was sent


register = st.builds(
    apb.RegisterJob, job_id=st.text(max_size=80), gpus=st.integers(0, 2**32 - 1),
    node_rank=st.integers(0, 2**32 - 1), nnodes=st.integers(0, 2**32 - 1),
    command=st.text(max_size=300),
    hints=st.builds(cpb.JobMeasurement, flops_per_iter=st.floats(), comm_s=st.floats(),
                    period_s=st.floats(), allreduce_bytes=st.floats(),
                    source=st.text(max_size=300)))


requests = st.one_of(
    register.map(lambda r: apb.LocalRequest(register=r)),
    st.text(max_size=80).map(lambda j: apb.LocalRequest(
        deregister=apb.DeregisterJob(job_id=j))),
    st.just(apb.LocalRequest()))


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    valid = draw(requests).SerializeToString()
    return variant(draw, valid, 256)


@budget(300)
@given(payloads())
def test_local_request_decoding(payload: bytes) -> None:
    seen: list[apb.LocalRequest] = []

    async def handler(req: apb.LocalRequest, cred: PeerCred) -> apb.LocalReply:
        seen.append(req)
        return apb.LocalReply()

    server = LocalServer(Path("/nonexistent/agent.sock"), os.getegid(), handler)
    me = PeerCred(os.getpid(), os.geteuid(), os.getegid())
    with bounded():
        reply = asyncio.run(server._answer(payload, me))
    if not seen:  # undecodable: refused with an error, never an exception
        assert reply.WhichOneof("body") == "error"
        return
    req = seen[0]
    if req.WhichOneof("body") == "register":  # what LocalRpc and Agent.register do with it
        r = req.register
        job = LocalJob(r.job_id, r.gpus, r.node_rank, r.nnodes or 1, command=r.command[:256])
        try:
            check_local_job(job)
            check_measurement(convert.measurement_from_pb(r.hints), "hints")
        except InvalidMessage:
            pass


# --- (b) Report from a remote agent ----------------------------------------------------------

def valid_report(host: str, jobs: list[str], addr: str) -> lpb.AgentReport:
    return lpb.AgentReport(
        schema=convert.SCHEMA,
        host=lpb.HostInventory(host_id=host, gpus=8, nics=[lpb.Nic(name="mlx5_0", address=addr,
                                                                   port=0, speed_gbps=200)]),
        jobs=[convert.local_job_to_pb(LocalJob(j, 4)) for j in jobs],
        paths=[lpb.PathTable(dst_host="h2", paths=[lpb.ProbedPath(hops=["s1"], sports=[49152])])],
        applied_generation=3, seq=4)




ids = st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True)


@st.composite
def report_bytes(draw: st.DrawFn) -> bytes:
    valid = valid_report(draw(ids), draw(st.lists(ids, max_size=4)),
                         draw(st.sampled_from(["10.0.0.1", "::1", "fe80::1", "x"])))
    raw = valid.SerializeToString()
    return variant(draw, raw, 512)


@budget(400)
@given(report_bytes())
def test_report_decoding(raw: bytes) -> None:
    msg = lpb.AgentReport()
    try:
        msg.ParseFromString(raw)
    except DecodeError:
        return
    try:
        with bounded():
            check_report(convert.report_from_pb(msg))
    except InvalidMessage:
        pass


# --- (c) QP and socket records written by jobs ----------------------------------------------

def qp_file(capacity: int, used: int, records: bytes) -> bytes:
    header = struct.pack("<QIIIIII8Q64sQ24x", qp_records.MAGIC, qp_records.VERSION,
                         qp_records.HEADER_SIZE, qp_records.RECORD_SIZE, capacity, 42, used,
                         *range(8), b"job", 7)
    return header + records


@st.composite
def qp_bytes(draw: st.DrawFn) -> bytes:
    raw = qp_file(draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 2**32 - 1)),
                  draw(st.binary(max_size=4 * qp_records.RECORD_SIZE)))
    return variant(draw, raw, 512)


@budget(300)
@given(qp_bytes())
@example(qp_file(2, 2**32 - 1, b"\1" * 2 * qp_records.RECORD_SIZE))
def test_qp_records(raw: bytes) -> None:
    try:
        with bounded():
            got = qp_records.parse(raw)
    except qp_records.RecordsError:
        return
    assert len(got.qps) <= (len(raw) - qp_records.HEADER_SIZE) // qp_records.RECORD_SIZE


@st.composite
def sock_bytes(draw: st.DrawFn) -> bytes:
    version = draw(st.sampled_from(sorted(sock_records.SIZES)))
    raw = struct.pack("=QIIIIQ64s16QQQQQ16H224x", sock_records.MAGIC, version,
                      sock_records.SIZES[version], 9, draw(st.integers(0, 2**32 - 1)), 3,
                      draw(st.binary(max_size=64)), *range(16), 5, 0, 7, 1,
                      *draw(st.lists(st.integers(0, 2**16 - 1), min_size=16, max_size=16)))
    return variant(draw, raw, 600)


@budget(300)
@given(sock_bytes())
def test_sock_records(raw: bytes) -> None:
    try:
        with bounded():
            got = sock_records.parse(raw)
    except sock_records.SockRecordError:
        return
    assert len(got.counters) <= sock_records.COUNTERS and len(got.job_id) <= 64
    assert len(got.listen_ports) <= sock_records.LISTEN_PORTS and 0 not in got.listen_ports


@budget(30)
@given(st.lists(st.one_of(qp_bytes(), sock_bytes()), max_size=6))
def test_record_directories(tmp_path_factory: pytest.TempPathFactory, files: list[bytes]) -> None:
    d = tmp_path_factory.mktemp("qps")
    for i, raw in enumerate(files):  # both readers list the same directory, as the agent does
        (d / f"{40 + i}").write_bytes(raw)  # files are named by the writer's pid
        (d / f"{sock_records.PREFIX}{40 + i}").write_bytes(raw)
    with bounded():
        qps, qp_problems = qp_records.read_dir(d)
        socks, sock_problems = sock_records.read_dir(d)
    assert len(qps) + len(qp_problems) <= len(files) >= len(socks) + len(sock_problems)


