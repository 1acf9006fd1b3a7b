"""The NCCL profiler plugin's per-process record (layout: shim/crux_ncclrec.h).

libcrux_nccl_profiler.so writes `<qp dir>/nccl-<pid>`: per communicator of the process, a ring
of bursts, each a stretch of network activity with its exact busy time inside, its bytes and
collectives. The agent turns the bursts of a job's processes into its t_j and period
(cruxd/measure/collectives.py).

The file is hostile input, read like the other records (transport/pid_files.py): no links,
regular files, at most SIZE bytes, by pread. The writer rewrites it whole with one pwrite; a
read that raced a write fails the checksum and is read again (TornRead). Every count and
index is checked against the constants here; a burst that contradicts itself (ends before it
starts, busier than long) is dropped, never trusted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from transport.pid_files import TornRead, scan

MAGIC = 0x314C434E58555243  # b"CRUXNCL1" as a little-endian u64
VERSION = 1
PREFIX = "nccl-"
HEADER_SIZE = 256
COMM_HEADER = 128
BURST_SIZE = 48
COMMS = 8
BURSTS = 512
FUNCS = ("other", "allreduce", "allgather", "reducescatter", "broadcast", "reduce", "send",
         "recv")
COMM_SIZE = COMM_HEADER + BURSTS * BURST_SIZE
SIZE = HEADER_SIZE + COMMS * COMM_SIZE
CHAIN = ("none", "chained", "chain failed")
SLOT_FREE, SLOT_LIVE, SLOT_DONE = 0, 1, 2

_HEADER = np.dtype([("magic", "<u8"), ("version", "<u4"), ("header_size", "<u4"),
                    ("comm_size", "<u4"), ("burst_size", "<u4"), ("comms", "<u4"),
                    ("bursts", "<u4"), ("pid", "<u4"), ("api_version", "<u4"),
                    ("written_ns", "<u8"), ("checksum", "<u8"), ("writes", "<u8"),
                    ("job_id", "S64"), ("comms_dropped", "<u8"), ("events", "<u8"),
                    ("bad_events", "<u8"), ("chain", "<u4"), ("mask", "<u4"),
                    ("chained", "S64"), ("reserved", "V32")])
_BURST = np.dtype([("start_ns", "<u8"), ("end_ns", "<u8"), ("busy_ns", "<u8"),
                   ("bytes", "<u8"), ("sent_bytes", "<u8"), ("colls", "<u4"), ("ops", "<u4")])
_COMM = np.dtype([("comm_hash", "<u8"), ("nranks", "<u4"), ("rank", "<u4"), ("nnodes", "<u4"),
                  ("state", "<u4"), ("created_ns", "<u8"), ("total", "<u8"), ("colls", "<u8"),
                  ("func_colls", "<u8", (len(FUNCS),)), ("reserved", "V16"),
                  ("ring", _BURST, (BURSTS,))])
assert _HEADER.itemsize == HEADER_SIZE and _BURST.itemsize == BURST_SIZE
assert _COMM.itemsize == COMM_SIZE
_WEIGHTS = np.arange(SIZE // 8, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
_CHECKSUM_WORD = 48 // 8  # header.checksum's offset
assert _HEADER.fields is not None and _HEADER.fields["checksum"][1] == 48


class NcclRecordError(ValueError):
    """The bytes are not a record this reader understands."""


@dataclass(frozen=True)
class CommBursts:
    """One communicator's slot: who it is and its bursts, oldest first."""
    comm_hash: int
    nranks: int
    rank: int
    nnodes: int
    live: bool  # False once NCCL finalised it
    created_ns: int
    since_ns: int  # its bursts are complete from here (the ring may have dropped older ones)
    total: int  # bursts ever started; the ring keeps the last BURSTS
    colls: int
    func_colls: dict[str, int]
    bursts: npt.NDArray[np.void] = field(repr=False)  # _BURST records


@dataclass(frozen=True)
class NcclRecord:
    pid: int  # the writer's; read_dir gives it as the agent sees it (transport/pid_files.py)
    job_id: str
    api_version: int
    written_ns: int
    writes: int
    comms: tuple[CommBursts, ...]
    comms_dropped: int
    events: int
    bad_events: int
    chain: str  # CHAIN
    chained: str  # the chained plugin's name
    file: str = ""  # its name in the directory; "" where not read from one
    owner_uid: int = -1  # the file's owner, as read (-1 where not read from a file)


def checksum(buf: bytes) -> int:
    """crux_ncclrec_sum: word i weighted by 2i+1, modulo 2**64, with the checksum word 0."""
    w = np.frombuffer(buf, dtype="<u8", count=SIZE // 8).copy()
    w[_CHECKSUM_WORD] = 0
    with np.errstate(over="ignore"):
        return int((w * _WEIGHTS).sum(dtype=np.uint64))


def parse(buf: bytes) -> NcclRecord:
    """One file's bytes; NcclRecordError if they are not a record, TornRead if they mix two
    writes (read again)."""
    if len(buf) < HEADER_SIZE:
        raise NcclRecordError(f"{len(buf)} bytes is shorter than the {HEADER_SIZE}-byte header")
    h = np.frombuffer(buf, dtype=_HEADER, count=1)[0]
    if int(h["magic"]) != MAGIC:
        raise NcclRecordError(f"bad magic {int(h['magic']):#x}")
    layout = tuple(int(h[k]) for k in ("version", "header_size", "comm_size", "burst_size",
                                        "comms", "bursts"))
    if layout != (VERSION, HEADER_SIZE, COMM_SIZE, BURST_SIZE, COMMS, BURSTS):
        raise NcclRecordError(f"layout {layout} not understood")
    if len(buf) < SIZE:
        raise NcclRecordError(f"{len(buf)} bytes is shorter than the {SIZE}-byte record")
    if checksum(buf) != int(h["checksum"]):
        raise TornRead("checksum mismatch (a read that raced a write)")
    slots = np.frombuffer(buf, dtype=_COMM, count=COMMS, offset=HEADER_SIZE)
    comms = tuple(c for s in slots if (c := _comm(s)) is not None)
    chain = int(h["chain"])
    return NcclRecord(int(h["pid"]), _text(h["job_id"]), int(h["api_version"]),
                      int(h["written_ns"]), int(h["writes"]), comms, int(h["comms_dropped"]),
                      int(h["events"]), int(h["bad_events"]),
                      CHAIN[chain] if chain < len(CHAIN) else "unknown", _text(h["chained"]))


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _comm(s: np.void) -> CommBursts | None:
    state, total = int(s["state"]), int(s["total"])
    if state not in (SLOT_LIVE, SLOT_DONE):
        return None
    n = min(total, BURSTS)
    ring = s["ring"]
    order = (np.arange(total - n, total) % BURSTS) if n else np.arange(0)
    b = ring[order]
    ok = ((b["end_ns"] >= b["start_ns"]) & (b["busy_ns"] <= b["end_ns"] - b["start_ns"])
          & (b["start_ns"] > 0))
    b = b[ok]
    since = int(s["created_ns"]) if total <= BURSTS else int(b["start_ns"].min(initial=0))
    return CommBursts(int(s["comm_hash"]), int(s["nranks"]), int(s["rank"]), int(s["nnodes"]),
                      state == SLOT_LIVE, int(s["created_ns"]), since, total, int(s["colls"]),
                      dict(zip(FUNCS, (int(x) for x in s["func_colls"]), strict=True)),
                      b.copy())


def read_dir(path: str | os.PathLike[str], *, prune: bool = False
             ) -> tuple[list[NcclRecord], list[str]]:
    """(records of live processes, problems) from the `nccl-<pid>` files, each with its
    process's pid as the agent sees it; with prune, files of processes that are gone are
    removed (transport/pid_files.py scans)."""
    return scan(path, PREFIX, SIZE, parse, prune=prune)
