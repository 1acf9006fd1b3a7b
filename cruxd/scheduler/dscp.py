"""Levels -> DSCP values, and which level a job outside the scheduler's plan gets.

Switches and NICs offer 8 priorities, typically trusted from DSCP as priority =
DSCP >> 3 (class selectors CS0..CS7). Some are not ours to use (seed §4.3): by
default priority 0 stays best effort (TCP, storage), 6 carries control traffic
(crux's own RPCs, CNPs) and 7 diagnosis/probing. Job levels take the highest
unreserved priorities, level 0 on the lowest of them: with 5 levels, levels 0..4
are CS1..CS5 (DSCP 8, 16, 24, 32, 40).

A job in its profiling window gets the top level alone (seed §5), so the scheduler
plans everybody else onto the levels below; a job it cannot plan yet (no
measurements) sits on the lowest level.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_RESERVED = (0, 6, 7)
DEFAULT_LEVELS = 5


def default_dscp(levels: int, reserved: Sequence[int] = DEFAULT_RESERVED) -> tuple[int, ...]:
    free = [p for p in range(8) if p not in set(reserved)]
    if not 1 <= levels <= len(free):
        raise ValueError(f"{levels} levels do not fit the {len(free)} unreserved priorities "
                         f"(reserved: {', '.join(map(str, reserved)) or 'none'}); "
                         f"give explicit DSCP values per level")
    return tuple(8 * p for p in free[len(free) - levels:])


def check_dscp(values: Sequence[int], levels: int) -> tuple[int, ...]:
    if len(values) != levels:
        raise ValueError(f"need one DSCP value per level: {levels} levels, {len(values)} values")
    for v in values:
        if not (isinstance(v, int) and 0 <= v <= 63):
            raise ValueError(f"DSCP values are integers 0..63, got {v!r}")
    if len(set(values)) != len(values):
        raise ValueError("DSCP values must be distinct: two levels would share a queue")
    return tuple(values)


def level_dscp(levels: int, dscp: Sequence[int] | None = None) -> tuple[int, ...]:
    """The DSCP of each level, lowest first: `dscp` checked when given, else the default
    map. ValueError says why the pair cannot work."""
    return default_dscp(levels) if dscp is None else check_dscp(dscp, levels)


def can_profile(levels: int) -> bool:
    """Whether jobs get a profiling window: it takes the top level alone, so at least one
    level must remain for everybody else."""
    return levels >= 2


def scheduled_dscp(dscp: tuple[int, ...], profiling: bool) -> tuple[int, ...]:
    """The levels (their DSCPs) left to the scheduler: all, or all but the top one while
    a job profiles on it."""
    return dscp[:-1] if profiling and can_profile(len(dscp)) else dscp


def profiling_slot(dscp: Sequence[int]) -> tuple[int, int]:
    """(level, DSCP) of a job in its profiling window: the top level."""
    return len(dscp) - 1, dscp[-1]


def unmeasured_slot(dscp: Sequence[int]) -> tuple[int, int]:
    """(level, DSCP) of a job the scheduler cannot plan yet: the lowest level."""
    return 0, dscp[0]
