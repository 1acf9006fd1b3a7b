"""The decision table: a shared-memory file, one writer (the agent), many readers (the C shim).

This module is the public API. Layout and encoding: transport/table_format.py; the writer:
transport/table_writer.py; the C side: shim/crux_table.h; the protocol: docs/decision-table.md.

The Python reader's seqlock check (seq, copy, seq again) relies on x86-64 never reordering loads
with other loads; a weakly ordered CPU would need an acquire fence before the second seq load,
which only C (crux_table_read_entry) can express.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path

from transport.table_format import (
    DEFAULT_PATH,
    ENTRY_SIZE,
    HEADER_SIZE,
    JOB_ID_LEN,
    MAGIC,
    READ_TRIES,
    RETIRED,
    VERSION,
    Decision,
    MappedTable,
    TableError,
    TableFullError,
    TableHeader,
    open_fd,
    pack_entry,
    pack_header,
    peer_address,
    unpack_entry,
    unpack_header,
)
from transport.table_writer import TableWriter

__all__ = [
    "DEFAULT_PATH", "ENTRY_SIZE", "HEADER_SIZE", "JOB_ID_LEN", "MAGIC", "RETIRED", "VERSION",
    "Decision", "TableError", "TableFullError", "TableHeader", "TableReader", "TableWriter",
    "pack_entry", "pack_header", "unpack_entry", "unpack_header",
]


class TableReader(MappedTable):
    """Read-only view for tools and tests; the shim does the same in C (crux_table_lookup).

    Readers fail open: an entry that stays torn for READ_TRIES attempts, or holds garbage, reads
    as absent."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        p = Path(path)
        fd = open_fd(p, os.O_RDONLY)
        size, raw = os.fstat(fd).st_size, os.pread(fd, HEADER_SIZE, 0)
        if len(raw) < HEADER_SIZE:
            os.close(fd)
            raise TableError(f"{p}: truncated, {size} bytes is less than the {HEADER_SIZE}-byte "
                             "header")
        header = unpack_header(raw)
        if (why := header.problem(p, size)) is not None:
            os.close(fd)
            raise TableError(why)
        super().__init__(p, fd, mmap.ACCESS_READ, header.capacity)

    def __enter__(self) -> TableReader:
        return self

    def _check(self) -> TableHeader | None:
        """The header as the file holds it now, read with pread (a truncated file cannot
        fault it), or None when the file no longer covers the mapping or the header no longer
        describes it: then no entry is touched. Checked on every read: the mapping faults
        (SIGBUS, which Python cannot catch) on pages past a shrunk file's end. A truncation
        between this check and the copy can still fault: tools and tests accept that race;
        the shim guards its copy (crux_busguard.h)."""
        self.mm  # noqa: B018  (raises if closed)
        raw = os.pread(self._fd, HEADER_SIZE, 0)
        if len(raw) < HEADER_SIZE or os.fstat(self._fd).st_size < len(self.mm):
            return None
        try:
            now = unpack_header(raw)
        except ValueError:
            return None
        if now.problem(self.path, len(self.mm)) is not None or now.capacity != self.capacity:
            return None
        return now

    def header(self) -> TableHeader:
        now = self._check()
        if now is None:
            raise TableError(f"{self.path}: decision table truncated or overwritten while open")
        return now

    @property
    def generation(self) -> int:
        return self.header().generation

    @property
    def retired(self) -> bool:
        """The writer replaced this file (or it was damaged in place): close and open the
        path again."""
        now = self._check()
        return now is None or bool(now.flags & RETIRED)

    def read_slot(self, slot: int) -> Decision | None:
        """Seqlock read of one slot; None if free, garbage, persistently torn, out of range
        or the table is damaged."""
        if not 0 <= slot < self.capacity or self._check() is None:
            return None
        return self._read_slot(slot)

    def _read_slot(self, slot: int) -> Decision | None:
        off, mm, seq = HEADER_SIZE + slot * ENTRY_SIZE, self.mm, self._u32
        for _ in range(READ_TRIES):
            s1 = seq[off // 4]
            if s1 & 1:
                continue  # writer is mid-change
            data = mm[off:off + ENTRY_SIZE]
            if seq[off // 4] == s1:  # loads stay in order on x86-64 (see module doc)
                try:
                    return unpack_entry(data)[1]
                except ValueError:
                    return None
        return None

    def _live(self) -> Iterator[Decision]:
        now = self._check()
        if now is None:
            return iter(())  # fail open: a damaged table holds no decisions
        used = min(now.used, self.capacity)
        return (d for d in map(self._read_slot, range(used)) if d is not None)

    def lookup(self, job_id: str, peer: str | None = None) -> Decision | None:
        key = (job_id, None if peer is None else str(peer_address(peer)))
        return next((d for d in self._live() if d.key == key), None)

    def decision_for(self, job_id: str, peer: str) -> Decision | None:
        """What a connection from `job_id` to `peer` should use: the per-peer entry, else the
        job-wide one (the shim's rule, crux_table_decision)."""
        return self.lookup(job_id, peer) or self.lookup(job_id)

    def snapshot(self) -> list[Decision]:
        return list(self._live())
