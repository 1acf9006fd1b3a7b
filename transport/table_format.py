"""Decision-table layout: constants, Decision, header/entry encoding, the shared mmap base.

shim/crux_table.h is the source of truth; the field tables below restate its offsets and are
checked against the struct formats when this module loads. Integers are in host byte order (the
file never leaves the host). Public API: transport/decision_table.py.
"""

from __future__ import annotations

import ipaddress
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0x314C425458555243  # b"CRUXTBL1" as a little-endian u64
VERSION = 1
DEFAULT_PATH = "/run/crux/decisions"
HEADER_SIZE = 64
ENTRY_SIZE = 128
JOB_ID_LEN = 64  # NUL-padded, so ids are at most 63 bytes
RETIRED = 0x1  # header flags: the writer replaced this file; reopen the path
JOB_WIDE = 0x1  # entry flags: peer is all zero
PROVISIONAL = 0x2  # entry flags: a fuller decision follows on its own (crux-run waits for it)
READ_TRIES = 1024  # seqlock retries before a reader gives up on an entry (fails open)
TCP_SPORTS = 8  # entry.tcp_sports slots (CRUX_TCP_SPORTS)

# (name, offset, struct code) exactly as in crux_table.h; "x" codes are reserved bytes.
_HEADER_FIELDS = [
    ("magic", 0, "Q"), ("version", 8, "I"), ("header_size", 12, "I"), ("entry_size", 16, "I"),
    ("capacity", 20, "I"), ("generation", 24, "Q"), ("plan_generation", 32, "Q"),
    ("updated_ns", 40, "Q"), ("writer_pid", 48, "I"), ("flags", 52, "I"), ("used", 56, "I"),
    ("reserved", 60, "4x"),
]
_ENTRY_FIELDS = [
    ("seq", 0, "I"), ("state", 4, "B"), ("level", 5, "B"), ("dscp", 6, "B"),
    ("traffic_class", 7, "B"), ("sport", 8, "H"), ("flags", 10, "H"), ("reserved0", 12, "4x"),
    ("peer", 16, "16s"), ("job_id", 32, "64s"), ("plan_generation", 96, "Q"),
    ("tcp_dport", 104, "H"), ("tcp_sports", 106, f"{TCP_SPORTS}H"), ("reserved", 122, "6x"),
]


def _layout(fields: list[tuple[str, int, str]], size: int) -> struct.Struct:
    """A native-order, unpadded Struct for `fields`, refusing any gap or overlap."""
    fmt, at = "=", 0
    for name, offset, code in fields:
        if offset != at:
            raise AssertionError(f"{name} at {offset}, layout expects {at}")
        fmt += code
        at = struct.calcsize(fmt)
    if at != size:
        raise AssertionError(f"layout is {at} bytes, expected {size}")
    return struct.Struct(fmt)


_HEADER = _layout(_HEADER_FIELDS, HEADER_SIZE)
_ENTRY = _layout(_ENTRY_FIELDS, ENTRY_SIZE)
# Header field offsets, and the indexes of the fields the writer changes in place within
# native-width (u32 / u64) views of the mapping.
HEADER_OFFSETS = {name: off for name, off, _ in _HEADER_FIELDS}
U64_GENERATION, U64_PLAN, U64_UPDATED = (
    HEADER_OFFSETS[f] // 8 for f in ("generation", "plan_generation", "updated_ns"))
U32_PID, U32_USED = (HEADER_OFFSETS[f] // 4 for f in ("writer_pid", "used"))


class TableError(Exception):
    """The table file is missing, unreadable, foreign, or held by another writer."""


class TableFullError(TableError):
    """Every slot is taken; the table is left as it was."""


def check_uint(name: str, value: object, top: int) -> None:
    """Reject bools, non-ints and values outside 0..top (a u8/u16/u32/u64 field)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value <= top:
        raise ValueError(f"{name} must be in 0..{top}, got {value}")


@dataclass(frozen=True, slots=True)
class Decision:
    """What the shim should do for one job (peer=None: the job's defaults) or one peer of it.

    peer is normalised: IPv4 and IPv4-mapped IPv6 both become dotted IPv4 text."""

    job_id: str
    peer: str | None
    level: int
    dscp: int
    traffic_class: int
    sport: int
    plan_generation: int
    # TCP (the socket interposer): the destination port tcp_sports were probed for (0: none),
    # and the probed source ports toward this peer, used in turn by a job's sockets to it.
    tcp_dport: int = 0
    tcp_sports: tuple[int, ...] = ()
    # The leader has not heard from every host of the job yet, or has no probed path between
    # them: the shims apply it as any other, and crux-run waits for the fuller one.
    provisional: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.job_id, str):
            raise TypeError(f"job_id must be a str, got {type(self.job_id).__name__}")
        if not self.job_id:
            raise ValueError("job_id must not be empty")
        if "\0" in self.job_id or len(self.job_id.encode()) >= JOB_ID_LEN:
            raise ValueError(f"job_id must be at most {JOB_ID_LEN - 1} UTF-8 bytes without NUL, "
                             f"got {self.job_id!r}")
        for name, top in (("level", 255), ("dscp", 63), ("traffic_class", 255),
                          ("sport", 65535), ("plan_generation", 2**64 - 1),
                          ("tcp_dport", 65535)):
            check_uint(name, getattr(self, name), top)
        object.__setattr__(self, "tcp_sports", _tcp_sports(self.tcp_sports, self.tcp_dport))
        if self.peer is not None:
            object.__setattr__(self, "peer", str(peer_address(self.peer)))

    @property
    def key(self) -> tuple[str, str | None]:
        return self.job_id, self.peer


def _tcp_sports(ports: object, dport: int) -> tuple[int, ...]:
    """The port set as a tuple (a list is accepted): at most TCP_SPORTS distinct ports in
    1..65535, and only with a tcp_dport (the ports are probed for that destination port)."""
    if not isinstance(ports, tuple | list):
        raise TypeError(f"tcp_sports must be a tuple of ints, got {type(ports).__name__}")
    if len(ports) > TCP_SPORTS:
        raise ValueError(f"tcp_sports holds at most {TCP_SPORTS} ports, got {len(ports)}")
    for p in ports:
        check_uint("tcp_sports port", p, 65535)
        if p == 0:
            raise ValueError("tcp_sports ports must be in 1..65535, got 0")
    if len(set(ports)) != len(ports):
        raise ValueError(f"tcp_sports must not repeat a port, got {list(ports)}")
    if ports and dport == 0:
        raise ValueError("tcp_sports needs the tcp_dport they were probed for, got 0")
    return tuple(ports)


def peer_address(text: object) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address to store for `text`: IPv4 for IPv4 and IPv4-mapped text, else IPv6."""
    if not isinstance(text, str):  # ip_address would also take ints and packed bytes
        raise TypeError(f"peer must be address text or None, got {type(text).__name__}")
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        raise ValueError(f"peer must be an IPv4 or IPv6 address, got {text!r}") from None
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.scope_id:
            raise ValueError(f"peer {text!r}: scoped addresses cannot be stored")
        addr = addr.ipv4_mapped or addr
    if addr.is_unspecified:
        raise ValueError(f"peer {text!r} is unspecified; use peer=None for job-wide entries")
    return addr


def gid_text(gid: str | bytes | ipaddress.IPv6Address) -> str:
    """A 16-byte GID (packed, IPv6 text or address) as address text: IPv4 for an IPv4-mapped
    GID (RoCEv2 over IPv4), else IPv6."""
    addr = gid if isinstance(gid, ipaddress.IPv6Address) else ipaddress.IPv6Address(gid)
    return str(addr.ipv4_mapped or addr)


def peer_bytes(peer: str | None) -> bytes:
    """The 16 bytes stored for a peer (IPv4 as ::ffff:a.b.c.d); all zero for None."""
    if peer is None:
        return bytes(16)
    addr = peer_address(peer)
    if isinstance(addr, ipaddress.IPv4Address):
        return bytes(10) + b"\xff\xff" + addr.packed
    return addr.packed


@dataclass(frozen=True, slots=True)
class TableHeader:
    """The 64-byte header, field for field (reserved bytes are always zero)."""

    capacity: int
    generation: int = 0
    plan_generation: int = 0
    updated_ns: int = 0
    writer_pid: int = 0
    flags: int = 0
    used: int = 0
    magic: int = MAGIC
    version: int = VERSION
    header_size: int = HEADER_SIZE
    entry_size: int = ENTRY_SIZE

    def problem(self, path: object, size: int) -> str | None:
        """Why a file of `size` bytes with this header is not a table we can use, or None."""
        if self.magic != MAGIC:
            return f"{path}: bad magic {self.magic:#018x}, not a crux decision table"
        if self.version != VERSION:
            return f"{path}: table version {self.version}, this code understands {VERSION}"
        if (self.header_size, self.entry_size) != (HEADER_SIZE, ENTRY_SIZE):
            return (f"{path}: header/entry size {self.header_size}/{self.entry_size}, "
                    f"expected {HEADER_SIZE}/{ENTRY_SIZE}")
        need = HEADER_SIZE + self.capacity * ENTRY_SIZE
        if size < need:
            return f"{path}: truncated, {size} bytes but capacity {self.capacity} needs {need}"
        return None


def pack_header(h: TableHeader) -> bytes:
    return _HEADER.pack(h.magic, h.version, h.header_size, h.entry_size, h.capacity,
                        h.generation, h.plan_generation, h.updated_ns, h.writer_pid, h.flags,
                        h.used)


def unpack_header(data: bytes | mmap.mmap) -> TableHeader:
    (magic, version, header_size, entry_size, capacity, generation, plan_generation, updated_ns,
     writer_pid, flags, used) = _HEADER.unpack_from(data)
    return TableHeader(capacity, generation, plan_generation, updated_ns, writer_pid, flags, used,
                       magic, version, header_size, entry_size)


def pack_entry(d: Decision | None, seq: int = 0) -> bytes:
    """The 128 bytes of an entry holding `d` (None: a free, all-zero entry) with this seq."""
    if d is None:
        return struct.pack("=I", seq) + bytes(ENTRY_SIZE - 4)
    sports = d.tcp_sports + (0,) * (TCP_SPORTS - len(d.tcp_sports))
    return _ENTRY.pack(seq, 1, d.level, d.dscp, d.traffic_class, d.sport,
                       (JOB_WIDE if d.peer is None else 0) | (PROVISIONAL if d.provisional else 0),
                       peer_bytes(d.peer),
                       d.job_id.encode(), d.plan_generation, d.tcp_dport, *sports)


def unpack_entry(data: bytes) -> tuple[int, Decision | None]:
    """(seq, decision), decision None for a free entry; ValueError if the entry is garbage."""
    seq, state, level, dscp, tc, sport, flags, peer, job, plan, dport, *sports = (
        _ENTRY.unpack_from(data))
    if state == 0:
        return seq, None
    if state != 1:
        raise ValueError(f"entry state {state}")
    addr = None if peer == bytes(16) else str(ipaddress.IPv6Address(peer))
    try:
        job_id = job.split(b"\0", 1)[0].decode()
    except UnicodeDecodeError:
        raise ValueError("job_id is not UTF-8") from None
    ports = tuple(p for p in sports if p)  # 0 marks an unused slot, wherever it is
    return seq, Decision(job_id, addr, level, dscp, tc, sport, plan, dport, ports,
                         bool(flags & PROVISIONAL))


def open_fd(path: Path, flags: int) -> int:
    """os.open with O_CLOEXEC; failures become TableError naming the path."""
    try:
        return os.open(path, flags | os.O_CLOEXEC)
    except OSError as e:
        raise TableError(f"{path}: cannot open decision table: {e.strerror}") from None


class MappedTable:
    """An open, mapped table file with native-width views of the header fields that change
    (single aligned loads and stores, never torn). Base of the reader and the writer."""

    def __init__(self, path: Path, fd: int, access: int, capacity: int) -> None:
        """Map the header and `capacity` entries of the (already validated) table open on fd;
        takes ownership of fd."""
        self.path, self._fd, self.capacity = path, fd, capacity
        try:
            self._mm: mmap.mmap | None = mmap.mmap(
                fd, HEADER_SIZE + capacity * ENTRY_SIZE, access=access)
        except OSError as e:
            os.close(fd)
            raise TableError(f"{path}: cannot map decision table: {e.strerror}") from None
        view = memoryview(self._mm)
        self._u32, self._u64 = view.cast("I"), view.cast("Q")
        view.release()

    def __enter__(self) -> MappedTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._mm is None:
            return
        self._u32.release()  # the mmap refuses to close while views are exported
        self._u64.release()
        self._mm.close()
        self._mm = None
        os.close(self._fd)

    @property
    def mm(self) -> mmap.mmap:
        if self._mm is None:
            raise TableError(f"{self.path}: table is closed")
        return self._mm

    @property
    def generation(self) -> int:
        self.mm  # noqa: B018  (raises if closed)
        return int(self._u64[U64_GENERATION])

    def header(self) -> TableHeader:
        return unpack_header(self.mm)
