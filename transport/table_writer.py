"""The decision table's single writer: create or adopt the file, seqlock-write entries.

Memory ordering: an entry is published as seq := odd, body, seq := even. Each step is a
separate store made by a separate interpreter call, so no compiler can merge or reorder them,
and x86-64's total store order makes other cores see them in program order. seq is stored
through a memoryview cast to "I": one aligned 4-byte store, never torn. A weakly ordered CPU
(arm64, POWER) would also need a release fence after the odd store and before the even one,
e.g. by calling crux_table_write_entry from a C extension; Python has no fence of its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import mmap
import os
import struct
import time
from collections.abc import Iterable
from pathlib import Path

from transport.table_format import (
    DEFAULT_PATH,
    ENTRY_SIZE,
    HEADER_OFFSETS,
    HEADER_SIZE,
    MAGIC,
    RETIRED,
    U32_PID,
    U32_USED,
    U64_GENERATION,
    U64_PLAN,
    U64_UPDATED,
    Decision,
    MappedTable,
    TableError,
    TableFullError,
    TableHeader,
    check_uint,
    open_fd,
    pack_entry,
    pack_header,
    unpack_entry,
    unpack_header,
)


def _lock(fd: int, path: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise TableError(f"{path}: another writer holds the decision table") from None


def _fits(fd: int, path: Path, capacity: int) -> bool:
    """Whether the open file is a valid table of this version, layout and capacity."""
    size = os.fstat(fd).st_size
    if size < HEADER_SIZE:
        return False
    h = unpack_header(os.pread(fd, HEADER_SIZE, 0))
    return h.problem(path, size) is None and h.capacity == capacity


def _retire(fd: int) -> None:
    """Set RETIRED on a replaced table so readers holding it reopen the path. Only files with
    our magic: nobody can be reading anything else as a table."""
    raw = os.pread(fd, HEADER_SIZE, 0)
    if len(raw) == HEADER_SIZE and unpack_header(raw).magic == MAGIC:
        flags = unpack_header(raw).flags | RETIRED
        os.pwrite(fd, struct.pack("=I", flags), HEADER_OFFSETS["flags"])


def _create(path: Path, capacity: int, mode: int) -> int:
    """A fresh, locked, empty table moved into place at `path`; returns its fd."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a crashed writer's leftover; there is only one writer
    fd = open_fd(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    try:
        os.fchmod(fd, mode)  # exact mode, whatever the umask
        _lock(fd, tmp)
        os.ftruncate(fd, HEADER_SIZE + capacity * ENTRY_SIZE)  # zeros: every slot free
        _reserve(fd, path, capacity)
        header = TableHeader(capacity, updated_ns=time.time_ns(), writer_pid=os.getpid())
        os.pwrite(fd, pack_header(header), 0)
        os.replace(tmp, path)
    except (OSError, TableError) as e:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        if isinstance(e, TableError):
            raise
        raise TableError(f"{path}: cannot create decision table: {e}") from None
    return fd


def _reserve(fd: int, path: Path, capacity: int) -> None:
    """Allocate every block of the table now: a sparse file on a filesystem that fills up
    kills its writer (and every reader) with SIGBUS at the first store into a hole."""
    size = HEADER_SIZE + capacity * ENTRY_SIZE
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        raise TableError(f"{path}: cannot allocate the {size}-byte decision table (capacity "
                         f"{capacity}): {e.strerror}") from None


class TableWriter(MappedTable):
    """The single writer. Holds an exclusive flock on the file while open."""

    def __init__(self, path: Path, fd: int, capacity: int) -> None:
        """Use TableWriter.open(); this maps an already locked, valid table."""
        super().__init__(path, fd, mmap.ACCESS_WRITE, capacity)
        self._slots: dict[tuple[str, str | None], int] = {}
        repaired = 0
        for slot in range(self.capacity):
            seq, d = self._seq(slot), None
            with contextlib.suppress(ValueError):
                d = None if seq & 1 else unpack_entry(self._raw(slot))[1]
            if d is None or d.key in self._slots:  # free, half-written, garbage or duplicate
                repaired += self._put(slot, None)
            else:
                self._slots[d.key] = slot
        taken = set(self._slots.values())
        self._free = [s for s in range(self.capacity) if s not in taken]  # sorted: a heap
        self._publish(repaired > 0, shrink=True)

    @classmethod
    def open(cls, path: str | os.PathLike[str] = DEFAULT_PATH, capacity: int = 4096,
             mode: int = 0o644) -> TableWriter:
        """Adopt the table at `path` if it has this version, layout and capacity (a restarted
        agent keeps its decisions); otherwise put a fresh one in its place atomically and mark
        the old one retired."""
        check_uint("capacity", capacity, 2**32 - 1)
        if capacity == 0:
            raise ValueError("capacity must be at least 1")
        p = Path(path)
        try:
            old: int | None = os.open(p, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            old = None
        except OSError as e:
            raise TableError(f"{p}: cannot open decision table: {e.strerror}") from None
        if old is not None:
            _lock(old, p)
            if _fits(old, p, capacity):
                try:
                    os.fchmod(old, mode)
                    _reserve(old, p, capacity)  # one an older writer left sparse
                except OSError as e:
                    os.close(old)
                    raise TableError(f"{p}: cannot set mode {mode:o}: {e.strerror}") from None
                except TableError:
                    os.close(old)
                    raise
                return cls(p, old, capacity)
        try:
            fd = _create(p, capacity, mode)
            if old is not None:
                _retire(old)  # after the replace, so readers that react find the new file
        finally:
            if old is not None:
                os.close(old)
        return cls(p, fd, capacity)

    def __enter__(self) -> TableWriter:
        return self

    def _seq(self, slot: int) -> int:
        return int(self._u32[(HEADER_SIZE + slot * ENTRY_SIZE) // 4])

    def _raw(self, slot: int) -> bytes:
        off = HEADER_SIZE + slot * ENTRY_SIZE
        return self.mm[off:off + ENTRY_SIZE]

    def _put(self, slot: int, d: Decision | None) -> int:
        """Seqlock write of one slot; 1 if its content changed, else 0 (and nothing written)."""
        off = HEADER_SIZE + slot * ENTRY_SIZE
        body, i, seq = pack_entry(d)[4:], off // 4, self._seq(slot)
        if not seq & 1 and self.mm[off + 4:off + ENTRY_SIZE] == body:
            return 0
        if not seq & 1:
            seq += 1
            self._u32[i] = seq & 0xFFFFFFFF  # odd: readers retry from here on
        self.mm[off + 4:off + ENTRY_SIZE] = body
        self._u32[i] = (seq + 1) & 0xFFFFFFFF  # even: the new body is published
        return 1

    def _insert(self, d: Decision) -> None:
        if not self._free:
            raise TableFullError(f"{self.path}: all {self.capacity} slots are taken")
        slot = heapq.heappop(self._free)
        self._put(slot, d)
        self._slots[d.key] = slot
        self._u32[U32_USED] = max(int(self._u32[U32_USED]), slot + 1)  # after the entry is in place

    def _drop(self, key: tuple[str, str | None]) -> None:
        slot = self._slots.pop(key)
        self._put(slot, None)
        heapq.heappush(self._free, slot)

    def _publish(self, changed: bool, plan_generation: int | None = None,
                 shrink: bool = False) -> None:
        """Header after a batch; generation last so readers that see it see the batch.
        shrink: entries were freed, so `used` may come down to the last live slot."""
        if shrink:
            self._u32[U32_USED] = max(self._slots.values(), default=-1) + 1
        self._u32[U32_PID] = os.getpid()
        if plan_generation is not None and plan_generation != self._u64[U64_PLAN]:
            self._u64[U64_PLAN] = plan_generation
            changed = True
        if changed:
            self._u64[U64_UPDATED] = time.time_ns()
            self._u64[U64_GENERATION] = self._u64[U64_GENERATION] + 1

    def apply(self, decisions: Iterable[Decision], plan_generation: int) -> int:
        """Make the table hold exactly `decisions`; returns how many entries changed."""
        check_uint("plan_generation", plan_generation, 2**64 - 1)
        want: dict[tuple[str, str | None], Decision] = {}
        for d in decisions:
            if not isinstance(d, Decision):
                raise TypeError(f"expected Decision, got {type(d).__name__}")
            if d.key in want:
                raise ValueError(f"two decisions for job {d.job_id!r} peer {d.peer}")
            want[d.key] = d
        if len(want) > self.capacity:
            raise TableFullError(f"{self.path}: {len(want)} decisions do not fit in "
                                 f"{self.capacity} slots")
        # Updates first, then frees, then inserts, which reuse the freed slots.
        changed = sum(self._put(s, want[k]) for k, s in self._slots.items() if k in want)
        gone = [k for k in self._slots if k not in want]
        for key in gone:
            self._drop(key)
        new = [d for k, d in want.items() if k not in self._slots]
        for d in new:
            self._insert(d)
        changed += len(gone) + len(new)
        self._publish(changed > 0, plan_generation, shrink=bool(gone))
        return changed

    def advance(self, plan_generation: int) -> None:
        """The table now reflects `plan_generation`, its entries unchanged (a plan that
        changed nothing on this host); they keep the generation that decided them."""
        check_uint("plan_generation", plan_generation, 2**64 - 1)
        self._publish(False, plan_generation)

    def upsert(self, decision: Decision) -> bool:
        """Add or replace the entry for decision's (job, peer); True if the table changed."""
        if not isinstance(decision, Decision):
            raise TypeError(f"expected Decision, got {type(decision).__name__}")
        slot = self._slots.get(decision.key)
        if slot is None:
            self._insert(decision)
            changed = 1
        else:
            changed = self._put(slot, decision)
        self._publish(changed > 0)
        return changed > 0

    def remove_job(self, job_id: str) -> int:
        """Free every entry of job_id (job-wide and per-peer); returns how many."""
        keys = [k for k in self._slots if k[0] == job_id]
        for key in keys:
            self._drop(key)
        self._publish(bool(keys), shrink=True)
        return len(keys)

    def entries(self) -> list[Decision]:
        """Live entries in slot order (the writer is the only one changing them: no seqlock)."""
        by_slot = sorted((s, k) for k, s in self._slots.items())
        return [d for s, _ in by_slot if (d := unpack_entry(self._raw(s))[1]) is not None]
