"""Atomic state files: temp file, fsync, rename, fsync of the directory, so a crash
leaves the old file or the new one and never half of one."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


def read_small(path: Path, limit: int, *, follow: bool = True) -> tuple[bytes, os.stat_result]:
    """(at most `limit` bytes, the file's stat) of a small regular file: never blocking on a
    FIFO or device, and through a symlink only when `follow`. OSError otherwise."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        # no `limit`-sized buffer for a small file (a 64 MiB bound cost 64 MiB a read)
        if st.st_size:
            return os.read(fd, min(limit, st.st_size + 1)), st
        chunks, total = [], 0  # empty, or procfs/sysfs, whose files do not know their size
        while total < limit and (chunk := os.read(fd, min(1 << 16, limit - total))):
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def read_bounded(path: Path, limit: int) -> bytes:
    """A small regular file's bytes, all of them: OSError when it is not one (EINVAL) or
    holds more than `limit` bytes (EFBIG)."""
    data, _ = read_small(path, limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"over the {limit:,}-byte limit", str(path))
    return data


def _json_parts(doc: dict[str, Any], big: int = 64) -> Iterator[str]:
    """`doc` as compact JSON, in pieces: the members of a large top-level object or list
    one by one. Not json.dump, which streams through json's pure-Python encoder (seconds
    per save at 10,000 agents); not one json.dumps either, which holds the GIL for the
    whole document (a leader's event loop stalled 250 ms per save at 1,000 agents)."""
    def dumps(v: Any) -> str:
        return json.dumps(v, separators=(",", ":"), allow_nan=False)
    yield "{"
    for i, (key, value) in enumerate(doc.items()):
        yield ("," if i else "") + dumps(key) + ":"
        if isinstance(value, dict) and len(value) > big:
            yield "{"
            for j, (k, v) in enumerate(value.items()):
                yield ("," if j else "") + dumps(k) + ":" + dumps(v)
            yield "}"
        elif isinstance(value, list) and len(value) > big:
            yield "["
            for j, v in enumerate(value):
                yield ("," if j else "") + dumps(v)
            yield "]"
        else:
            yield dumps(value)
    yield "}"


def write_atomic(path: Path, doc: dict[str, Any]) -> None:
    write_parts_atomic(path, _json_parts(doc))


def write_parts_atomic(path: Path, parts: Iterable[str]) -> None:
    """`path` holds the text `parts` make up, whole, or what it held before."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # a full disk must not leave an empty temp file behind at every attempt
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
