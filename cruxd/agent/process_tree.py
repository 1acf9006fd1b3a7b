"""Which processes belong to a job: its registered pids and their descendants, from /proc."""

from __future__ import annotations

from collections.abc import Set as AbstractSet


def parent_pid(pid: int, proc: str = "/proc") -> int | None:
    try:
        with open(f"{proc}/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def belongs(pid: int, owners: AbstractSet[int], proc: str = "/proc", depth: int = 32) -> bool:
    """Whether `pid` is one of `owners` or descends from one (torchrun's workers do)."""
    for _ in range(depth):
        if pid in owners:
            return True
        parent = parent_pid(pid, proc)
        if parent is None or parent <= 1:
            return False
        pid = parent
    return False
